#!/usr/bin/env python3
"""Compare tests/verifier/tally_verify.py with `tally verify` over a corpus.

    python3 tests/verifier/compare.py DIR [-v]

DIR holds NNNN.json (a bundle), NNNN.ca.pem and NNNN.tally (first line: `tally verify`'s
exit code; then its report). Prints every disagreement on validity (exit 0 against 1)
with both reports' failing lines, then the agreement counts; with -v also the bundles
both refuse at different checks. Exits 1 if any bundle's validity disagrees.
"""

import io
import os
import re
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tally_verify  # noqa: E402


def ours(bundle, ca):
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = tally_verify.main([bundle, "--ca", ca])
    except Exception:  # noqa: BLE001 - a crash of the verifier is a finding too
        return 3, "CRASH\n" + traceback.format_exc()
    return code, out.getvalue() + err.getvalue()


def failing(report):
    lines = [ln for ln in report.splitlines() if ln.startswith("FAIL") or ln.startswith("error") or "CRASH" in ln]
    return lines or [report.strip().splitlines()[-1] if report.strip() else "(empty report)"]


def check_name(line):
    m = re.match(r"^FAIL\s+([^:(]+?)\s*(?:\(.*?\))?: ", line)
    if not m:
        return None
    return re.sub(r"\[\d+\]", "[n]", m.group(1))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    verbose = "-v" in sys.argv[1:]
    if len(args) != 1 or not os.path.isdir(args[0]):
        print(__doc__, file=sys.stderr)
        return 2
    d = args[0]
    ids = sorted(f[:-5] for f in os.listdir(d) if f.endswith(".json") and os.path.exists(os.path.join(d, f[:-5] + ".tally")))
    counts = {"agree valid": 0, "agree invalid": 0, "disagree": 0, "other": 0}
    same_check = 0
    diff_check = []
    for i in ids:
        with open(os.path.join(d, i + ".tally"), encoding="utf-8", errors="replace") as f:
            text = f.read()
        first, _, theirs = text.partition("\n")
        try:
            tcode = int(first.strip())
        except ValueError:
            print(f"{i}: unreadable .tally first line {first!r}")
            counts["other"] += 1
            continue
        ocode, orep = ours(os.path.join(d, i + ".json"), os.path.join(d, i + ".ca.pem"))
        if tcode == ocode == 0:
            counts["agree valid"] += 1
        elif tcode == ocode == 1:
            counts["agree invalid"] += 1
            a, b = failing(theirs), failing(orep)
            if check_name(a[0]) == check_name(b[0]):
                same_check += 1
            else:
                diff_check.append((i, a[0], b[0]))
        elif {tcode, ocode} <= {0, 1}:
            counts["disagree"] += 1
            print(f"== {i}: tally verify exit {tcode}, tally_verify.py exit {ocode}")
            for ln in failing(theirs):
                print(f"   tally:  {ln}")
            for ln in failing(orep):
                print(f"   python: {ln}")
        else:
            counts["other"] += 1
            print(f"== {i}: tally verify exit {tcode}, tally_verify.py exit {ocode}")
            for ln in failing(theirs):
                print(f"   tally:  {ln}")
            for ln in failing(orep):
                print(f"   python: {ln}")
    if verbose and diff_check:
        print("\nboth refuse, at different checks:")
        for i, a, b in diff_check:
            print(f"-- {i}\n   tally:  {a}\n   python: {b}")
    total = len(ids)
    agree = counts["agree valid"] + counts["agree invalid"]
    print(f"\n{total} bundles: {agree} agree ({counts['agree valid']} valid, {counts['agree invalid']} invalid: "
          f"{same_check} at the same check, {len(diff_check)} at another), "
          f"{counts['disagree']} disagree on validity, {counts['other']} other (exit 2/crash)")
    return 1 if counts["disagree"] or counts["other"] else 0


if __name__ == "__main__":
    sys.exit(main())
