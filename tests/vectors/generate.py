#!/usr/bin/env python3
"""Independent reference for Tally's canonical form (DESIGN section 3) and checksums (section 4).

This script is deliberately written without looking at the Rust encoder's output: it
implements the rules with Python's decimal, datetime, uuid and hashlib modules and writes
tests/vectors/canonical.json. The Rust reference in tally-common must reproduce every value
in that file bit for bit, so two independent implementations have to agree.

    python3 tests/vectors/generate.py           # rewrite canonical.json
    python3 tests/vectors/generate.py --check   # fail if canonical.json differs (CI)
"""
import datetime
import decimal
import hashlib
import json
import re
import sys
import uuid
from pathlib import Path

OUT = Path(__file__).with_name("canonical.json")
MOD = 1 << 64

decimal.getcontext().prec = 200


def fixed_point(d: decimal.Decimal, scale: int) -> str:
    q = d.quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP)
    s = format(q, "f")
    if s.startswith("-") and set(s[1:]) <= set("0."):
        s = s[1:]  # -0 becomes 0
    return s


def split_fraction(s: str):
    m = re.fullmatch(r"(.*?)(?:\.(\d{1,9}))?", s)
    return m.group(1), (m.group(2) or "")


def frac(digits: str, precision: int) -> str:
    # cut, never round; always `precision` digits; no dot at precision 0
    if precision == 0:
        return ""
    return "." + digits[:precision].ljust(precision, "0")


def canonical(f: dict):
    t, v = f["type"], f["value"]
    if v is None:
        return None
    if t == "integer":
        return str(int(v))
    if t == "decimal":
        return fixed_point(decimal.Decimal(v), f["scale"])
    if t == "float":
        x = float(v)
        if x != x:
            return "NaN"
        if x in (float("inf"), float("-inf")):
            return "Infinity" if x > 0 else "-Infinity"
        # the shortest decimal that round-trips to the double, then rounded half away from zero
        return fixed_point(decimal.Decimal(repr(x)), f.get("scale", 6))
    if t == "boolean":
        return {"true": "1", "false": "0"}[v.lower()]
    if t == "text":
        return v.rstrip(" ") if f.get("char") else v
    if t == "date":
        return datetime.date.fromisoformat(v).isoformat()
    if t in ("timestamp", "timestamptz"):
        p = f.get("precision", 6)
        m = re.fullmatch(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})?", v)
        assert m, v
        day, hms, digits, zone = m.group(1), m.group(2), m.group(3) or "", m.group(4)
        base = datetime.datetime.fromisoformat(f"{day}T{hms}")
        if t == "timestamptz":
            assert zone, f"timestamptz needs an offset: {v}"
            if zone != "Z":
                sign = 1 if zone[0] == "+" else -1
                hh, mm = int(zone[1:3]), int(zone[4:6])
                base -= sign * datetime.timedelta(hours=hh, minutes=mm)
            return base.strftime("%Y-%m-%dT%H:%M:%S").rjust(19, "0") + frac(digits, p) + "Z"
        assert not zone, f"timestamp without zone got an offset: {v}"
        return base.isoformat(timespec="seconds") + frac(digits, p)
    if t == "time":
        hms, digits = split_fraction(v)
        datetime.time.fromisoformat(hms)
        return hms + frac(digits, f.get("precision", 6))
    if t == "uuid":
        return str(uuid.UUID(v))
    if t == "binary":
        return bytes.fromhex(v).hex()
    raise ValueError(t)


def row_string(fields) -> str:
    out = []
    for f in fields:
        c = canonical(f)
        out.append("~" if c is None else f"{len(c.encode('utf-8'))}:{c}")
    return "".join(out)


def md5_48(row: str) -> int:
    return int(hashlib.md5(row.encode("utf-8")).hexdigest()[:12], 16) - (1 << 47)


def sha256_64(row: str) -> int:
    return int(hashlib.sha256(row.encode("utf-8")).hexdigest()[:16], 16)


def h16(x: int) -> str:
    return format(x % MOD, "016x")


# ---- the vectors -------------------------------------------------------------------------

def I(v): return {"type": "integer", "value": v}
def D(v, s): return {"type": "decimal", "value": v, "scale": s}
def F(v, s=6): return {"type": "float", "value": v, "scale": s}
def B(v): return {"type": "boolean", "value": v}
def T(v): return {"type": "text", "value": v}
def C(v): return {"type": "text", "value": v, "char": True}
def DT(v): return {"type": "date", "value": v}
def TS(v, p=6): return {"type": "timestamp", "value": v, "precision": p}
def TZ(v, p=6): return {"type": "timestamptz", "value": v, "precision": p}
def TM(v, p=6): return {"type": "time", "value": v, "precision": p}
def U(v): return {"type": "uuid", "value": v}
def X(v): return {"type": "binary", "value": v}


ROWS = [
    ("design example: integer, multi-byte text, NULL, decimal at scale 2",
     [I("42"), T("héllo"), T(None), D("1250.5", 2)]),
    ("integer zero", [I("0")]),
    ("negative integer", [I("-1")]),
    ("bigint max", [I("9223372036854775807")]),
    ("bigint min", [I("-9223372036854775808")]),
    ("unsigned bigint max", [I("18446744073709551615")]),
    ("NULL integer", [I(None)]),
    ("NULL text", [T(None)]),
    ("empty text is not NULL", [T("")]),
    ("the text ~ is not NULL", [T("~")]),
    ("text that looks like a length prefix", [T("3:abc")]),
    ("text with colons and digits", [T("12:30:45")]),
    ("injectivity: ('a|b','c')", [T("a|b"), T("c")]),
    ("injectivity: ('a','b|c')", [T("a"), T("b|c")]),
    ("injectivity: ('', NULL)", [T(""), T(None)]),
    ("injectivity: (NULL, '')", [T(None), T("")]),
    ("injectivity: the text <NULL>", [T("<NULL>")]),
    ("two-byte UTF-8", [T("héllo wörld")]),
    ("three-byte UTF-8 (CJK)", [T("日本語テキスト")]),
    ("four-byte UTF-8 (astral emoji)", [T("😀")]),
    ("astral mixed with ASCII", [T("a😀b𝄞c")]),
    ("astral math letters", [T("𝔘𝔫𝔦𝔠𝔬𝔡𝔢")]),
    ("text with tab and newline", [T("line1\n\tline2")]),
    ("text keeps trailing spaces", [T("abc  ")]),
    ("CHAR(n) trailing spaces removed", [C("abc   ")]),
    ("CHAR(n) leading spaces kept", [C("  x  ")]),
    ("CHAR(n) all spaces is empty, not NULL", [C("     ")]),
    ("CHAR(n) NULL", [C(None)]),
    ("decimal scale 0", [D("12345", 0)]),
    ("decimal scale 2 padded", [D("7.5", 2)]),
    ("decimal scale 2 exact", [D("-1234.56", 2)]),
    ("decimal scale 10", [D("3.1415926535", 10)]),
    ("decimal scale 10 padded", [D("0.1", 10)]),
    ("decimal 38 digits scale 0", [D("12345678901234567890123456789012345678", 0)]),
    ("decimal 38 digits scale 10", [D("-1234567890123456789012345678.1234567890", 10)]),
    ("decimal -0 becomes 0", [D("-0.00", 2)]),
    ("decimal rounding to -0 becomes 0", [D("-0.001", 2)]),
    ("decimal rounds half away from zero", [D("2.345", 2), D("-2.345", 2)]),
    ("decimal NULL", [D(None, 2)]),
    ("float exact value", [F("0.5")]),
    ("float 0.1 is its shortest decimal", [F("0.1")]),
    ("float pi at scale 6", [F("3.14159265358979")]),
    ("float large", [F("1e20")]),
    ("float tiny rounds to 0", [F("1e-7")]),
    ("float -0 becomes 0", [F("-0.0")]),
    ("float half away from zero at scale 0", [F("2.5", 0), F("-1.5", 0)]),
    ("float scale 2", [F("-273.15", 2)]),
    ("float NaN", [F("NaN")]),
    ("float Infinity", [F("Infinity")]),
    ("float -Infinity", [F("-Infinity")]),
    ("booleans", [B("true"), B("false")]),
    ("boolean NULL", [B(None)]),
    ("date minimum", [DT("0001-01-01")]),
    ("date maximum", [DT("9999-12-31")]),
    ("date leap day", [DT("2024-02-29")]),
    ("timestamp before 1970", [TS("1969-07-20 20:17:40")]),
    ("timestamp 1900 at precision 3", [TS("1900-01-01 00:00:00.5", 3)]),
    ("timestamp precision 0 drops the fraction", [TS("2024-03-15 14:30:00.123456", 0)]),
    ("timestamp precision 3 cuts, never rounds", [TS("2024-03-15 14:30:00.999999", 3)]),
    ("timestamp precision 6 with microseconds", [TS("2024-03-15 14:30:00.123456")]),
    ("timestamp digits beyond 6 are cut", [TS("2024-03-15T14:30:00.1234569")]),
    ("timestamp minimum", [TS("0001-01-01 00:00:00")]),
    ("timestamp maximum", [TS("9999-12-31 23:59:59.999999")]),
    ("timestamptz +02:00", [TZ("2024-03-15T16:30:00.1+02:00")]),
    ("timestamptz Z, same instant", [TZ("2024-03-15T14:30:00.1Z")]),
    ("timestamptz -05:00, same instant", [TZ("2024-03-15 09:30:00.1-05:00")]),
    ("timestamptz +05:30, same instant", [TZ("2024-03-15T20:00:00.100+05:30")]),
    ("timestamptz crossing the date line", [TZ("2024-03-16T01:30:00+11:00")]),
    ("timestamptz precision 0", [TZ("2024-03-15T16:30:00.987+02:00", 0)]),
    ("timestamptz before 1970", [TZ("1960-01-01T00:00:00-08:00")]),
    ("time midnight", [TM("00:00:00")]),
    ("time end of day", [TM("23:59:59.999999")]),
    ("time precision 3", [TM("12:34:56.789123", 3)]),
    ("time precision 0", [TM("12:34:56.5", 0)]),
    ("uuid upper case", [U("A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11")]),
    ("uuid lower case, same value", [U("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")]),
    ("binary upper-case hex", [X("DEADBEEF")]),
    ("binary with zero bytes", [X("00FF00")]),
    ("empty binary", [X("")]),
    ("binary NULL", [X(None)]),
    ("an orders row", [I("1001"), T("Zoë Müller"), D("99.90", 2), TS("2024-01-31 23:59:59.5"), T(None)]),
    ("composite key with text", [T("EU"), I("7"), T("ñandú")]),
    ("wide row: 22 columns of every class",
     [I("1"), I("-2"), D("3.30", 2), D("-0.5", 3), F("4.25"), B("true"), B("false"), T("x"),
      C("y  "), T(""), T(None), DT("2020-02-02"), TS("2020-02-02 02:02:02.020202"),
      TZ("2020-02-02T02:02:02+01:00"), TM("02:02:02"), U("00000000-0000-0000-0000-000000000000"),
      X("0A0B"), T("漢字"), T("🚀"), I(None), D(None, 4), TS(None)]),
    ("wide row: 24 text columns", [T(str(i) * (i % 5)) for i in range(24)]),
]


def vector_rows():
    out = []
    for n, (about, fields) in enumerate(ROWS, start=1):
        rs = row_string(fields)
        out.append({
            "id": f"tv{n:03d}",
            "about": about,
            "fields": fields,
            "row_string": rs,
            "md5_48": str(md5_48(rs)),
            "sha256_64": format(sha256_64(rs), "016x"),
        })
    return out


def aggregates(rows):
    by_id = {r["id"]: r for r in rows}
    all_ids = [r["id"] for r in rows]
    # rows whose sha256_64 has the top bit set: any two of them sum past 2^64
    high = [r["id"] for r in rows if int(r["sha256_64"], 16) >= 1 << 63][:3]
    negative = [r["id"] for r in rows if int(r["md5_48"]) < 0][:3]
    specs = [
        ("empty segment", []),
        ("one row", ["tv001"]),
        ("many rows: every row vector", all_ids),
        ("order independence: every row vector reversed gives the same aggregate", list(reversed(all_ids))),
        ("sha256 SUM wraps past 2^64", high),
        ("md5_48 SUM of negative checksums wraps below 0", negative),
        ("XOR cancels a duplicated row, SUM still differs from ag008", ["tv002", "tv002", "tv003"]),
        ("the same segment without the duplicated pair", ["tv003"]),
    ]
    out = []
    for n, (about, ids) in enumerate(specs, start=1):
        md5s = [int(by_id[i]["md5_48"]) for i in ids]
        shas = [int(by_id[i]["sha256_64"], 16) for i in ids]
        x = 0
        for h in shas:
            x ^= h
        out.append({
            "id": f"ag{n:03d}",
            "about": about,
            "rows": ids,
            "count": str(len(ids)),
            "md5_48_sum": h16(sum(md5s)),
            "sha256_sum": h16(sum(shas)),
            "sha256_xor": h16(x),
        })
    assert sum(int(by_id[i]["sha256_64"], 16) for i in high) >= MOD, "ag005 must wrap"
    assert sum(int(by_id[i]["md5_48"]) for i in negative) < 0, "ag006 must go below zero"
    return out


def main():
    rows = vector_rows()
    doc = {
        "version": 1,
        "about": "Tally canonical-form and checksum vectors; generated by tests/vectors/generate.py "
                 "(independent Python reference), reproduced by tally-common and every dialect.",
        "vectors": rows,
        "aggregates": aggregates(rows),
    }
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            sys.exit(f"{OUT} is out of date: run python3 {sys.argv[0]}")
        print(f"{OUT}: {len(rows)} row vectors, {len(doc['aggregates'])} aggregates, up to date")
        return
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}: {len(rows)} row vectors, {len(doc['aggregates'])} aggregates")


if __name__ == "__main__":
    main()
