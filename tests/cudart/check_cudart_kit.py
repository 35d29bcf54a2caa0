"""Runs the C++ conformance kit on cudart and checks what it reported.

usage: check_cudart_kit.py KIT_BINARY REPORT_PATH

The kit must pass by tests/check_conformance_report.py's rules (no check
failed, the report well-formed). On a machine with no GPU (the report's
device count 0) it must also say so, not fail: the discovery checks pass,
and every other check is skipped with a message beginning "no device",
which, where CUDA gave an error, names it (cudaError...); the asynchronous
error checks may say instead that cudart offers no fault hook (it has none:
CUDA's asynchronous errors are sticky, so a provoked one would leave the
device unusable, Note [cudart asynchronous errors])."""
import json
import os
import subprocess
import sys


def main():
    kit, path = sys.argv[1:3]
    here = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, os.path.join(here, "..", "check_conformance_report.py"),
                          kit, "cudart", path])
    problems = [] if run.returncode == 0 else ["the kit's report check failed"]
    with open(path) as f:
        report = json.load(f)
    checks = report.get("checks", [])
    if report.get("devices") == 0:
        discovery = {c["name"]: c["status"] for c in checks if c["group"] == "discovery"}
        for name in ("device_count_stable", "discovery_starts_no_context"):
            if discovery.get(name) != "pass":
                problems.append(f"discovery/{name}: {discovery.get(name)!r}, expected pass")
        skipped = [c for c in checks if c["group"] != "discovery"]
        for c in skipped:
            no_hook = c["group"] == "errors" and c["message"].startswith(
                "the runtime offers no fault hook")
            if c["status"] != "skip" or not (c["message"].startswith("no device") or no_hook):
                problems.append(f"{c['group']}/{c['name']}: {c['status']} {c['message']!r}, "
                                "expected a 'no device' skip")
            elif c["message"].startswith("no device: cudart") and "cudaError" not in c["message"]:
                problems.append(f"{c['group']}/{c['name']}: the skip names no CUDA error: "
                                f"{c['message']!r}")
        if not skipped:
            problems.append("no check was skipped")
        else:
            print(f"no device: {len(skipped)} checks skipped, e.g. {skipped[0]['message']!r}")
    for p in problems:
        print("problem:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
