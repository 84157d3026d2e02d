#!/usr/bin/env python3
"""Independent reference for Tally's canonical form (DESIGN section 3) and checksums (section 4),
sealed checksums included (section 4.1: X25519, HKDF-SHA256, keyed row and key hashes), and the
time strategy's period labels (docs/canonical-form.md section 9).

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
import hmac
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


def exact_decimal(d: decimal.Decimal) -> str:
    # the exact value, trailing fractional zeros and point removed, never rounded
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def year_text(y: int) -> str:
    # ISO 8601 expanded years, astronomical numbering (1 BC = 0000)
    if y < 0:
        return "-" + str(-y).rjust(4, "0")
    if y > 9999:
        return "+" + str(y)
    return str(y).rjust(4, "0")


def is_leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def civil_date(text: str):
    """(year, month, day) astronomical, from YYYY-MM-DD[ BC] or an expanded year; or a token."""
    bc = text.endswith(" BC")
    if bc:
        text = text[:-3]
    if text in ("infinity", "-infinity"):
        return text
    m = re.fullmatch(r"([+-]?)(\d{4,9})-(\d{2})-(\d{2})", text)
    assert m, text
    y, mo, d = int(m.group(2)), int(m.group(3)), int(m.group(4))
    if m.group(1) == "-":
        y = -y
    if bc:
        y = 1 - y
    if mo == 0 or d == 0:  # MySQL zero-in-date, kept by value
        return (y, mo, d)
    days = [31, 29 if is_leap(y) else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    assert 1 <= mo <= 12 and 1 <= d <= days[mo - 1], text
    return (y, mo, d)


def date_text(c) -> str:
    return c if isinstance(c, str) else f"{year_text(c[0])}-{c[1]:02d}-{c[2]:02d}"


def shift(c, seconds: int):
    """A (y, m, d) date plus whole seconds of the day -> (date, seconds), via an ordinal
    on a 400-year-shifted Python date (the Gregorian calendar repeats every 400 years)."""
    y, mo, d = c
    k = 0
    while not 400 <= y + 400 * k <= 9599:  # a year away from both ends of Python's range
        k += 1 if y + 400 * k < 400 else -1
    base = datetime.datetime(y + 400 * k, mo, d) + datetime.timedelta(seconds=seconds)
    return (base.year - 400 * k, base.month, base.day), base.hour * 3600 + base.minute * 60 + base.second


def json_number(x: float) -> str:
    # ECMAScript Number.prototype.toString from Python's shortest repr digits
    if x == 0:
        return "0"
    m = re.fullmatch(r"(-?)(\d+)(?:\.(\d+))?(?:e([+-]\d+))?", repr(x))
    sign, ip, fp, e = m.group(1), m.group(2), m.group(3) or "", int(m.group(4) or 0)
    digits = (ip + fp).lstrip("0")
    n = len(ip.lstrip("0")) + e if ip.lstrip("0") else e - (len(fp) - len(fp.lstrip("0")))
    digits = digits.rstrip("0") or "0"
    k = len(digits)
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        out = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("+" if n - 1 >= 0 else "-") + str(abs(n - 1))
    return sign + out


class NoCanonicalForm(ValueError):
    """A value the canonical form refuses (an error naming the column, never a match)."""


def unique_members(pairs):
    # I-JSON (RFC 7493), which RFC 8785 asks for: no object has two members of one name
    names = [k for k, _ in pairs]
    if len(set(names)) != len(names):
        raise NoCanonicalForm("a JSON object with two members of one name")
    return dict(pairs)


def i_json_number(text: str) -> float:
    # a number is read as a double; its written value must be that double's exact value
    # or its shortest decimal, else two documents that differ would fold into one
    x = float(text)
    if x in (float("inf"), float("-inf")):
        raise NoCanonicalForm("a JSON number outside double range")
    written = decimal.Decimal(text)
    if written != decimal.Decimal(x) and written != decimal.Decimal(repr(x)):
        raise NoCanonicalForm("a JSON number with more precision than a double holds")
    return x


def json_text(v) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (int, float)):
        return json_number(float(v))
    if isinstance(v, str):
        out = ['"']
        for ch in v:
            esc = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
            if ch in esc:
                out.append(esc[ch])
            elif ord(ch) < 0x20:
                out.append("\\u%04x" % ord(ch))
            else:
                out.append(ch)
        return "".join(out) + '"'
    if isinstance(v, list):
        return "[" + ",".join(json_text(x) for x in v) + "]"
    keys = sorted(v, key=lambda k: k.encode("utf-16-be"))
    return "{" + ",".join(json_text(k) + ":" + json_text(v[k]) for k in keys) + "}"


def canonical(f: dict):
    t, v = f["type"], f["value"]
    if v is None:
        return None
    if t == "integer":
        return str(int(v))
    if t == "decimal":
        if v in ("NaN", "Infinity", "-Infinity"):
            return v
        if f.get("exact"):
            return exact_decimal(decimal.Decimal(v))
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
        if re.fullmatch(r"-?\d+", v):
            return str(int(v))  # an integer compared as a boolean keeps its value
        return {"true": "1", "false": "0"}[v.lower()]
    if t == "text":
        return v.rstrip(" ") if f.get("char") else v
    if t == "date":
        return date_text(civil_date(v))
    if t in ("timestamp", "timestamptz"):
        p = f.get("precision", 6)
        if v in ("infinity", "-infinity"):
            return v
        bc = v.endswith(" BC")
        body = v[:-3] if bc else v
        m = re.fullmatch(r"([+-]?\d{4,9}-\d{2}-\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}(?::?\d{2})?)?", body)
        assert m, v
        day = civil_date(m.group(1) + (" BC" if bc else ""))
        secs = int(m.group(2)) * 3600 + int(m.group(3)) * 60 + int(m.group(4))
        assert int(m.group(2)) < 24, v
        digits, zone = m.group(5) or "", m.group(6)
        if t == "timestamptz":
            assert zone, f"timestamptz needs an offset: {v}"
            if zone != "Z":
                sign = 1 if zone[0] == "+" else -1
                z = zone[1:].replace(":", "")
                off = int(z[0:2]) * 3600 + (int(z[2:4]) * 60 if len(z) > 2 else 0)
                day, secs = shift(day, secs - sign * off)
        else:
            assert not zone, f"timestamp without zone got an offset: {v}"
        clock = f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"
        return date_text(day) + "T" + clock + frac(digits, p) + ("Z" if t == "timestamptz" else "")
    if t == "time":
        hms, digits = split_fraction(v)
        m = re.fullmatch(r"(-?)(\d{2,3}):(\d{2}):(\d{2})", hms)
        assert m and int(m.group(3)) < 60 and int(m.group(4)) < 60 and int(m.group(2)) <= 838, v
        zero = int(m.group(2)) == int(m.group(3)) == int(m.group(4)) == 0 and set(digits) <= {"0"}
        sign = "" if zero else m.group(1)
        return sign + hms.lstrip("-") + frac(digits, f.get("precision", 6))
    if t == "uuid":
        return str(uuid.UUID(v))
    if t == "binary":
        b = bytes.fromhex(v)
        return (b.rstrip(b"\x00") if f.get("char") else b).hex()
    if t == "json":
        return json_text(json.loads(v, object_pairs_hook=unique_members,
                                    parse_int=i_json_number, parse_float=i_json_number))
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


# ---- sealed checksums (DESIGN section 4.1) ------------------------------------------------

P25519 = 2**255 - 19


def x25519(k: bytes, u: bytes) -> bytes:
    """RFC 7748 section 5: the Montgomery ladder over curve25519."""
    k = bytearray(k)
    k[0] &= 248
    k[31] &= 127
    k[31] |= 64
    n = int.from_bytes(k, "little")
    x1 = int.from_bytes(u, "little") & ((1 << 255) - 1)
    x2, z2, x3, z3, swap = 1, 0, x1, 1, 0
    for t in reversed(range(255)):
        bit = (n >> t) & 1
        swap ^= bit
        if swap:
            x2, x3, z2, z3 = x3, x2, z3, z2
        swap = bit
        a, b = (x2 + z2) % P25519, (x2 - z2) % P25519
        aa, bb = a * a % P25519, b * b % P25519
        e = (aa - bb) % P25519
        c, d = (x3 + z3) % P25519, (x3 - z3) % P25519
        da, cb = d * a % P25519, c * b % P25519
        x3, z3 = (da + cb) ** 2 % P25519, x1 * (da - cb) ** 2 % P25519
        x2, z2 = aa * bb % P25519, e * (aa + 121665 * e) % P25519
    if swap:
        x2, z2 = x3, z3
    return (x2 * pow(z2, P25519 - 2, P25519) % P25519).to_bytes(32, "little")


BASE = (9).to_bytes(32, "little")
# RFC 7748 section 6.1: Alice's key pair
assert x25519(bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"), BASE).hex() \
    == "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"


def hkdf_expand32(prk: bytes, info: bytes) -> bytes:
    """RFC 5869 HKDF-Expand for 32 bytes: one block, T(1) = HMAC(PRK, info || 0x01)."""
    return hmac.new(prk, info + b"\x01", hashlib.sha256).digest()


def run_keys(own: bytes, me, peer_pub: bytes, peer, nonce: bytes):
    """me and peer are (agent name, dataset name): the run key binds both parties."""
    shared = x25519(own, peer_pub)
    prk = hmac.new(nonce, shared, hashlib.sha256).digest()  # HKDF-Extract(salt = nonce)
    (la, ld), (ha, hd) = sorted([(me[0].encode(), me[1].encode()), (peer[0].encode(), peer[1].encode())])
    run_key = hkdf_expand32(prk, b"tally-run-key/1\n" + la + b"\n" + ld + b"\n" + ha + b"\n" + hd)
    return shared, run_key, hkdf_expand32(run_key, b"row"), hkdf_expand32(run_key, b"key")


def sealed(rows):
    dc1 = hashlib.sha256(b"tally test zone key dc1").digest()
    vpc2 = hashlib.sha256(b"tally test zone key vpc2").digest()
    nonce = bytes(range(16))
    me, peer = ("dc1", "orders"), ("vpc2", "orders_replica")
    shared, run_key, k_row, k_key = run_keys(dc1, me, x25519(vpc2, BASE), peer, nonce)
    # the peer derives the same keys from its own secret and dc1's public key
    assert run_keys(vpc2, peer, x25519(dc1, BASE), me, nonce) == (shared, run_key, k_row, k_key)
    # another dataset on either side: other keys
    assert run_keys(dc1, ("dc1", "accounts"), x25519(vpc2, BASE), peer, nonce)[1] != run_key
    out = []
    for r in rows[:12]:
        b = r["row_string"].encode("utf-8")
        out.append({
            "id": r["id"],
            "sealed_md5_48": str(int(hashlib.md5(k_row + b).hexdigest()[:12], 16) - (1 << 47)),
            "sealed_sha256_64": hashlib.sha256(k_row + b).hexdigest()[:16],
            "sealed_key_hash": hashlib.sha256(k_key + b).hexdigest()[:16],
        })
    return {
        "about": "sealed_md5_48 and sealed_sha256_64 of the first row vectors for a run between dataset orders "
                 "of agent dc1 and dataset orders_replica of agent vpc2, with fixed zone keys; sealed_key_hash "
                 "is the keyed key hash of the same row string",
        "datasets": {"dc1": me[1], "vpc2": peer[1]},
        "zone_keys": {
            "dc1": {"secret": dc1.hex(), "public": x25519(dc1, BASE).hex()},
            "vpc2": {"secret": vpc2.hex(), "public": x25519(vpc2, BASE).hex()},
        },
        "nonce": nonce.hex(),
        "shared": shared.hex(),
        "run_key": run_key.hex(),
        "k_row": k_row.hex(),
        "k_key": k_key.hex(),
        "rows": out,
    }


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
def XF(v): return {"type": "binary", "value": v, "char": True}
def DE(v): return {"type": "decimal", "value": v, "exact": True}
def J(v): return {"type": "json", "value": v}


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
    # rules added for the zero-false-pass round (DESIGN section 3, extended)
    ("exact decimal: undeclared scale keeps every digit, trailing zeros dropped", [DE("10.004"), DE("10.500"), DE("10.00")]),
    ("exact decimal: zero, negative zero, exponent, leading zeros", [DE("0.000"), DE("-0.00"), DE("1.5E3"), DE("007.0100")]),
    ("exact decimal: 40 fractional digits are never rounded", [DE("-0.0000000000000000000000000000000000000001")]),
    ("decimal NaN and infinities are tokens", [D("NaN", 2), D("Infinity", 2), D("-Infinity", 0)]),
    ("date 2000-01-01 BC is astronomical year -1999", [DT("2000-01-01 BC")]),
    ("date 1 BC is year 0000", [DT("0001-12-31 BC")]),
    ("date 2 BC is year -0001", [DT("0002-01-01 BC")]),
    ("date after 9999 is an expanded year", [DT("10000-01-01")]),
    ("date infinities", [DT("infinity"), DT("-infinity")]),
    ("MySQL zero date and zero-in-date kept by value", [DT("0000-00-00"), DT("2024-00-15")]),
    ("timestamp BC", [TS("0044-03-15 12:00:00.5 BC")]),
    ("timestamp after 9999", [TS("10000-01-01 00:00:00")]),
    ("timestamp infinities", [TS("infinity"), TS("-infinity")]),
    ("timestamptz infinities", [TZ("infinity"), TZ("-infinity")]),
    ("timestamptz BC in PostgreSQL's output form", [TZ("0044-03-15 12:00:00+00 BC")]),
    ("timestamptz crossing from 1 AD into 1 BC in UTC", [TZ("0001-01-01 00:30:00+01:00")]),
    ("timestamptz with an hours-only offset", [TZ("2024-03-15 16:30:00+02")]),
    ("MySQL zero datetime kept by value", [TS("0000-00-00 00:00:00")]),
    ("time 24:00:00 (PostgreSQL)", [TM("24:00:00")]),
    ("time as a MySQL duration: past 24 h and negative", [TM("838:59:59"), TM("-01:30:00.25", 3), TM("-00:00:00")]),
    ("an integer compared as a boolean keeps a value other than 0 and 1", [B("2"), B("1"), B("0")]),
    ("BINARY(n) padding removed", [XF("AB0000"), XF("0000"), XF("00AB")]),
    ("json: members sorted, whitespace removed", [J('{ "b": 1, "a": [true, null, "x"] }')]),
    ("json: numbers as ECMAScript doubles", [J('[1.0, 1e2, 1E21, 0.000001, 1e-7, -0, 1424953923781206.25, 333333333.33333325]')]),
    ("json: string escapes", [J('["\\u0001\\u001f", "\\n\\t\\"\\\\/", "\\u00e9\\ud83d\\ude00"]')]),
    ("json: members sorted by UTF-16 code units", [J('{"\\ue000": 1, "\\ud83d\\ude00": 2, "a": 3}')]),
    ("json: a scalar document and nesting", [J('"text"'), J('{"o": {"z": [], "y": {}}}')]),
    ("float: a double halfway between two shortest decimals takes the even digit", [F("1000000000000000.25"), F("1125899906842624.25", 1)]),
    ("json: numbers read exactly as doubles (no ulp lost in parsing)", [J('[2.9133421712063755e+193, 1.8824190929447882e+65, -69026.3]')]),
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


# Period labels (docs/canonical-form.md section 9), written from the doc's table only.
GRANULARITIES = ["hour", "day", "week", "month", "quarter", "year"]


def weekday(y: int, mo: int, d: int) -> int:
    """0 = Monday; proleptic Gregorian via a 400-year-shifted Python date (same weekday)."""
    k = 0
    while not 400 <= y + 400 * k <= 9599:
        k += 1 if y + 400 * k < 400 else -1
    return datetime.date(y + 400 * k, mo, d).weekday()


def period_label(c, g: str) -> str:
    if c is None:
        return ""  # rows without a time
    if not c[:1].isdigit():
        return c  # infinity, -infinity, a signed year: a period of its own
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}(T.*)?", c), c
    if g in ("hour", "day", "month", "year"):
        return c[: {"hour": 13, "day": 10, "month": 7, "year": 4}[g]]
    y, mo, d = int(c[:4]), int(c[5:7]), int(c[8:10])
    if g == "quarter":
        if not 1 <= mo <= 12:
            return c[:7]
        return f"{c[:4]}-{(mo - 1) // 3 * 3 + 1:02d}"
    assert g == "week", g
    days = [31, 29 if is_leap(y) else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    if not (1 <= mo <= 12 and 1 <= d <= days[mo - 1]):
        return c[:10]  # no calendar date: its day is its week
    (my, mm, md), _ = shift((y, mo, d), -weekday(y, mo, d) * 86400)
    return date_text((my, mm, md))


PERIOD_TEXTS = [
    ("NULL: the empty label", None),
    ("ordinary date (a Friday); a date's hour is the whole date", "2024-03-15"),
    ("timestamp, precision 6", "2024-03-15T14:30:00.123456"),
    ("timestamp, precision 0", "2024-03-15T14:30:00"),
    ("timestamp, precision 3", "2024-03-15T09:05:00.999"),
    ("timestamptz with Z", "2024-03-15T14:30:00.100000Z"),
    ("timestamptz with Z before 1970", "1969-12-31T23:59:59.000000Z"),
    ("1970-01-01 is a Thursday: its Monday is in 1969", "1970-01-01"),
    ("year end, a Tuesday", "2024-12-31"),
    ("year end timestamptz", "2024-12-31T23:59:59.999999Z"),
    ("new year, a Wednesday: its ISO week starts 2024-12-30", "2025-01-01"),
    ("a Sunday: its Monday is in the previous year", "2021-01-03"),
    ("a Monday is its own week", "2021-01-04"),
    ("ISO week 53", "2020-12-31"),
    ("a Friday new year: its Monday is in the previous year", "2027-01-01"),
    ("leap day", "2024-02-29"),
    ("leap day of a 400-year", "2000-02-29T08:00:00"),
    ("a Sunday whose week crosses a leap day", "2024-03-03"),
    ("1900 is no leap year", "1900-03-01"),
    ("quarter starts: January", "2024-01-01"),
    ("quarter 2 end", "2024-06-30"),
    ("quarter 3 start", "2024-07-01T00:00:00.000000Z"),
    ("quarter 3 end", "2024-09-30T23:59:59"),
    ("quarter 4 start", "2024-10-01"),
    ("0001-01-01 is a Monday", "0001-01-01"),
    ("0001-01-01 timestamp", "0001-01-01T00:00:00.000000"),
    ("a Sunday in year 1", "0001-01-07"),
    ("9999-12-31, a Friday", "9999-12-31"),
    ("the last timestamptz", "9999-12-31T23:59:59.999999Z"),
    ("infinity", "infinity"),
    ("-infinity", "-infinity"),
    ("1 BC is 0000 and a leap year", "0000-02-29"),
    ("0000-01-01: its Monday is in 2 BC", "0000-01-01"),
    ("end of 1 BC", "0000-12-31T12:00:00"),
    ("10 BC: a signed year is its own period", "-0009-06-01"),
    ("10 BC timestamp", "-0009-06-01T00:00:00"),
    ("expanded year", "+10000-01-01"),
    ("expanded year timestamptz", "+10000-01-01T00:00:00.000000Z"),
    ("MySQL zero date", "0000-00-00"),
    ("MySQL zero datetime", "0000-00-00T00:00:00"),
    ("MySQL zero month", "2024-00-15"),
    ("MySQL zero day", "2024-05-00"),
    ("MySQL zero month and day", "2024-00-00T10:00:00"),
    ("MySQL ALLOW_INVALID_DATES: no calendar date", "2024-02-30"),
]


def period_labels():
    out = []
    for n, (about, c) in enumerate(PERIOD_TEXTS, start=1):
        out.append({
            "id": f"pl{n:03d}",
            "about": about,
            "canonical": c,
            "labels": {g: period_label(c, g) for g in GRANULARITIES},
        })
    # the doc's own examples
    assert period_label("0000-01-01", "week") == "-0001-12-27"
    assert period_label("2024-00-15", "quarter") == "2024-00"
    assert period_label("2024-03-15", "week") == "2024-03-11"
    return out


# single fields whose rule a reader could take two ways: the canonical text, or refused
SINGLE = [
    ("float: of the six 17-digit decimals that read back as 0.1 + 0.2 "
     "(0.30000000000000002 to ...07), the nearest to the double's exact value",
     F("0.30000000000000004", 17)),
    ("float: the shortest decimal, not the double's exact value, at a scale past its digits",
     F("0.1", 20)),
    ("time: a negative duration cut to zero keeps its sign (the stored value is negative)",
     TM("-00:00:00.000001", 3)),
    ("time: a duration of zero is unsigned, however it is written", TM("-00:00:00.000000", 6)),
    ("json: two members of one name are refused (not I-JSON)", J('{"a": 1, "a": 2}')),
    ("json: two members of one name are refused however the name is escaped", J('{"a": 1, "\\u0061": 1}')),
    ("json: a number a double cannot hold exactly nor as its shortest decimal is refused",
     J('[12345678901234567890]')),
]


def single():
    out = []
    for n, (about, f) in enumerate(SINGLE, start=1):
        entry = {"id": f"sf{n:03d}", "about": about, "field": f}
        try:
            entry["canonical"] = canonical(f)
        except NoCanonicalForm as e:
            entry["refused"] = str(e)
        out.append(entry)
    assert out[0]["canonical"] == "0.30000000000000004", out[0]
    assert out[1]["canonical"] == "0.10000000000000000000", out[1]
    assert out[2]["canonical"] == "-00:00:00.000", out[2]
    assert out[3]["canonical"] == "00:00:00.000000", out[3]
    assert all("refused" in e for e in out[4:]), out[4:]
    return out


def main():
    rows = vector_rows()
    doc = {
        "version": 1,
        "about": "Tally canonical-form and checksum vectors; generated by tests/vectors/generate.py "
                 "(independent Python reference), reproduced by tally-common and every dialect.",
        "vectors": rows,
        "aggregates": aggregates(rows),
        "sealed": sealed(rows),
        "period_labels": period_labels(),
        "single": single(),
    }
    text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            sys.exit(f"{OUT} is out of date: run python3 {sys.argv[0]}")
        print(f"{OUT}: {len(rows)} row vectors, {len(doc['aggregates'])} aggregates, "
              f"{len(doc['period_labels'])} period-label vectors, up to date")
        return
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}: {len(rows)} row vectors, {len(doc['aggregates'])} aggregates, "
          f"{len(doc['period_labels'])} period-label vectors")


if __name__ == "__main__":
    main()
