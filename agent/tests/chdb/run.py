"""Runs SQL on the embedded ClickHouse engine of chdb-core for agent/tests/clickhouse_chdb.rs.

Reads one JSON request on stdin: {"settings": [[name, value]], "setup": [sql],
"queries": [{"sql": text, "params": {name: text}}]}; the setup statements run first
(any error ends the script), then each query, in one session. Writes a JSON list on
stdout, one entry per query: {"rows": [[value, ...]]} or {"error": message}.
Query parameters travel as ClickHouse reads them over HTTP, in its escaped form.
"""

import json
import sys

import chdb
from chdb import session


def escaped(v):
    return v.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")


def main():
    req = json.load(sys.stdin)
    s = session.Session()
    for name, value in req["settings"]:
        quoted = value.replace("\\", "\\\\").replace("'", "\\'")
        s.query(f"SET {name} = '{quoted}'")
    for stmt in req["setup"]:
        try:
            s.query(stmt)
        except Exception as e:
            sys.exit(f"setup failed: {e}\n{stmt}")
    out = []
    for q in req["queries"]:
        params = {k: escaped(v) for k, v in q.get("params", {}).items()} or None
        try:
            r = s.query(q["sql"], "JSONCompact", params=params).bytes()
            out.append({"rows": json.loads(r)["data"] if r.strip() else []})
        except Exception as e:
            out.append({"error": str(e).strip()[:2000]})
    version = s.query("SELECT version()", "CSV").bytes().decode().strip().strip('"')
    json.dump({"version": version, "chdb": chdb.__version__, "results": out}, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
