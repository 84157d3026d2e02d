"""Assertions on rendered chart manifests: what a zone owner relies on.

usage: check_rendered.py CHART RENDERED.yaml OUTDIR  (writes each ConfigMap file to OUTDIR)
"""
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
    for name, a in coord["agents"].items():
        if not a["endpoint"].startswith("https://"):
            fail(f"agent {name}: endpoint must be https")
print(f"{rendered.name}: ok ({', '.join(sorted(by_kind))})")
