"""Assertions on rendered chart manifests: what a zone owner relies on.

usage: check_rendered.py CHART RENDERED.yaml OUTDIR  (writes each ConfigMap file to OUTDIR)
"""
import os
import pathlib
import re
import sys

import yaml

chart, rendered, outdir = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
docs = [d for d in yaml.safe_load_all(rendered.read_text()) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)

def fail(msg):
    sys.exit(f"{rendered.name}: {msg}")

DB_URL = re.compile(r"\b(postgres|postgresql|mysql|mariadb|sqlite|duckdb|mssql|oracle)://", re.I)
outdir.mkdir(parents=True, exist_ok=True)
for cm in by_kind.get("ConfigMap", []):
    for key, text in cm.get("data", {}).items():
        if DB_URL.search(text):
            fail(f"ConfigMap {cm['metadata']['name']} key {key} holds a database URL")
        (outdir / key).write_text(text)

def pod_specs():
    for d in by_kind.get("Deployment", []) + by_kind.get("StatefulSet", []):
        yield d["spec"]["template"]["spec"]
    for d in by_kind.get("CronJob", []):
        yield d["spec"]["jobTemplate"]["spec"]["template"]["spec"]

specs = list(pod_specs())
if not specs:
    fail("no workload rendered")
for spec in specs:
    psc = spec.get("securityContext", {})
    if not psc.get("runAsNonRoot"):
        fail("pods must run as non-root")
    if spec.get("automountServiceAccountToken") is not False:
        fail("the service account token must not be mounted")
    secret_volumes = [v for v in spec["volumes"] if "secret" in v]
    if not secret_volumes:
        fail("no TLS secret mounted")
    for c in spec["containers"]:
        sc = c.get("securityContext", {})
        if not sc.get("readOnlyRootFilesystem") or sc.get("allowPrivilegeEscalation") is not False:
            fail(f"container {c['name']}: read-only root filesystem, no privilege escalation")
        for e in c.get("env", []):
            if "value" in e and DB_URL.search(str(e["value"])):
                fail(f"container {c['name']}: a database URL in clear in env {e['name']}")

if chart == "tally-agent":
    agent = yaml.safe_load((outdir / "agent.yaml").read_text())
    tls = agent["tls"]
    if not (tls.get("ca") and tls.get("cert") and tls.get("key")):
        fail("agent.yaml: TLS is not configured")
    if not tls.get("zone_key"):
        fail("agent.yaml: no zone key: checksums would not be sealed")
    for name, ds in agent["datasets"].items():
        if "url" in ds or "url_env" not in ds:
            fail(f"agent.yaml: dataset {name} must take its URL from the environment")
    nps = by_kind.get("NetworkPolicy", [])
    if not nps:
        fail("no NetworkPolicy")
    ingress = nps[0]["spec"]["ingress"]
    if len(ingress) != 1 or not ingress[0].get("from") or not ingress[0].get("ports"):
        fail("the NetworkPolicy must admit only the coordinator on the gRPC port")
    if not by_kind.get("PodDisruptionBudget"):
        fail("no PodDisruptionBudget")
    c = specs[0]["containers"][0]
    if not (c.get("readinessProbe") and c.get("livenessProbe")):
        fail("agent probes missing")
def check_replicas(coord, sts):
    """tally serve's replicas: a Raft group of 3 or 5 (or one node), spread over nodes."""
    spec, pod = sts["spec"], sts["spec"]["template"]["spec"]
    n = spec["replicas"]
    if n not in (1, 3, 5):
        fail(f"StatefulSet replicas {n}: only 1, 3 or 5")
    want = os.environ.get("EXPECT_REPLICAS")
    if want and n != int(want):
        fail(f"StatefulSet replicas {n}, expected {want}")
    if spec.get("podManagementPolicy") != "Parallel":
        fail("replicas must start in parallel: a Raft group needs a quorum before any is ready")
    selector = spec["selector"]["matchLabels"]
    pdbs = by_kind.get("PodDisruptionBudget", [])
    if len(pdbs) != 1 or pdbs[0]["spec"].get("maxUnavailable") != 1 \
            or pdbs[0]["spec"]["selector"]["matchLabels"] != selector:
        fail("tally serve needs one PodDisruptionBudget, maxUnavailable 1, on its pods")
    peers = [s for s in by_kind.get("Service", []) if s["metadata"]["name"] == spec["serviceName"]]
    if not peers:
        fail(f"no Service {spec['serviceName']} (the StatefulSet's serviceName)")
    ps = peers[0]["spec"]
    if ps.get("clusterIP") != "None" or ps.get("publishNotReadyAddresses") is not True \
            or ps["selector"] != selector or [p["port"] for p in ps["ports"]] != [7443]:
        fail("the peers Service must be headless, publish not-ready addresses, select the pods, port 7443")
    if not spec["serviceName"].endswith("-peers"):
        fail("the peers Service is <fullname>-peers")
    anti = pod.get("affinity", {}).get("podAntiAffinity", {})
    required = anti.get("requiredDuringSchedulingIgnoredDuringExecution")
    preferred = anti.get("preferredDuringSchedulingIgnoredDuringExecution")
    terms = required or [p["podAffinityTerm"] for p in preferred or []]
    if not terms or any(t["topologyKey"] != "kubernetes.io/hostname"
                        or t["labelSelector"]["matchLabels"] != selector for t in terms):
        fail("replicas need a pod anti-affinity across nodes (kubernetes.io/hostname) on their own labels")
    want = os.environ.get("EXPECT_ANTI_AFFINITY")
    if want and (want == "required") != bool(required):
        fail(f"pod anti-affinity is not {want}")
    c = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])]
    if claims != ["data"] or mounts.get("data") != coord["data_dir"]:
        fail("each replica needs its own volume (volumeClaimTemplate data) at data_dir")
    cluster = coord.get("cluster")
    if n == 1:
        if cluster is not None:
            fail("a single replica has no cluster section")
        return
    if cluster is None:
        fail(f"{n} replicas need a cluster section")
    if set(cluster) != {"listen", "advertise", "tls", "initial_members"}:
        fail(f"cluster keys {sorted(cluster)}: listen, advertise, tls, initial_members (node_id from the ordinal)")
    ns = os.environ.get("NAMESPACE", "tally")
    domain = f"{spec['serviceName']}.{ns}.svc.cluster.local"
    if cluster["listen"] != "0.0.0.0:7443" or cluster["advertise"] != f"{{hostname}}.{domain}:7443":
        fail(f"cluster.listen / advertise: {cluster['listen']}, {cluster['advertise']}")
    members = [f"{sts['metadata']['name']}-{i}.{domain}:7443" for i in range(n)]
    if cluster["initial_members"] != members:
        fail(f"cluster.initial_members {cluster['initial_members']}, expected one per replica: {members}")
    if cluster["tls"] != {"cert": "/etc/tally/peer/tls.crt", "key": "/etc/tally/peer/tls.key",
                          "ca": "/etc/tally/peer/ca.crt"} or mounts.get("peer-tls") != "/etc/tally/peer":
        fail("cluster.tls must name the mounted peer Secret")
    if 7443 not in [p["containerPort"] for p in c["ports"]]:
        fail("the container does not expose the peer port")

if chart == "tally-coordinator":
    coord = yaml.safe_load((outdir / "coordinator.yaml").read_text())
    for sts in by_kind.get("StatefulSet", []):
        c = sts["spec"]["template"]["spec"]["containers"][0]
        if not (c.get("readinessProbe") and c.get("livenessProbe")):
            fail("tally serve probes missing")
        if not coord.get("data_dir") or not by_kind.get("Service"):
            fail("tally serve needs its data_dir and Service")
        api = coord.get("api") or {}
        if not (api.get("tls") or {}).get("cert") or not (api.get("tokens") or api.get("clients")):
            fail("tally serve needs api.tls and at least one caller (api.tokens or api.clients)")
        if api.get("clients") and not api["tls"].get("ca"):
            fail("api.clients needs api.tls.ca")
        for probe in ("readinessProbe", "livenessProbe"):
            if c[probe]["httpGet"].get("scheme") != "HTTPS":
                fail(f"{probe} must use HTTPS: the API speaks HTTPS only")
        if any(e.get("name") == "TALLY_API_TOKEN" for e in c.get("env", [])):
            fail("TALLY_API_TOKEN is gone: tokens are configured as SHA-256 hashes in api.tokens")
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        if "/etc/tally/api" not in mounts:
            fail("the API's TLS Secret is not mounted")
    for sts in by_kind.get("StatefulSet", []):
        check_replicas(coord, sts)
    for name, a in coord["agents"].items():
        if not a["endpoint"].startswith("https://"):
            fail(f"agent {name}: endpoint must be https")
print(f"{rendered.name}: ok ({', '.join(sorted(by_kind))})")
