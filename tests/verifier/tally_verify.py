#!/usr/bin/env python3
"""An independent verifier of Tally evidence bundles, written from docs/evidence.md alone.

    python3 tests/verifier/tally_verify.py BUNDLE --ca CA.pem [--json]

Exit 0 valid, 1 invalid, 2 usage. Runs the 17 checks of docs/evidence.md ("What
`tally verify` checks") in order, prints one line per check and stops at the first
failure. Where the docs leave a point open, the stricter reading is taken; each such
point is listed in tests/verifier/QUESTIONS.md (tagged Qn in comments below).

Stdlib plus `cryptography`. No line of it was written from Tally's Rust sources.
"""

import argparse
import base64
import binascii
import calendar
import datetime
import decimal
import hashlib
import json
import re
import sys

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID

FORMAT = "tally-evidence/1"
BUNDLE_FIELDS = {"format", "result", "statement", "agent_results", "events", "checkpoint", "certificates"}
T_AGENT = "application/vnd.tally.agent-result.v1+json"
T_STATEMENT = "application/vnd.in-toto+json"
T_CHECKPOINT = "application/vnd.tally.checkpoint.v1+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://tally.dev/reconciliation/v1"
PREDICATE_FIELDS = ["run_id", "spec_sha256", "verdict", "fidelity", "hash_method", "canonical_form_version",
                    "level", "agents", "source", "target", "leaves", "difference_counts",
                    "false_match_bound", "started", "finished", "events_head"]
ANY_EKU = x509.ObjectIdentifier("2.5.29.37.0")
U64 = 1 << 64
SKEW_NS = 5 * 60 * 10**9
ZERO64 = "0" * 64

RE_WHOLE = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})Z$")
RE_FRAC = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?Z$")
RE_HEX64 = re.compile(r"^[0-9a-f]{64}$")
RE_HEX16 = re.compile(r"^[0-9a-f]{16}$")
RE_RUN_ID = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class Fail(Exception):
    """A check failed: the bundle is invalid."""


class Usage(Exception):
    """A usage error: exit 2."""


# ---------------------------------------------------------------- small helpers

def need(cond, msg):
    if not cond:
        raise Fail(msg)


def is_int(v):
    return type(v) is int


def is_str(v):
    return type(v) is str


def is_obj(v):
    return type(v) is dict


def b64(s, what):
    """RFC 4648 §4 base64, standard alphabet, padded, no whitespace, zero trailing bits."""
    need(is_str(s), f"{what}: not a base64 string")
    try:
        raw = base64.b64decode(s.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise Fail(f"{what}: not strict base64 ({e})")
    # A canonical re-encoding refuses missing padding and non-zero trailing bits.
    need(base64.b64encode(raw).decode("ascii") == s, f"{what}: not strict base64 (non-canonical encoding)")
    return raw


def _no_dupes(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"duplicate key {k!r}")
        seen[k] = v
    return seen


def _no_const(name):
    raise ValueError(f"non-JSON number {name}")


def parse_json(raw, what):
    """Strict JSON: UTF-8, no duplicate keys (Q2), no NaN/Infinity, finite numbers."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
        v = json.loads(text, object_pairs_hook=_no_dupes, parse_constant=_no_const)
    except (UnicodeDecodeError, ValueError) as e:
        raise Fail(f"{what}: not valid JSON ({e})")
    _finite(v, what)
    _no_lone_surrogates(v, what)
    return v


def _no_lone_surrogates(v, what):
    """I-JSON: a string is Unicode; an escape of half a surrogate pair is refused."""
    if isinstance(v, str):
        if any(0xD800 <= ord(ch) <= 0xDFFF for ch in v):
            raise Fail(f"{what}: a string holds a lone surrogate (not I-JSON)")
    elif isinstance(v, list):
        for x in v:
            _no_lone_surrogates(x, what)
    elif isinstance(v, dict):
        for k, x in v.items():
            _no_lone_surrogates(k, what)
            _no_lone_surrogates(x, what)


def _finite(v, what):
    if type(v) is float:
        need(v == v and v not in (float("inf"), float("-inf")), f"{what}: a number out of range")
    elif is_obj(v):
        for x in v.values():
            _finite(x, what)
    elif type(v) is list:
        for x in v:
            _finite(x, what)


def exact_keys(obj, required, optional=(), what="object"):
    need(is_obj(obj), f"{what}: not an object")
    keys = set(obj)
    missing = set(required) - keys
    extra = keys - set(required) - set(optional)
    need(not missing, f"{what}: missing field(s) {sorted(missing)}")
    need(not extra, f"{what}: unknown field(s) {sorted(extra)}")


def sha256_hex(b):
    return hashlib.sha256(b).hexdigest()


def hex16(v, what):
    need(is_str(v) and RE_HEX16.match(v), f"{what}: not 16 lowercase hex digits")
    return int(v, 16)


def hex64(v, what):
    need(is_str(v) and RE_HEX64.match(v), f"{what}: not 64 lowercase hex digits")
    return v


def _date_ok(y, mo, d, h, mi, s):
    try:
        datetime.datetime(y, mo, d, h, mi, s)
        return True
    except ValueError:
        return False


def time_ns(s, what, fraction):
    """Nanoseconds since the epoch of `YYYY-MM-DDTHH:MM:SS[.f{1,9}]Z` (a real date and time)."""
    m = (RE_FRAC if fraction else RE_WHOLE).match(s) if is_str(s) else None
    shape = "YYYY-MM-DDTHH:MM:SS[.fraction]Z" if fraction else "YYYY-MM-DDTHH:MM:SSZ"
    need(m, f"{what}: {s!r} is not {shape}")
    y, mo, d, h, mi, sec = (int(x) for x in m.groups()[:6])
    need(_date_ok(y, mo, d, h, mi, sec), f"{what}: {s!r} is not a real date and time")
    frac = m.group(7) if fraction and m.lastindex and m.lastindex >= 7 else None
    ns = int((frac or "").ljust(9, "0")) if frac else 0
    return calendar.timegm((y, mo, d, h, mi, sec, 0, 0, 0)) * 10**9 + ns


def ns_to_dt(ns):
    return datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=ns // 1000)


# ---------------------------------------------------------------- RFC 8785

def jcs(v):
    """RFC 8785 canonical JSON, as bytes."""
    return _jcs(v).encode("utf-8")


def _jcs(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if is_str(v):
        return json.dumps(v, ensure_ascii=False)
    if is_int(v):
        if abs(v) <= 2**53:
            return str(v)
        f = float(v)  # I-JSON: numbers are doubles (Q14)
        need(int(f) == v, f"spec: integer {v} is not exactly a double; RFC 8785 cannot represent it")
        return _es_number(f)
    if type(v) is float:
        return _es_number(v)
    if type(v) is list:
        return "[" + ",".join(_jcs(x) for x in v) + "]"
    if is_obj(v):
        keys = sorted(v, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + _jcs(v[k]) for k in keys) + "}"
    raise Fail(f"spec: cannot canonicalise {type(v).__name__}")


def _es_number(f):
    """ECMAScript Number.prototype.toString for a finite double."""
    if f == 0:
        return "0"
    if f < 0:
        return "-" + _es_number(-f)
    r = repr(f)  # shortest round-trip digits
    m = re.match(r"^(\d+)(?:\.(\d+))?(?:e([+-]\d+))?$", r)
    intpart, frac, exp = m.group(1), m.group(2) or "", int(m.group(3) or 0)
    digits = (intpart + frac).lstrip("0")
    lead_zeros = len(intpart + frac) - len((intpart + frac).lstrip("0"))
    n = len(intpart) + exp - lead_zeros  # value = 0.digits × 10^n
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    mant = digits[0] + ("." + digits[1:] if k > 1 else "")
    return mant + "e" + ("+" if e >= 0 else "-") + str(abs(e))


# ---------------------------------------------------------------- DSSE

def pae(ptype, payload):
    t = ptype.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def envelope(env, what):
    """Shape of a DSSE envelope (Q3: no fields beyond the documented ones); returns
    (payloadType, payload bytes, keyid, sig bytes). Tally writes exactly one signature."""
    exact_keys(env, ["payloadType", "payload", "signatures"], what=what)
    need(is_str(env["payloadType"]), f"{what}: payloadType is not a string")
    payload = b64(env["payload"], f"{what}.payload")
    sigs = env["signatures"]
    need(type(sigs) is list, f"{what}: signatures is not a list")
    need(len(sigs) == 1, f"{what}: {len(sigs)} signatures, exactly one is accepted")
    exact_keys(sigs[0], ["keyid", "sig"], what=f"{what}.signatures[0]")
    need(is_str(sigs[0]["keyid"]), f"{what}: keyid is not a string")
    sig = b64(sigs[0]["sig"], f"{what}.signatures[0].sig")
    return env["payloadType"], payload, sigs[0]["keyid"], sig


def verify_sig(cert, ptype, payload, sig, what):
    key = cert.public_key()
    msg = pae(ptype, payload)
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            if isinstance(key.curve, ec.SECP256R1):
                key.verify(sig, msg, ec.ECDSA(hashes.SHA256()))
            elif isinstance(key.curve, ec.SECP384R1):
                key.verify(sig, msg, ec.ECDSA(hashes.SHA384()))
            else:
                raise Fail(f"{what}: unsupported curve {key.curve.name}")
        elif isinstance(key, ed25519.Ed25519PublicKey):
            need(len(sig) == 64, f"{what}: an Ed25519 signature is 64 bytes, got {len(sig)}")
            key.verify(sig, msg)
        elif isinstance(key, rsa.RSAPublicKey):
            need(2048 <= key.key_size <= 8192, f"{what}: RSA key of {key.key_size} bits")
            need(len(sig) == (key.key_size + 7) // 8, f"{what}: RSA signature is not the modulus length")
            key.verify(sig, msg, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32), hashes.SHA256())
        else:
            raise Fail(f"{what}: unsupported key type {type(key).__name__}")
    except InvalidSignature:
        raise Fail(f"{what}: signature does not verify")
    except ValueError as e:
        raise Fail(f"{what}: signature does not verify ({e})")


# ---------------------------------------------------------------- the checks

class State:
    pass


def check_bundle_format(st):
    try:
        raw = open(st.bundle_path, "rb").read()
    except OSError as e:
        raise Usage(f"cannot read {st.bundle_path}: {e}")
    b = parse_json(raw, "bundle")
    need(is_obj(b), "the bundle is not a JSON object")
    exact_keys(b, BUNDLE_FIELDS, what="bundle")
    need(b["format"] == FORMAT, f"format is {b['format']!r}, not {FORMAT!r}")
    st.result_bytes = b64(b["result"], "result")
    need(is_obj(b["statement"]), "statement is not an object")
    need(is_obj(b["checkpoint"]), "checkpoint is not an object")
    need(type(b["agent_results"]) is list, "agent_results is not a list")
    need(all(is_obj(e) for e in b["agent_results"]), "agent_results: an entry is not an object")
    need(type(b["events"]) is list, "events is not a list")
    st.lines = [b64(e, f"events[{i}]") for i, e in enumerate(b["events"])]
    need(type(b["certificates"]) is list, "certificates is not a list")
    for i, c in enumerate(b["certificates"]):
        exact_keys(c, ["name", "role", "pem"], what=f"certificates[{i}]")
        need(all(is_str(c[k]) for k in ("name", "role", "pem")), f"certificates[{i}]: a field is not a string")
    st.b = b
    return f"{FORMAT}, {len(st.lines)} events, {len(b['agent_results'])} agent results, {len(b['certificates'])} certificates"


def check_checkpoint_time(st):
    ptype, payload, keyid, sig = envelope(st.b["checkpoint"], "checkpoint")
    st.cp_env = (ptype, payload, keyid, sig)
    cp = parse_json(payload, "checkpoint payload")
    exact_keys(cp, ["seq", "head", "time"], what="checkpoint payload")
    st.cp = cp
    st.cp_ns = time_ns(cp["time"], "checkpoint time", fraction=False)
    st.cp_dt = ns_to_dt(st.cp_ns)
    return cp["time"]


def _eku(cert):
    try:
        return set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None


def _valid_at(cert, t):
    return cert.not_valid_before_utc <= t <= cert.not_valid_after_utc


def _is_ca(cert):
    try:
        return cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        return False


def _issued_by(child, issuer):
    try:
        child.verify_directly_issued_by(issuer)
        return True
    except (ValueError, TypeError, InvalidSignature):
        return False


CRITICAL_OK = {x509.BasicConstraints.oid, x509.KeyUsage.oid, x509.ExtendedKeyUsage.oid,
               x509.SubjectAlternativeName.oid, x509.NameConstraints.oid, x509.CRLDistributionPoints.oid}


def _name_der(name):
    try:
        return name.public_bytes()
    except Exception:  # noqa: BLE001 - an undecodable name matches nothing
        return None


def _same_name(child, issuer_cert):
    """The child's issuer name equals the issuer's subject, byte for byte (DER)."""
    try:
        a, b_ = _name_der(child.issuer), _name_der(issuer_cert.subject)
    except Exception:  # noqa: BLE001 - an undecodable name matches nothing
        return False
    return a is not None and a == b_


def _cert_sig_ok(cert):
    """A certificate signed by one of the four algorithms of the signature table
    (an RSA issuer signs with RSASSA-PSS)."""
    try:
        dotted = cert.signature_algorithm_oid.dotted_string
    except Exception:  # noqa: BLE001
        return False
    return dotted in ("1.2.840.10045.4.3.2", "1.2.840.10045.4.3.3", "1.3.101.112", "1.2.840.113549.1.1.10")


def _critical_ok(cert, what):
    for ext in cert.extensions:
        need(not ext.critical or ext.oid in CRITICAL_OK, f"{what}: an unknown critical extension {ext.oid.dotted_string}")


def _chain_to_ca(leaf, inters, cas, t, what, role_eku):
    """evidence.md check 3's path rules: the leaf, then the entry's other certificates in
    any order (at most 6), to a certificate signed by a CA of --ca (a trust anchor: its
    validity is not checked); issuers matched by name; intermediates CA with pathLen
    honoured and, carrying an EKU, listing the role's usage; every path certificate valid
    at t; signatures by the table's algorithms."""
    need(not _is_ca(leaf), f"{what}: the leaf is a CA certificate")
    _critical_ok(leaf, what)

    def walk(cur, used, below):
        need(_cert_sig_ok(cur), f"{what}: a certificate of the path is signed by an algorithm outside the table")
        for ca in cas:
            if _same_name(cur, ca) and _issued_by(cur, ca):
                return True
        if len(used) >= 6:
            return False
        for i, it in enumerate(inters):
            if i in used or not _same_name(cur, it) or not _issued_by(cur, it):
                continue
            if it.version != x509.Version.v3 or not _is_ca(it) or not _valid_at(it, t):
                continue
            bc = it.extensions.get_extension_for_class(x509.BasicConstraints).value
            if bc.path_length is not None and bc.path_length < below:
                continue
            eku = _eku(it)
            if eku is not None and role_eku not in eku:
                continue
            try:
                _critical_ok(it, what)
            except Fail:
                continue
            if walk(it, used | {i}, below + 1):
                return True
        return False

    need(walk(leaf, frozenset(), 0), f"{what}: does not chain to a CA of --ca (through valid CA intermediates of its role)")


def check_certificates(st):
    """Returns a list of (name, detail) lines: one per certificate."""
    st.certs = {}  # (name, role) -> leaf certificate
    out = []
    for i, c in enumerate(st.b["certificates"]):
        what = f"certificates[{i}]"
        need(c["role"] in ("coordinator", "agent"), f"{what}: role {c['role']!r} is neither coordinator nor agent")
        need((c["name"], c["role"]) not in st.certs, f"{what}: a second {c['role']} certificate named {c['name']!r}")
        try:
            chain = x509.load_pem_x509_certificates(c["pem"].encode("ascii"))
        except (ValueError, UnicodeEncodeError) as e:
            raise Fail(f"{what}: unreadable PEM ({e})")
        need(chain, f"{what}: no certificate")
        leaf = chain[0]
        need(_valid_at(leaf, st.cp_dt), f"{what}: not valid at the checkpoint time {st.cp['time']} "
             f"(valid {leaf.not_valid_before_utc:%Y-%m-%dT%H:%M:%SZ} to {leaf.not_valid_after_utc:%Y-%m-%dT%H:%M:%SZ})")
        role_eku = ExtendedKeyUsageOID.SERVER_AUTH if c["role"] == "agent" else ExtendedKeyUsageOID.CLIENT_AUTH
        _chain_to_ca(leaf, chain[1:], st.cas, st.cp_dt, what, role_eku)
        try:
            dns = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        except x509.ExtensionNotFound:
            dns = []
        need(c["name"] in dns, f"{what}: not valid for {c['name']!r} (DNS names {dns})")  # Q6: exact match
        eku = _eku(leaf)
        need(eku is not None, f"{what}: no extended key usage")
        need(ANY_EKU not in eku, f"{what}: carries anyExtendedKeyUsage")
        sa, ca_ = ExtendedKeyUsageOID.SERVER_AUTH in eku, ExtendedKeyUsageOID.CLIENT_AUTH in eku
        if c["role"] == "agent":
            need(sa and not ca_, f"{what}: an agent's certificate needs ServerAuth and not ClientAuth")
        else:
            need(ca_ and not sa, f"{what}: a coordinator's certificate needs ClientAuth and not ServerAuth")
        st.certs[(c["name"], c["role"])] = leaf
        out.append((what, f"{c['role']} {c['name']}"))
    need(st.certs, "certificates: none")
    return out


def check_statement_signature(st):
    ptype, payload, keyid, sig = envelope(st.b["statement"], "statement")
    need(ptype == T_STATEMENT, f"payloadType {ptype!r}, not {T_STATEMENT!r}")
    cert = st.certs.get((keyid, "coordinator"))
    need(cert is not None, f"keyid {keyid!r} names no coordinator certificate of the bundle")
    verify_sig(cert, ptype, payload, sig, "statement")
    st.st_payload = payload
    return f"by {keyid}"


def check_statement(st):
    s = parse_json(st.st_payload, "statement payload")
    exact_keys(s, ["_type", "subject", "predicateType", "predicate"], what="statement")
    need(s["_type"] == STATEMENT_TYPE, f"_type is {s['_type']!r}")
    need(s["predicateType"] == PREDICATE_TYPE, f"predicateType is {s['predicateType']!r}")
    p = s["predicate"]
    # Q7: every field of the list is required but `fidelity` and `agents` (a statement
    # without `agents` is refused at check 11 or 13, as docs/evidence.md says); nothing
    # else is accepted.
    exact_keys(p, [f for f in PREDICATE_FIELDS if f not in ("fidelity", "agents")], ["fidelity", "agents"],
               what="predicate")
    if "fidelity" in p:
        need(is_obj(p["fidelity"]), "the predicate's fidelity is null (absent, or an object)")
        need(p["fidelity"].get("columns", None) != [], "the predicate's fidelity lists an empty columns member")
    need(is_str(p["run_id"]) and RE_RUN_ID.match(p["run_id"]), f"predicate run_id {p['run_id']!r} is not 1 to 128 of A-Z a-z 0-9 . _ -")
    st.started_ns = time_ns(p["started"], "predicate started", fraction=True)
    time_ns(p["finished"], "predicate finished", fraction=False)
    hex64(p["spec_sha256"], "predicate spec_sha256")
    hex64(p["events_head"], "predicate events_head")
    need(p["verdict"] in ("match", "differ", "error"), f"predicate verdict {p['verdict']!r}")
    need(is_int(p["leaves"]) and p["leaves"] >= 0, "predicate leaves is not a count")
    need(is_int(p["canonical_form_version"]), "predicate canonical_form_version is not an integer")
    need(type(s["subject"]) is list and len(s["subject"]) == 1, "not exactly one subject")
    subj = s["subject"][0]
    exact_keys(subj, ["name", "digest"], what="subject")
    need(subj["name"] == "tally-run:" + p["run_id"], f"subject {subj['name']!r} is not tally-run:{p['run_id']}")
    exact_keys(subj["digest"], ["sha256"], what="subject digest")
    hex64(subj["digest"]["sha256"], "subject digest sha256")
    st.s, st.p = s, p
    return f"run {p['run_id']}, verdict {p['verdict']}"


def check_result_digest(st):
    got = sha256_hex(st.result_bytes)
    want = st.s["subject"][0]["digest"]["sha256"]
    need(got == want, f"result SHA-256 {got} is not the subject's {want}")
    return got


def check_result(st):
    r = parse_json(st.result_bytes, "result")
    need(is_obj(r), "result is not an object")
    p = st.p
    for f in ("verdict", "hash_method", "level", "difference_counts"):
        # Q23: a result without difference_counts (a measures run) is the predicate's null
        need(f in r or f == "difference_counts", f"result has no {f}")
        v = r.get(f)
        need(v == p[f] and type(v) is type(p[f]), f"result {f} {v!r} is not the predicate's {p[f]!r}")
    need(("fidelity" in r) == ("fidelity" in p), "fidelity is in one of result and predicate only")
    if "fidelity" in p:
        need(r["fidelity"] == p["fidelity"], f"result fidelity {r['fidelity']!r} is not the predicate's {p['fidelity']!r}")
        fid = p["fidelity"]
        need(is_obj(fid) and fid.get("level") in ("full", "reduced"), f"fidelity {fid!r} is neither full nor reduced")
        cols = fid.get("columns")
        listed = type(cols) is list and len(cols) > 0
        need((fid["level"] == "reduced") == listed, f"fidelity {fid['level']} {'lists' if listed else 'lists no'} column")
        if fid["level"] == "full":
            need(set(fid) == {"level"} or cols == [], f"full fidelity with other fields: {fid!r}")
    need("false_match_bound" in r, "result has no false_match_bound")
    a, b_ = r["false_match_bound"], p["false_match_bound"]
    num = (int, float)
    need(type(a) in num and type(b_) in num and float(a) == float(b_),
         f"result false_match_bound {a!r} is not the predicate's {b_!r}")
    need(type(r.get("leaves")) is list, "result leaves is not a list")
    need(len(r["leaves"]) == p["leaves"], f"result has {len(r['leaves'])} leaves, the predicate {p['leaves']}")
    st.r = r
    return f"{r['verdict']}, {len(r['leaves'])} leaves"


def check_event_chain(st):
    need(st.lines, "no event lines")
    prev = ZERO64
    st.events = []
    for i, line in enumerate(st.lines):
        n = i + 1
        need(line.strip() != b"", f"line {n} is blank")
        need(b"\n" not in line and b"\r" not in line, f"line {n} holds a line break")  # Q9
        e = parse_json(line, f"line {n}")
        need(is_obj(e), f"line {n} is not an object")
        need(is_int(e.get("seq")) and e["seq"] == n, f"line {n}: seq is {e.get('seq')!r}, not {n}")
        need(e.get("prev") == prev, f"line {n}: prev does not link to line {n - 1}")
        need(e.get("run") == st.p["run_id"], f"line {n}: run {e.get('run')!r} is not {st.p['run_id']!r}")
        prev = sha256_hex(line)
        st.events.append(e)
    need(prev == st.p["events_head"], f"the last line's hash {prev} is not events_head {st.p['events_head']}")
    return f"{len(st.lines)} lines, head {prev[:16]}…"


def check_checkpoint(st):
    ptype, payload, keyid, sig = st.cp_env
    need(ptype == T_CHECKPOINT, f"payloadType {ptype!r}, not {T_CHECKPOINT!r}")
    cert = st.certs.get((keyid, "coordinator"))
    need(cert is not None, f"keyid {keyid!r} names no coordinator certificate of the bundle")
    verify_sig(cert, ptype, payload, sig, "checkpoint")
    need(is_int(st.cp["seq"]) and st.cp["seq"] == len(st.lines), f"checkpoint seq {st.cp['seq']!r}, the bundle has {len(st.lines)} lines")
    need(st.cp["head"] == st.p["events_head"], f"checkpoint head {st.cp['head']!r} is not events_head")
    return f"seq {st.cp['seq']} by {keyid}"


def check_spec(st):
    started = [e for e in st.events if e.get("event") == "started"]
    need(len(started) == 1, f"{len(started)} started events, exactly one is required")
    ev = started[0]
    need("spec" in ev, "the started event has no spec")
    need(is_obj(ev["spec"]), "the started event's spec is not an object")
    got = sha256_hex(jcs(ev["spec"]))
    need(got == st.p["spec_sha256"], f"spec hashes to {got}, the predicate says {st.p['spec_sha256']}")
    time_ns(ev.get("started"), "started event time", fraction=True)
    need(ev["started"] == st.p["started"], f"started {ev['started']!r} is not the predicate's {st.p['started']!r}")
    st.spec = ev["spec"]
    st.mode = st.spec.get("mode", "checksum")
    described = [e for e in st.events if e.get("event") == "described"]
    st.described = described[0] if described else None  # Q16: the first (docs/evidence.md check 17)
    return f"{st.spec.get('name')!r}, sha256 {got[:16]}…"


ANSWER_EVENTS = {"aggregated": "Aggregate", "rechecked": "Aggregate", "digests": "RowDigests", "measured": "Measures"}


def _event_envelope(e):
    """The envelope an answer event carries (None when it carries none)."""
    if e["event"] == "digests":
        return e.get("envelope")
    resp = e.get("response")
    return resp.get("envelope") if is_obj(resp) else None


def _payload_shape(pl, what):
    base = ["run_id", "agent", "dataset", "rpc", "request_sha256", "scope", "release_log_head", "time"]
    need(is_obj(pl), f"{what}: payload is not an object")
    rpc = pl.get("rpc")
    body = {"Aggregate": "buckets", "RowDigests": "digests_sha256", "Measures": "groups_sha256"}.get(rpc)
    need(body is not None, f"{what}: rpc {rpc!r}")
    exact_keys(pl, base + [body], what=f"{what} payload")  # Q3
    sc = pl["scope"]
    need(is_obj(sc), f"{what}: scope is not an object")
    need("side" in sc, f"{what}: the agent did not sign which side it answered as")
    opt = ["window"] + (["group_by", "measures"] if rpc == "Measures" else [])
    exact_keys(sc, ["side", "method", "columns", "key_len", "whole", "seal"], opt, what=f"{what} scope")
    if rpc == "Measures":
        need("group_by" in sc and "measures" in sc, f"{what}: a Measures scope names no group_by or measures")
    need(is_str(sc["method"]), f"{what}: scope method is not a string")
    need(type(sc["columns"]) is list and all(is_str(c) for c in sc["columns"]), f"{what}: scope columns is not a list of names")
    need(type(sc["whole"]) is bool, f"{what}: scope whole is not a boolean")
    return rpc, body


def check_agent_results(st):
    """Check 11; returns one (name, detail) per answer event."""
    p = st.p
    listed = st.b["agent_results"]
    out = []
    st.answers = []  # dicts: event, payload, side
    seen_payloads = {}
    per_side = {}
    n = 0
    for ei, e in enumerate(st.events):
        kind = e.get("event")
        if kind not in ANSWER_EVENTS:
            # evidence.md: a verifier ignores the events it does not read, whatever they hold
            continue
        what = f"agent_results[{n}]"
        env_ev = _event_envelope(e)
        need(env_ev is not None, f"{what}: the {kind} event (line {ei + 1}) carries no envelope")
        need(n < len(listed), f"{what}: the {kind} event (line {ei + 1}) has no listed envelope")
        env = listed[n]
        ptype, payload, keyid, sig = envelope(env, what)
        need(ptype == T_AGENT, f"{what}: payloadType {ptype!r}, not {T_AGENT!r}")
        cert = st.certs.get((keyid, "agent"))
        need(cert is not None, f"{what}: keyid {keyid!r} names no agent certificate of the bundle")
        verify_sig(cert, ptype, payload, sig, what)
        pl = parse_json(payload, f"{what} payload")
        rpc, body = _payload_shape(pl, what)
        need(pl["agent"] == keyid, f"{what}: payload agent {pl['agent']!r} is not the keyid {keyid!r}")
        need(pl["run_id"] == p["run_id"], f"{what}: run_id {pl['run_id']!r} is not the run's {p['run_id']!r}")
        need(is_str(pl["dataset"]), f"{what}: dataset is not a string")
        hex64(pl["request_sha256"], f"{what}: request_sha256")
        hex64(pl["release_log_head"], f"{what}: release_log_head")
        if body != "buckets":
            hex64(pl[body], f"{what}: {body}")
        sc = pl["scope"]
        need(is_int(sc["key_len"]) and 1 <= sc["key_len"] <= len(sc["columns"]),
             f"{what}: key_len {sc['key_len']!r} is not between 1 and {len(sc['columns'])}")
        sealed = sc["method"].startswith("sealed_")
        need((sc["seal"] is not None) == sealed, f"{what}: method {sc['method']} with{'out' if sealed else ''} a seal")
        if sealed:
            exact_keys(sc["seal"], ["peer", "peer_dataset", "nonce"], what=f"{what} seal")
        t = time_ns(pl["time"], f"{what}: time", fraction=False)
        need(st.started_ns - SKEW_NS <= t <= st.cp_ns + SKEW_NS,
             f"{what}: signed at {pl['time']}, outside the run ({p['started']} − 5 min to {st.cp['time']} + 5 min)")
        need(env_ev == env, f"{what}: is not the envelope the {kind} event (line {ei + 1}) holds")  # Q11
        need(payload not in seen_payloads, f"{what}: its payload is also listed as agent_results[{seen_payloads.get(payload)}]")
        seen_payloads[payload] = n
        need(rpc == ANSWER_EVENTS[kind], f"{what}: a {rpc} answer in a {kind} event")
        if kind == "digests":
            d = e.get("digests")
            need(is_str(d) and re.fullmatch(r"(?:[0-9a-f]{32})*", d), f"{what}: the event's digests are not 32-hex-digit pairs")
            need(sha256_hex(bytes.fromhex(d)) == pl["digests_sha256"], f"{what}: the event's digests do not hash to digests_sha256")
        elif kind == "measured":
            _check_groups(e, pl, what)
        else:
            _check_buckets(e, pl, what)
        _check_request(e, pl, what)
        _check_request_columns(st, e, pl, what)
        side = e.get("side")
        need(side in ("source", "target"), f"{what}: event side {side!r} is neither source nor target")
        need(sc["side"] == side, f"{what}: the agent signed side {sc['side']!r}, the event says {side!r}")
        need("agents" in p, f"{what}: the statement has no agents")
        ag = p["agents"]
        need(is_obj(ag) and is_obj(ag.get(side)), f"{what}: the statement's agents names no {side} agent")
        need(ag[side].get("agent") == pl["agent"] and ag[side].get("dataset") == pl["dataset"],
             f"{what}: signed by {pl['agent']}/{pl['dataset']}, the statement's {side} is {ag[side].get('agent')}/{ag[side].get('dataset')}")
        need(sc["method"] == p["hash_method"], f"{what}: method {sc['method']} is not the predicate's {p['hash_method']}")
        ident = (pl["agent"], pl["dataset"], sc["method"], json.dumps(sc["seal"], sort_keys=True))
        first = per_side.setdefault(side, ident)
        need(first == ident, f"{what}: the {side} answers differ in agent, dataset, method or seal")
        st.answers.append({"event": e, "payload": pl, "side": side, "kind": kind})
        out.append((what, f"{kind} {side} by {keyid} ({rpc}, line {ei + 1})"))
        n += 1
    st.n_carrying = n
    return out


SEG_BOUNDS = ("lower", "upper", "hash_lo", "hash_hi", "period")


def _check_request_columns(st, e, pl, what):
    """evidence.md, "The requests": each column's form is the one the record resolves
    for that side (canonical-form.md, resolved scale): Aggregate and RowDigests ask
    exactly the resolved columns in order; Measures asks some of them."""
    want = resolved_columns(st.spec, st.described)
    need(want is not None, f"{what}: the record's descriptions do not resolve, so what the answer was asked cannot be checked")
    side = pl["scope"].get("side")
    need(side in ("source", "target"), f"{what}: the agent did not sign which side it answered as")
    cols = e["request"].get("columns")
    if pl["rpc"] == "Measures":
        by_name = {_ci(c["name"]): c for c in want[side]}
        for c in cols:
            need(by_name.get(_ci(c.get("name"))) == c,
                 f"{what}: the request asks column {c!r}, the record resolves it as {by_name.get(_ci(c.get('name')))!r}")
    else:
        need(cols == want[side], f"{what}: the request asks the columns {cols!r}, the record resolves them as {want[side]!r}")


def resolved_columns(spec, described):
    """Each side's compared columns as requests write them, {"source": [...], "target":
    [...]}, each {"name", "class", "scale", "exact", "fixed"}; None when the record does
    not resolve (canonical-form.md: resolved scale, the rules across classes)."""
    if not is_obj(described) or not is_obj(spec):
        return None
    s, t = described.get("source"), described.get("target")
    if not (is_obj(s) and is_obj(t)):
        return None
    scols = {_ci(c.get("name")): c for c in s.get("columns") or [] if is_obj(c)}
    tcols = {_ci(c.get("name")): c for c in t.get("columns") or [] if is_obj(c)}
    key = list(spec.get("key") or s.get("key") or [])
    listed = list(spec.get("columns") or [])
    if spec.get("mode") == "measures" and not listed:
        # a measures run resolves its group_by and measure columns only
        for g in spec.get("group_by") or []:
            c = g if is_str(g) else (g.get("column") if is_obj(g) else None)
            c = c.split(":")[0] if is_str(c) else c
            if c and all(_ci(c) != _ci(x) for x in listed):
                listed.append(c)
        for m in spec.get("measures") or []:
            if all(_ci(m) != _ci(x) for x in listed):
                listed.append(m)
        listed = [c for c in listed if all(_ci(c) != _ci(k) for k in key)]
    if listed:
        names = listed
    else:
        excl = {_ci(x) for x in spec.get("exclude") or []}
        keys = {_ci(k) for k in key}
        names = [c.get("name") for c in s.get("columns") or []
                 if _ci(c.get("name")) not in keys and _ci(c.get("name")) not in excl and _ci(c.get("name")) in tcols]
    overrides = {_ci(k): v for k, v in (spec.get("overrides") or {}).items()}
    out = {"source": [], "target": []}
    for name in key + names:
        a, b_ = scols.get(_ci(name)), tcols.get(_ci(name))
        if a is None or b_ is None:
            return None
        f = _resolved_format(a, b_, overrides.get(_ci(name)) or {})
        if f is None:
            return None
        for side, c in (("source", a), ("target", b_)):
            out[side].append({"name": c.get("name"), **f})
    return out


def _resolved_format(a, b_, ov):
    """canonical-form.md: the class both sides are compared in, its scale (a decimal's
    larger declared scale, exact where one is undeclared; floats at 6; a time's larger
    precision, undeclared counting as 6; overrides first), and padding."""
    ca, cb = a.get("class"), b_.get("class")
    pair = {ca, cb}
    fixed = bool(a.get("fixed_char")) or bool(b_.get("fixed_char"))
    if ca == cb:
        cls = ca
    elif pair == {"boolean", "integer"}:
        cls = "boolean"
    elif pair == {"integer", "decimal"}:
        cls = "decimal"
    elif pair == {"json", "text"}:
        cls, fixed = "json", False
    elif pair == {"timestamp", "timestamptz"}:
        cls = "timestamptz"
    elif pair == {"decimal", "float"}:
        cls = "decimal"
    elif pair == {"text", "binary"}:
        cls = "binary"
        fixed = bool((b_ if cb == "binary" else a).get("fixed_char"))
    else:
        return None
    exact, scale = False, 0
    if cls == "decimal":
        def declared(c, k):
            return 0 if k == "integer" else (c.get("scale") if k == "decimal" else "none")
        scales = [declared(a, ca), declared(b_, cb)]
        if "scale" in ov:
            scale = ov["scale"]
        elif any(x is None for x in scales):
            exact = True
        else:
            scale = max([x for x in scales if x != "none"] or [0])
    elif cls == "float":
        scale = ov.get("scale", 6)
    elif cls in ("timestamp", "timestamptz", "time"):
        if "precision" in ov:
            scale = ov["precision"]
        else:
            pa = 6 if a.get("scale") is None else a["scale"]
            pb = 6 if b_.get("scale") is None else b_["scale"]
            scale = max(pa, pb)
    return {"class": cls, "scale": scale, "exact": exact, "fixed": fixed}


def _check_request(e, pl, what):
    """evidence.md, "The requests": the recorded request hashes (RFC 8785) to
    request_sha256 and asks what the payload signs."""
    req = e.get("request")
    need(req is not None, f"{what}: the event records no request: what the agent was asked cannot be checked")
    need(is_obj(req), f"{what}: the event's request is not an object")
    got = sha256_hex(jcs(req))
    need(got == pl["request_sha256"], f"{what}: the event's request hashes to {got}, the agent signed {pl['request_sha256']}")
    sc = pl["scope"]
    for f, want in (("rpc", pl["rpc"]), ("run_id", pl["run_id"]), ("dataset", pl["dataset"]), ("side", sc["side"]),
                    ("method", sc["method"]), ("key_len", sc["key_len"])):
        need(req.get(f) == want and type(req.get(f)) is type(want), f"{what}: the request's {f} is {req.get(f)!r}, the agent signed {want!r}")
    cols = req.get("columns")
    need(type(cols) is list and all(is_obj(c) for c in cols), f"{what}: the request's columns are not a list of objects")
    need([c.get("name") for c in cols] == sc["columns"], f"{what}: the request's columns are not the signed scope's")
    rs = req.get("seal")
    if sc["seal"] is None:
        need(rs is None, f"{what}: the request is sealed, the signed scope is not")
    else:
        need(is_obj(rs) and all(rs.get(k) == sc["seal"][k] for k in ("peer", "peer_dataset", "nonce")),
             f"{what}: the request's seal is not the signed scope's")
    win = sc.get("window")
    rpc = pl["rpc"]
    if rpc == "Aggregate":
        segs = req.get("segments")
        need(type(segs) is list and segs and all(is_obj(x) and is_obj(x.get("segment")) for x in segs), f"{what}: the request has no segments")
        for x in segs:
            need(x["segment"].get("window") == win, f"{what}: a request segment's window {x['segment'].get('window')!r} is not the signed {win!r}")
        whole = len(segs) == 1 and all(segs[0]["segment"].get(k) is None for k in SEG_BOUNDS)
        for j, bk in enumerate(pl["buckets"]):
            need(is_int(bk.get("parent")) and bk["parent"] < len(segs), f"{what}: bucket {j} names parent {bk.get('parent')!r} of {len(segs)} segments")
    elif rpc == "RowDigests":
        seg = req.get("segment")
        need(is_obj(seg), f"{what}: the request has no segment")
        need(seg.get("window") == win, f"{what}: the request segment's window {seg.get('window')!r} is not the signed {win!r}")
        whole = all(seg.get(k) is None for k in SEG_BOUNDS)
    else:
        need(req.get("window") == win, f"{what}: the request's window {req.get('window')!r} is not the signed {win!r}")
        need(type(req.get("parents")) is list, f"{what}: the request has no parents")
        whole = req["parents"] == []
        gb = req.get("group_by")
        need(type(gb) is list and all(is_obj(g) for g in gb), f"{what}: the request's group_by is not a list")
        want_gb = [g.get("column") + (":" + g["granularity"] if g.get("granularity") else "") for g in gb]
        need(sc.get("group_by") == want_gb, f"{what}: the signed group_by {sc.get('group_by')!r} is not the request's {want_gb!r}")
        need(sc.get("measures") == req.get("measures"), f"{what}: the signed measures are not the request's")
    need(sc["whole"] == whole, f"{what}: the scope signs whole={sc['whole']}, the request {'is' if whole else 'is not'} the whole dataset")


def _carries_envelope(e):
    return "envelope" in e or (is_obj(e.get("response")) and "envelope" in e["response"])


def _check_buckets(e, pl, what):
    resp = e.get("response")
    need(is_obj(resp), f"{what}: the event has no response")
    eb, pb = resp.get("buckets"), pl["buckets"]
    need(type(eb) is list and type(pb) is list, f"{what}: buckets are not lists")
    need(len(eb) == len(pb), f"{what}: the event has {len(eb)} buckets, the payload {len(pb)}")
    for j, (x, y) in enumerate(zip(eb, pb)):
        exact_keys(y, ["parent", "child", "count", "sum", "xor"], what=f"{what} payload bucket {j}")
        need(is_obj(x), f"{what}: event bucket {j} is not an object")
        for f in ("parent", "child", "count"):
            need(is_int(y[f]) and y[f] >= 0, f"{what}: payload bucket {j} {f} is not a count")
            need(is_int(x.get(f)) and x[f] == y[f], f"{what}: bucket {j} {f}: event {x.get(f)!r}, payload {y[f]!r}")
        s = hex16(y["sum"], f"{what}: payload bucket {j} sum")
        need(is_int(x.get("sum")) and x["sum"] == s, f"{what}: bucket {j} sum: event {x.get('sum')!r}, payload {y['sum']}")
        if y["xor"] is None:
            need(x.get("xor") is None, f"{what}: bucket {j} xor: event {x.get('xor')!r}, payload null")
        else:
            xr = hex16(y["xor"], f"{what}: payload bucket {j} xor")
            need(is_int(x.get("xor")) and x["xor"] == xr, f"{what}: bucket {j} xor: event {x.get('xor')!r}, payload {y['xor']}")
    need(resp.get("release_log_head") == pl["release_log_head"], f"{what}: the event's release_log_head is not the payload's")


CLEAR_ORDER = ["non_null", "sum", "min", "max", "nan", "pos_inf", "neg_inf"]


def _groups_doc_order(groups, what):
    """The groups re-written compact in the field order evidence.md shows:
    `{"labels", "count", "measures": [{"clear"?: {non_null, sum, min, max, nan, pos_inf,
    neg_inf}, "digest"}]}` (Q12); fields outside it are refused."""
    out = []
    for j, g in enumerate(groups):
        exact_keys(g, ["labels", "count", "measures"], what=f"{what} group {j}")
        need(type(g["measures"]) is list, f"{what}: group {j} measures is not a list")
        ms = []
        for k, m in enumerate(g["measures"]):
            exact_keys(m, ["digest"], ["clear"], what=f"{what} group {j} measure {k}")
            mo = {}
            if "clear" in m:
                c = m["clear"]
                need(is_obj(c) and set(c) <= set(CLEAR_ORDER), f"{what}: group {j} measure {k} clear has unknown fields")
                # sum/min/max only when not null, nan/pos_inf/neg_inf only when not 0
                mo["clear"] = {f: c[f] for f in CLEAR_ORDER if f in c and c[f] is not None
                               and not (f in ("nan", "pos_inf", "neg_inf") and c[f] == 0)}
            mo["digest"] = m["digest"]
            ms.append(mo)
        out.append({"labels": g["labels"], "count": g["count"], "measures": ms})
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _check_groups(e, pl, what):
    resp = e.get("response")
    need(is_obj(resp) and type(resp.get("groups")) is list, f"{what}: the event has no groups")
    # Q12: "the SHA-256 of the `groups` JSON as above": compact, in the doc's field order.
    need(sha256_hex(_groups_doc_order(resp["groups"], what)) == pl["groups_sha256"],
         f"{what}: the event's groups do not hash to groups_sha256")
    need(resp.get("release_log_head") == pl["release_log_head"], f"{what}: the event's release_log_head is not the payload's")


def check_agent_results_count(st):
    k = len(st.b["agent_results"])
    need(k == st.n_carrying, f"{k} listed envelopes, {st.n_carrying} events carry one")
    return f"{k} envelopes"


def check_sides(st):
    p = st.p
    need("agents" in p and is_obj(p["agents"]), "the statement has no agents")
    ag = p["agents"]
    exact_keys(ag, ["source", "target"], what="predicate agents")
    answered = {a["side"] for a in st.answers}
    first = {}
    for a in st.answers:
        first.setdefault(a["side"], a["payload"])
    for side in ("source", "target"):
        if ag[side] is None:
            need(side not in answered, f"the statement names no {side} agent although the {side} answered")
        else:
            exact_keys(ag[side], ["agent", "dataset"], what=f"agents.{side}")
            need(side in answered, f"the statement names a {side} agent, but the {side} has no answer in the record")
    if p["verdict"] != "error":
        need(answered == {"source", "target"}, f"verdict {p['verdict']} but only {sorted(answered)} answered")
    for side in answered:
        want = (st.spec.get(side) or {}).get("dataset")
        need(first[side]["dataset"] == want, f"the {side} signed dataset {first[side]['dataset']!r}, the spec's is {want!r}")
    if answered == {"source", "target"}:
        s, t = first["source"], first["target"]
        need((s["agent"], s["dataset"]) != (t["agent"], t["dataset"]), "both sides are the same (agent, dataset)")
        ss, ts = s["scope"]["seal"], t["scope"]["seal"]
        if ss is None or ts is None:
            need(ss is None and ts is None, "one side is sealed, the other not")
            return "unsealed"
        need(ss["peer"] == t["agent"] and ss["peer_dataset"] == t["dataset"], "the source's seal does not name the target")
        need(ts["peer"] == s["agent"] and ts["peer_dataset"] == s["dataset"], "the target's seal does not name the source")
        need(ss["nonce"] == ts["nonce"], "the sides' seals have different nonces")
        return f"{s['agent']}/{s['dataset']} ↔ {t['agent']}/{t['dataset']}, sealed"
    return f"answered: {sorted(answered) or 'none'}"


def check_result_fields(st):
    r, spec = st.r, st.spec
    need(r.get("name") == spec.get("name"), f"result name {r.get('name')!r} is not the spec's {spec.get('name')!r}")
    for side in ("source", "target"):
        rs, ss = r.get(side), spec.get(side)
        need(is_obj(rs) and is_obj(ss), f"result or spec has no {side}")
        for f in ("agent", "dataset"):
            need(rs.get(f) == ss.get(f), f"result {side}.{f} {rs.get(f)!r} is not the spec's {ss.get(f)!r}")
    buckets = {"source": set(), "target": set()}
    for a in st.answers:
        if a["payload"]["rpc"] == "Aggregate":
            for bk in a["payload"]["buckets"]:
                buckets[a["side"]].add((bk["count"], bk["sum"], bk["xor"]))
    for i, leaf in enumerate(r["leaves"]):
        need(is_obj(leaf), f"leaves[{i}] is not an object")
        for side in ("source", "target"):
            v = leaf.get(side)
            need(is_obj(v), f"leaves[{i}].{side} is not an object")
            # Q13: count and checksum, xor where computed; other members are not read
            need("count" in v and "checksum" in v, f"leaves[{i}].{side} has no count or checksum")
            xor = v.get("xor")
            key = (v["count"], v["checksum"], xor)
            empty = v["count"] == 0 and v["checksum"] == "0" * 16 and xor in (None, "0" * 16) and is_int(v["count"])
            need(is_int(v["count"]) and key in buckets[side] or empty,
                 f"leaves[{i}].{side} ({v['count']}, {v['checksum']}, {xor}) is no bucket of a {side} Aggregate answer")
    return f"name {r.get('name')!r}, {len(r['leaves'])} leaves bound to signed buckets"


def _totals(answers):
    count, s, x = 0, 0, 0
    for a in answers:
        for bk in a["payload"]["buckets"]:
            count += bk["count"]
            s = (s + int(bk["sum"], 16)) % U64
            if x is not None and bk["xor"] is not None:
                x ^= int(bk["xor"], 16)
            else:
                x = None
    return count, "%016x" % s, None if x is None else "%016x" % x


def _measures_totals(answers, what):
    """Q15: count = sum of level-1 group counts; sum = first 8 bytes of SHA-256 over each
    group's row string (§2) of labels, count and measure digests, concatenated in order."""
    count, h = 0, hashlib.sha256()
    groups = []
    for a in answers:
        for g in a["event"]["response"]["groups"]:
            need(is_obj(g) and is_int(g.get("count")), f"{what}: a group has no count")
            count += g["count"]
            fields = list(g.get("labels") or []) + [str(g["count"])] + [m.get("digest") for m in g.get("measures") or []]
            h.update(row_string(fields))
            groups.append(g)
    return count, h.hexdigest()[:16], None, groups


def row_string(fields):
    out = []
    for f in fields:
        if f is None:
            out.append("~")
        else:
            f = f if is_str(f) else json.dumps(f)
            out.append(f"{len(f.encode('utf-8'))}:{f}")
    return "".join(out).encode("utf-8")


def check_level1_totals(st):
    p, r, spec = st.p, st.r, st.spec
    l1 = {"source": [], "target": []}
    l1kind = "measured" if st.mode == "measures" else "aggregated"
    for a in st.answers:  # Q15: "fail the check" - taken as this one
        rpc = a["payload"]["rpc"]
        if st.mode == "measures":
            need(rpc != "Aggregate", f"line {a['event']['seq']}: an Aggregate answer in a measures run")
        else:
            need(rpc != "Measures", f"line {a['event']['seq']}: a Measures answer in a {st.mode} run")
    for a in st.answers:
        if a["kind"] == l1kind and a["event"].get("level") == 1:
            l1[a["side"]].append(a)
    scopes = {}
    st.l1 = {}
    for side in ("source", "target"):
        need(len(l1[side]) <= 1, f"the {side} has {len(l1[side])} level-1 answers, at most one is allowed")
        pred = p[side]
        if not l1[side]:
            need(pred is None, f"the predicate's {side} totals are not null, but the {side} has no level-1 answer")
            continue
        a = l1[side][0]
        pl, sc = a["payload"], a["payload"]["scope"]
        need(sc["whole"] is True, f"the {side}'s level-1 answer is not signed as whole")
        scopes[side] = sc
        if st.mode == "measures":
            _check_measures_scope(sc, spec, side)
            count, s, x, groups = _measures_totals([a], side)
            st.l1[side] = groups
        else:
            count, s, x = _totals([a])
        need(pred is not None, f"the predicate's {side} totals are null, but the {side} has a level-1 answer")
        opt = ["window"]
        exact_keys(pred, ["agent", "dataset", "count", "sum", "xor"], opt, what=f"predicate {side}")
        need(pred["agent"] == pl["agent"] and pred["dataset"] == pl["dataset"], f"the predicate's {side} agent/dataset is not the signer's")
        need(pred["count"] == count and is_int(pred["count"]), f"the predicate's {side} count {pred['count']!r}, the signed answer's {count}")
        need(pred["sum"] == s, f"the predicate's {side} sum {pred['sum']!r}, the signed answer's {s}")
        need(pred["xor"] == x, f"the predicate's {side} xor {pred['xor']!r}, the signed answer's {x}")
        need(("window" in pred) == ("window" in sc) and pred.get("window") == sc.get("window"),
             f"the predicate's {side} window {pred.get('window')!r} is not the signed {sc.get('window')!r}")
        rc = (r.get(side) or {}).get("count")
        need(is_int(rc) and rc == count, f"the result's {side}.count {rc!r} is not the signed {count}")
        st.l1[side + "_totals"] = (count, s, x)
    if len(scopes) == 2:
        a, b_ = scopes["source"], scopes["target"]
        for f in ("method", "key_len"):
            need(a[f] == b_[f], f"the sides' level-1 {f} differ ({a[f]!r} / {b_[f]!r})")
        need(len(a["columns"]) == len(b_["columns"]), "the sides' level-1 answers have different numbers of columns")
        need(a.get("window") == b_.get("window"), f"the sides signed different windows ({a.get('window')!r} / {b_.get('window')!r})")
    signed = None
    for sc in scopes.values():
        signed = sc.get("window")
    rw = r.get("window")
    if signed is None:
        need(rw is None, f"the result has window {rw!r}, no agent signed one")
    else:
        need(is_obj(rw) and rw.get("column") == signed.get("column") and rw.get("upper") == signed.get("upper"),
             f"the result's window {rw!r} is not the signed {signed!r}")
    detail = _check_window_vs_spec(st, signed, scopes)
    parts = [f"{side} {st.l1[side + '_totals'][0]}" for side in ("source", "target") if side + "_totals" in st.l1]
    return ", ".join(parts or ["no level-1 answers"]) + (f"; {detail}" if detail else "")


def _check_measures_scope(sc, spec, side):
    gb = spec.get("group_by")
    need(type(gb) is list and gb, "a measures run's spec has no group_by")
    g0 = gb[0]
    if is_obj(g0):
        want = g0.get("column") + (":" + g0["granularity"] if g0.get("granularity") else "")
    else:
        want = g0
    got = sc.get("group_by")
    # Q15: the scope's group_by is documented as `column` or `column:granularity`.
    got1 = got[0] if type(got) is list and len(got) == 1 else got
    low = lambda v: json.dumps(v).lower()  # noqa: E731 - names compared ignoring ASCII case
    need(is_str(got1) and low(got1) == low(want), f"the {side}'s level-1 scope groups by {got!r}, the spec's first level is {want!r}")
    sm = [m.get("column") if is_obj(m) else m for m in spec.get("measures") or []]
    need(low(sc.get("measures")) == low(sm), f"the {side}'s level-1 scope measures {sc.get('measures')!r}, the spec's {sm!r}")


RE_LAG = re.compile(r"^(?:\d+[smhd])+$")
LAG_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}
CLASSES = ("integer", "date", "timestamp", "timestamptz")


def _lag_ms(lag):
    """evidence.md, Windows: groups of digits each followed by s, m, h or d; at most 36,500 days."""
    need(is_str(lag) and RE_LAG.match(lag), f"window lag {lag!r} is not a duration (90s, 5m, 1h30m, 2d)")
    secs = sum(int(n) * LAG_UNIT[u] for n, u in re.findall(r"(\d+)([smhd])", lag))
    need(secs <= 36500 * 86400, f"window lag {lag!r} is more than 36,500 days")
    return secs * 1000


def _column_class(st, column):
    if not st.described:
        return None
    src = st.described.get("source") or {}
    for c in src.get("columns") or []:
        if is_str(c.get("name")) and c["name"].lower() == column.lower():
            return c.get("class") if c.get("class") in CLASSES else None
    return None


def _civil(ns):
    secs, frac = divmod(ns, 10**9)
    return datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=secs), frac


def _as_of_form(v, cls):
    """The normal form of `as_of` in a column class, or None where that class refuses it."""
    text = str(v) if is_int(v) else v
    if not is_str(text):
        return None
    text = text.strip()
    if cls == "integer":
        if not re.fullmatch(r"[+-]?\d+", text):
            return None
        n = int(text)
        return str(n) if -2**63 <= n < 2**63 else None
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?)?(Z|z|[+-]\d{2}:\d{2})?", text)
    if not m or not _date_ok(int(m[1]), int(m[2]), int(m[3]), int(m[4] or 0), int(m[5] or 0), int(m[6] or 0)):
        return None
    if cls == "date":
        return f"{m[1]}-{m[2]}-{m[3]}" if m[4] is None and m[8] is None else None
    ns = calendar.timegm((int(m[1]), int(m[2]), int(m[3]), int(m[4] or 0), int(m[5] or 0), int(m[6] or 0), 0, 0, 0)) * 10**9
    ns += int((m[7] or "").ljust(9, "0") or 0)
    off = m[8]
    if cls == "timestamp":
        if off is not None:
            return None
        d, frac = _civil(ns)
        return d.strftime("%Y-%m-%dT%H:%M:%S") + ".%09d" % frac
    if off is None:
        return None
    if off not in ("Z", "z"):
        sign = 1 if off[0] == "+" else -1
        ns -= sign * (int(off[1:3]) * 3600 + int(off[4:6]) * 60) * 10**9
    d, frac = _civil(ns)
    return d.strftime("%Y-%m-%dT%H:%M:%S") + ".%09d" % frac + "Z"


def _lag_form(ms, cls, zone):
    if cls == "integer":
        return None
    if cls in ("date", "timestamp"):
        m = re.fullmatch(r"([+-])(\d{2}):(\d{2})", zone or "")
        if m:
            ms += (1 if m[1] == "+" else -1) * (int(m[2]) * 3600 + int(m[3]) * 60) * 1000
    d = datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=ms)
    if cls == "date":
        return d.strftime("%Y-%m-%d")
    text = d.strftime("%Y-%m-%dT%H:%M:%S") + ".%03d" % (d.microsecond // 1000)
    return text + ("Z" if cls == "timestamptz" else "")


def _check_window_vs_spec(st, signed, scopes):
    sw = st.spec.get("window")
    column_window = is_obj(sw) and sw.get("column") is not None
    if not column_window:
        need(signed is None, f"the agents signed window {signed!r}, the spec has none")
        return ""
    if not scopes:
        return "no answer carries the window"
    need(signed is not None, f"the spec has window on {sw.get('column')!r}, the agents signed none")
    exact_keys(signed, ["column", "upper"], what="signed window")
    need(is_str(signed["column"]) and signed["column"].lower() == sw["column"].lower(),
         f"the signed window column {signed['column']!r} is not the spec's {sw['column']!r}")
    has_as_of, has_lag = sw.get("as_of") is not None, sw.get("lag") is not None
    need(has_as_of != has_lag, "the spec's window has not exactly one of as_of and lag")
    cls = _column_class(st, sw["column"])
    classes = [cls] if cls else list(CLASSES)  # unknown class: any of the four normal forms
    if has_as_of:
        forms = {c: _as_of_form(sw["as_of"], c) for c in classes}
        need(signed["upper"] in forms.values(), f"the signed window bound {signed['upper']!r} is no normal form of the spec's as_of {sw['as_of']!r} ({forms})")
        return f"window {sw['column']} ≤ {signed['upper']} (as_of)"
    clocks = [e for e in st.events if e.get("event") == "clock_read"]
    need(clocks, "no clock_read event for a window with a lag")
    ms = clocks[0].get("unix_ms")
    need(is_int(ms), "the clock_read event has no integer unix_ms")
    need(st.started_ns - SKEW_NS <= ms * 10**6 <= st.started_ns + 3600 * 10**9,
         f"clock_read {ms} is not within 5 minutes before to an hour after the start {st.p['started']}")
    bound = ms - _lag_ms(sw["lag"])
    zone = ((st.described or {}).get("source") or {}).get("time_zone")
    forms = {c: _lag_form(bound, c, zone) for c in classes}
    need(signed["upper"] in forms.values(), f"the signed window bound {signed['upper']!r} is not clock_read {ms} ms minus {sw['lag']} ({forms})")
    return f"window {sw['column']} ≤ {signed['upper']} (clock_read − {sw['lag']})"


def check_verdict(st):
    p, r = st.p, st.r
    failed = any(e.get("event") == "failed" for e in st.events)
    T = st.l1
    if st.mode == "measures":
        equal = "source" in T and "target" in T and _groups_match(T["source"], T["target"], st.spec)
    else:
        s, t = T.get("source_totals"), T.get("target_totals")
        if s is None or t is None:
            equal = False
        elif st.mode == "count":
            equal = s[0] == t[0]
        else:
            equal = s[0] == t[0] and s[1] == t[1] and (s[2] is None or t[2] is None or s[2] == t[2])
    holds = equal and p["leaves"] == 0 and not failed
    v = p["verdict"]
    if v == "match":
        need(holds, "match, but " + ("a failed event is in the record" if failed else
                                     f"{p['leaves']} leaves" if p["leaves"] else "the level-1 totals differ"))
        fid = p.get("fidelity")
        if is_obj(fid) and fid.get("level") == "reduced":
            return "match at reduced fidelity (" + ", ".join(_fid_col(c) for c in fid.get("columns", [])) + ")"
        return "match: equal totals, no leaf"
    if v == "differ":
        need(not holds, "differ, but the totals are equal, no leaf differs and nothing failed")
        return "differ"
    return "error (no claim of equality)"


def _fid_col(c):
    if not is_obj(c):
        return str(c)
    return f"{c.get('column')} " + ", ".join(str(x.get('text', x.get('code'))) for x in c.get("reasons", []) if is_obj(x))


def _tolerance(spec, name):
    tol = (spec.get("tolerance") or {}).get(name)
    if tol is None:
        return None
    s = str(tol).strip()
    if s.endswith("%"):
        return ("rel", decimal.Decimal(s[:-1]) / 100)
    return ("abs", decimal.Decimal(s))


def _within(a, b, tol):
    if a == b:
        return True
    if a is None or b is None or tol is None:
        return False
    try:
        x, y = decimal.Decimal(str(a)), decimal.Decimal(str(b))
    except decimal.InvalidOperation:
        return False
    with decimal.localcontext() as ctx:
        ctx.prec = 200
        d = abs(x - y)
        return d <= tol[1] if tol[0] == "abs" else d <= tol[1] * max(abs(x), abs(y))


def _groups_match(src, tgt, spec):
    """Measures: match exactly when every group is on both sides with equal counts and each
    measure equal by digest or, in clear on both sides, within its tolerance (Q15)."""
    def key(g):
        return json.dumps(g.get("labels"), sort_keys=True)
    S, T_ = {key(g): g for g in src}, {key(g): g for g in tgt}
    if set(S) != set(T_) or len(S) != len(src) or len(T_) != len(tgt):
        return False
    names = spec.get("measures") or []
    for k, a in S.items():
        b_ = T_[k]
        if a.get("count") != b_.get("count"):
            return False
        ma, mb = a.get("measures") or [], b_.get("measures") or []
        if len(ma) != len(mb):
            return False
        for i, (x, y) in enumerate(zip(ma, mb)):
            if x.get("digest") is not None and x.get("digest") == y.get("digest"):
                continue
            cx, cy = x.get("clear"), y.get("clear")
            if not (is_obj(cx) and is_obj(cy)):
                return False
            name = names[i] if i < len(names) else None
            name = name.get("column") if is_obj(name) else name
            tol = _tolerance(spec, name)
            for f in ("non_null", "nan", "pos_inf", "neg_inf"):
                if cx.get(f) != cy.get(f):
                    return False
            for f in ("sum", "min", "max"):
                if not _within(cx.get(f), cy.get(f), tol):
                    return False
    return True


# ---------------------------------------------------------------- fidelity (canonical-form.md §10)

def _ci(name):
    return name.lower() if is_str(name) else name


def resolve_fidelity(spec, described):
    """The fidelity the record gives, or None when it does not resolve (Q18)."""
    if not is_obj(described):
        return None
    s, t = described.get("source"), described.get("target")
    if not (is_obj(s) and is_obj(t)):
        return None
    scols = {_ci(c.get("name")): c for c in s.get("columns") or [] if is_obj(c)}
    tcols = {_ci(c.get("name")): c for c in t.get("columns") or [] if is_obj(c)}
    key = spec.get("key") or s.get("key") or []
    key = [_ci(k) for k in key]
    if spec.get("columns"):
        compared = [_ci(c) for c in spec["columns"]]
    else:
        excl = {_ci(x) for x in spec.get("exclude") or []}
        compared = [_ci(c.get("name")) for c in s.get("columns") or []
                    if _ci(c.get("name")) in tcols and _ci(c.get("name")) not in excl]
    order = key + [c for c in compared if c not in key]
    if st_mode(spec) == "count":
        order = key
    overrides = {_ci(k): v for k, v in (spec.get("overrides") or {}).items()}
    ents = {"source": bool(s.get("empty_string_is_null")), "target": bool(t.get("empty_string_is_null"))}
    out = []
    for name in order:
        a, b_ = scols.get(name), tcols.get(name)
        if a is None or b_ is None:
            return None
        reasons = _column_reasons(name, a, b_, name in key, overrides.get(name) or {}, ents)
        if reasons:
            out.append({"column": a.get("name"), "codes": reasons})
    return out


def st_mode(spec):
    return spec.get("mode", "checksum")


def _column_reasons(name, a, b_, is_key, ov, ents):
    ca, cb = a.get("class"), b_.get("class")
    pair = {ca, cb}
    codes = []
    sa, sb = a.get("scale"), b_.get("scale")
    if ca != cb:
        if pair == {"integer", "decimal"}:
            if is_key:
                codes.append("key_cast")
        elif pair in ({"integer", "boolean"}, {"json", "text"}, {"timestamp", "timestamptz"}, {"decimal", "float"}, {"text", "binary"}):
            codes.append("cross_class")
    if "float" in pair:
        if ca == cb:
            codes.insert(0, "float_scale")
        else:  # decimal/float: reduced unless compared exactly
            dec = a if ca == "decimal" else b_
            exact = dec.get("scale") is None and "scale" not in ov
            if not exact:
                codes.insert(0, "float_scale")
    if ca == cb == "decimal" and "scale" in ov:
        n = ov["scale"]
        if sa is None or sb is None or n < max(sa, sb):
            codes.append("decimal_scale")
    if ca in ("timestamp", "timestamptz", "time") and cb in ("timestamp", "timestamptz", "time") and "precision" in ov:
        pa, pb = (6 if sa is None else sa), (6 if sb is None else sb)
        if ov["precision"] < max(pa, pb):
            codes.append("time_precision")
    if ca == "text" or cb == "text":
        if (ca == "text" and ents["source"]) or (cb == "text" and ents["target"]):
            codes.append("empty_string_as_null")
    fa, fb = bool(a.get("fixed_char")), bool(b_.get("fixed_char"))
    if (fa != fb) or pair == {"text", "binary"}:
        codes.append("padding")
    return codes


def check_fidelity(st):
    want = resolve_fidelity(st.spec, st.described)
    p = st.p
    if want is None:
        desc = "none (the record has no description that resolves)"
    elif not want:
        desc = "full"
    else:
        desc = "reduced: " + ", ".join(f"{c['column']} {'/'.join(c['codes'])}" for c in want)
    if "fidelity" not in p:
        return f"the statement states none (signed before fidelity); the record resolves to {desc}"
    fid = p["fidelity"]
    need(want is not None, f"the statement states fidelity {fid.get('level')}, the record resolves to none")
    if not want:
        need(fid.get("level") == "full", f"the statement states {fid.get('level')}, the record resolves to full")
        return "full"
    need(fid.get("level") == "reduced", f"the statement states {fid.get('level')}, the record resolves to {desc}")
    got = [(c.get("column"), [x.get("code") for x in c.get("reasons", [])]) for c in fid.get("columns", [])]
    exp = [(c["column"], c["codes"]) for c in want]
    # Q19: the reasons' `text` is not specified byte for byte; columns and codes are compared.
    need([(_ci(c), sorted(k)) for c, k in got] == [(_ci(c), sorted(k)) for c, k in exp],
         f"the statement states {got}, the record resolves to {exp}")
    return desc


# ---------------------------------------------------------------- driver

CHECKS = [
    ("bundle format", check_bundle_format),
    ("checkpoint time", check_checkpoint_time),
    ("certificates", check_certificates),
    ("statement signature", check_statement_signature),
    ("statement", check_statement),
    ("result digest", check_result_digest),
    ("result", check_result),
    ("event chain", check_event_chain),
    ("checkpoint", check_checkpoint),
    ("spec", check_spec),
    ("agent_results[n]", check_agent_results),
    ("agent_results", check_agent_results_count),
    ("sides", check_sides),
    ("result fields", check_result_fields),
    ("level-1 totals", check_level1_totals),
    ("verdict", check_verdict),
    ("fidelity", check_fidelity),
]


def load_cas(path):
    try:
        data = open(path, "rb").read()
    except OSError as e:
        raise Usage(f"cannot read --ca {path}: {e}")
    try:
        cas = x509.load_pem_x509_certificates(data)
    except ValueError as e:
        raise Usage(f"--ca {path}: no PEM certificate ({e})")
    if not cas:
        raise Usage(f"--ca {path}: no certificate")
    return cas


def verify(bundle_path, ca_path):
    """Returns (valid, [(ok, name, text)])."""
    st = State()
    st.bundle_path = bundle_path
    st.cas = load_cas(ca_path)
    lines = []
    for name, fn in CHECKS:
        try:
            try:
                res = fn(st)
            except (Fail, Usage):
                raise
            except Exception as e:  # noqa: BLE001 - fail closed on anything unforeseen
                raise Fail(f"cannot be checked ({type(e).__name__}: {e})")
        except Fail as e:
            msg = str(e)
            # a per-item check names its item: "certificates[2]: …", "agent_results[4]: …"
            m = re.match(r"^((?:certificates|agent_results)\[\d+\]): (.*)$", msg, re.S)
            if m and name in ("certificates", "agent_results[n]"):
                lines.append((False, m.group(1), m.group(2)))
            else:
                lines.append((False, "certificates" if name == "certificates" else name, msg))
            return False, lines
        if type(res) is list:
            lines.extend((True, n, d) for n, d in res)
        else:
            lines.append((True, name, res))
    return True, lines


def main(argv=None):
    ap = argparse.ArgumentParser(description="Verify a Tally evidence bundle (independent verifier).")
    ap.add_argument("bundle")
    ap.add_argument("--ca", required=True)
    ap.add_argument("--json", action="store_true")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    try:
        valid, lines = verify(args.bundle, args.ca)
    except Usage as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"valid": valid, "checks": [{"ok": ok, "name": n, "detail": d} for ok, n, d in lines]}, indent=1))
    else:
        for ok, n, d in lines:
            print(f"{'ok   ' if ok else 'FAIL '} {n}: {d}")
        print("VALID" if valid else "INVALID")
    return 0 if valid else 1


if __name__ == "__main__":
    sys.exit(main())
