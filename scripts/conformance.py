#!/usr/bin/env python3
"""Check fixture programs against their manifests in the ExecuTorch runtime.

Each check loads the .pte (with its .ptd as data_path) through
`executorch.runtime.Runtime.get().load_program`, runs the manifest's `runtime_check.method` on
the manifest's inputs, and compares the first output:

* default and `--expect-same`: allclose to `runtime_check.expected`;
* `--expect-changed`: the program must load and run, and its output must NOT be allclose to
  the expected output;
* `--expected-npy OUT.npy`: allclose to that array (in addition to the above).

Every check runs in a forked child, so a runtime crash on a damaged file is reported as a
failure instead of ending the run (the runtime side is in scripts/etlib.py, shared with
scripts/conformance_edits.py). One line per check (`ok   NAME METHOD` / `FAIL NAME
METHOD: reason`), then `N passed, M failed`; the exit status is 1 if any check failed.
"""

import argparse
import json
import os
import sys

sys.dont_write_bytecode = True
from etlib import close, load_torch, register_imports, run_in_child  # noqa: E402  (scripts/, next to this file)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_DIRS = [
    os.path.join(REPO, "tests", "fixtures"),
    os.path.join(REPO, "tests", "fixtures", "extra"),
]


def check(torch, name, pte, ptd, manifest, mode="same", expected_npy=None):
    """Returns (passed, line)."""
    rc = manifest.get("runtime_check")
    if rc is None:
        return False, f"FAIL {name}: manifest has no runtime_check"
    register_imports(rc)
    method = rc["method"]
    label = f"{name} {method}"
    result = run_in_child(pte, ptd, method, rc["inputs"])
    if result[0] != "ok":
        return False, f"FAIL {label}: {result[1]}"
    _, shape, values, dtype = result
    exp = rc["expected"]
    same = close(torch, shape, values, exp["shape"], exp["values"], dtype)
    notes = []
    ok = True
    if mode == "same" and not same:
        ok = False
        notes.append("output differs from the manifest's expected output")
    if mode == "changed":
        if same:
            ok = False
            notes.append("output is unchanged, expected it to differ")
        else:
            notes.append("changed")
    if expected_npy is not None:
        import numpy as np

        arr = np.load(expected_npy)
        if not close(torch, shape, values, list(arr.shape), arr.astype("float64").reshape(-1).tolist(), dtype):
            ok = False
            notes.append(f"output differs from {os.path.basename(expected_npy)}")
        else:
            notes.append(f"matches {os.path.basename(expected_npy)}")
    line = ("ok   " if ok else "FAIL ") + label
    if notes:
        line += (": " if not ok else " (") + "; ".join(notes) + ("" if not ok else ")")
    return ok, line


def fixture_checks(dirs):
    for d in dirs:
        if not os.path.isdir(d):
            print(f"conformance: no fixture directory {d}", file=sys.stderr)
            continue
        for fname in sorted(os.listdir(d)):
            if not fname.endswith(".pte.json"):
                continue
            manifest = json.load(open(os.path.join(d, fname)))
            if "runtime_check" not in manifest:
                continue
            pte = os.path.join(d, manifest["file"])
            data = [os.path.join(d, f) for f in manifest.get("data_files", [])]
            yield manifest["file"], pte, data, manifest


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", action="append", help="fixture directory (repeatable)")
    ap.add_argument("--pte", help="a .pte to check (e.g. an edited copy)")
    ap.add_argument("--ptd", help="its .ptd")
    ap.add_argument("--manifest", help="the manifest whose runtime_check to use")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--expect-same", action="store_true")
    g.add_argument("--expect-changed", action="store_true")
    ap.add_argument("--expected-npy", help="also compare the output with this array")
    args = ap.parse_args()

    torch = load_torch()
    results = []
    if args.pte:
        if not args.manifest:
            ap.error("--pte needs --manifest")
        manifest = json.load(open(args.manifest))
        mode = "changed" if args.expect_changed else "same"
        if args.expected_npy and not (args.expect_same or args.expect_changed):
            mode = "npy"
        results.append(
            check(torch, os.path.basename(args.pte), args.pte, args.ptd, manifest, mode, args.expected_npy)
        )
    else:
        if args.manifest or args.ptd or args.expect_changed or args.expected_npy:
            ap.error("--manifest/--ptd/--expect-*/--expected-npy need --pte")
        for name, pte, data, manifest in fixture_checks(args.fixtures or DEFAULT_DIRS):
            if len(data) > 1:
                results.append((False, f"FAIL {name}: more than one data file is not supported"))
                continue
            results.append(check(torch, name, pte, data[0] if data else None, manifest))
    passed = 0
    for ok, line in results:
        print(line, flush=True)
        passed += ok
    print(f"{passed} passed, {len(results) - passed} failed")
    sys.exit(0 if results and passed == len(results) else 1)


if __name__ == "__main__":
    main()
