"""Parse-checks the golden SQL of the engines no test here can run live.

Every statement of agent/tests/golden/<engine>.sql must parse under sqlglot's
dialect for that engine (a pinned version, installed by .ci/run), and must not
use a construct the engine is known to reject even where sqlglot's parser is
lenient (row-value comparisons, LIMIT, `AS` before a table alias on Oracle, ...).

Usage: python sqlcheck.py agent/tests/golden
"""

import re
import sys
from pathlib import Path

import sqlglot
from sqlglot.errors import ErrorLevel

# golden file -> (sqlglot dialect, constructs the engine rejects: regex, why)
ENGINES = {
    "mssql": (
        "tsql",
        [
            (r"\)\s*(>=|<=|<|>|=)\s*\(", "a row-value comparison (SQL Server has none)"),
            (r"\bLIMIT\b", "LIMIT (SQL Server uses TOP / OFFSET ... FETCH)"),
            (r"\bsubstr\(", "substr (SQL Server spells it SUBSTRING)"),
            (r"\bCOUNT\(\*\)", "COUNT(*) is a 32-bit INT on SQL Server: COUNT_BIG(*)"),
            (r"\|\|", "|| (SQL Server concatenates with CONCAT)"),
            (r"\bFORMAT\(", "FORMAT (its output follows the session's culture)"),
            (r"\bBIT_XOR\b|\bbit_xor\b", "a XOR aggregate (SQL Server has none)"),
        ],
    ),
    # Spark runs live here too (the conformance suite); the parse check guards the
    # renderings the live suite does not reach (sealed keys, md5, every split)
    "spark": (
        "spark",
        [
            (r"\)\s*(>=|<=|<|>)\s*\(", "a row-value range comparison (Spark compares STRUCTs by field names)"),
            (r"\btry_sum\b", "try_sum (an overflow becomes a silent NULL)"),
        ],
    ),
    # ClickHouse's SQL also runs on the embedded engine (chdb, agent/tests/clickhouse_chdb.rs);
    # the parse check covers every statement, the HTTP connector's catalog SQL too
    "clickhouse": (
        "clickhouse",
        [
            (r"\bLAG\(", "LAG (ClickHouse answers the type's default, not NULL, before the first row)"),
            (r"AS INTEGER\)", "CAST(.. AS INTEGER) (a NULL is an error; toInt32 keeps it)"),
            (r"\?", "a ? placeholder (ClickHouse's query parameters are {name:Type})"),
            (r"\bbit_xor\b", "bit_xor (ClickHouse's XOR aggregate is groupBitXor)"),
        ],
    ),
    "oracle": (
        "oracle",
        [
            (r"\)\s*(>=|<=|<|>)\s*\(", "a row-value range comparison (Oracle has none)"),
            (r"\)\s+AS\s+\"?\w+\"?\s*(WHERE|GROUP|ORDER|$|\))", "AS before a table alias (Oracle rejects it)"),
            (r"\bLIMIT\b", "LIMIT (Oracle uses FETCH FIRST)"),
            (r"CONVERT\([^)]*'UTF8'", "CONVERT(..., 'UTF8') yields CESU-8, not UTF-8"),
            (r"\bCOUNT_BIG\b", "COUNT_BIG is SQL Server's"),
        ],
    ),
}


def statements(text):
    """(title, sql) for every section of a golden file; skips in-process markers."""
    for block in text.split("\n\n"):
        lines = [l for l in block.strip().splitlines() if l.strip()]
        if not lines or not lines[0].startswith("-- "):
            continue
        title = lines[0][3:]
        body = [l for l in lines[1:] if not l.startswith("-- ")]
        sql = "\n".join(body).strip()
        if not sql or sql == "(in-process)":
            continue
        yield title, sql


# statements sqlglot has no grammar for, valid on the engine as written: each must
# match its pattern whole, then the rest of the section is parsed
NO_GRAMMAR = {
    "tsql": [r"SET TRANSACTION ISOLATION LEVEL (SNAPSHOT|READ COMMITTED|REPEATABLE READ|SERIALIZABLE)"],
    "oracle": [r"SET TRANSACTION READ ONLY", r"ALTER SESSION SET \w+ = '[^']*'"],
}


def split_known(sql, dialect):
    """The statements of a section, minus those NO_GRAMMAR vouches for."""
    out = []
    for stmt in [s.strip() for s in sql.split(";") if s.strip()] if dialect in NO_GRAMMAR else [sql]:
        if any(re.fullmatch(p, stmt) for p in NO_GRAMMAR.get(dialect, [])):
            continue
        out.append(stmt)
    return out


def check(path, dialect, forbidden):
    failures = []
    n = 0
    for title, sql in statements(path.read_text()):
        n += 1
        for stmt in split_known(sql, dialect):
            # a bare expression (a row string, a checksum) parses as the column of a SELECT
            probe = stmt if re.match(r"^\s*(SELECT|SET|WITH|BEGIN)\b", stmt, re.I) else f"SELECT {stmt} AS v"
            try:
                parsed = sqlglot.parse(probe, read=dialect, error_level=ErrorLevel.RAISE)
                if not parsed or any(p is None for p in parsed):
                    failures.append((title, "parsed to nothing"))
            except Exception as e:  # sqlglot raises ParseError / TokenError
                failures.append((title, str(e).splitlines()[0][:200]))
        for pattern, why in forbidden:
            if re.search(pattern, sql, re.M):
                failures.append((title, why))
    return n, failures


def main():
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "agent/tests/golden")
    bad = 0
    for engine, (dialect, forbidden) in ENGINES.items():
        path = root / f"{engine}.sql"
        if not path.exists():
            continue
        n, failures = check(path, dialect, forbidden)
        for title, why in failures:
            print(f"{path}: [{title}] {why}")
        print(f"{path}: {n} statement(s) under sqlglot {sqlglot.__version__} ({dialect}): "
              f"{'ok' if not failures else f'{len(failures)} problem(s)'}")
        bad += len(failures)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
