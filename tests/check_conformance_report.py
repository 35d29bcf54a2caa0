"""Runs a conformance kit and checks its report (Note [Conformance report]).

usage: check_conformance_report.py KIT_BINARY BACKEND REPORT_PATH   (the C++ kit)
       check_conformance_report.py --python BACKEND REPORT_PATH [KIT_ARGS...]
                                              (python -m accelkit.testing --device BACKEND)

The kit must pass (exit 0), and the JSON report it writes must follow the
documented schema: every check with group, name, rule, a status of pass,
fail or skip, a message and a duration; a summary that counts them; and,
beside it, the readable summary (REPORT_PATH.txt) naming every check."""
import json
import os
import subprocess
import sys


def main():
    kit, backend, path = sys.argv[1:4]
    if kit == "--python":
        command, kind = [sys.executable, "-m", "accelkit.testing", "--device", backend,
                         *sys.argv[4:]], "python"
    else:
        command, kind = [kit], "cpp"
    for p in (path, path + ".txt"):
        if os.path.exists(p):
            os.remove(p)
    env = dict(os.environ, ACCELKIT_CONFORMANCE_REPORT=path)
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=280)
    sys.stdout.write(run.stdout[-4000:])
    sys.stderr.write(run.stderr[-4000:])
    problems = []
    if run.returncode != 0:
        problems.append(f"the kit exited {run.returncode}")
    with open(path) as f:
        report = json.load(f)
    if report.get("schema") != "accelkit.conformance" or report.get("version") != 1:
        problems.append(f"schema/version: {report.get('schema')!r} {report.get('version')!r}")
    if report.get("kit") != kind or report.get("backend") != backend:
        problems.append(f"kit/backend: {report.get('kit')!r} {report.get('backend')!r}")
    checks = report.get("checks", [])
    if len(checks) < 15:
        problems.append(f"only {len(checks)} checks reported")
    counts = {"pass": 0, "fail": 0, "skip": 0}
    for c in checks:
        for key, kind in (("group", str), ("name", str), ("rule", str), ("status", str),
                          ("message", str), ("duration_s", (int, float))):
            if not isinstance(c.get(key), kind):
                problems.append(f"check {c.get('name')!r}: field {key} missing or mistyped")
        if c.get("status") not in counts:
            problems.append(f"check {c.get('name')!r}: status {c.get('status')!r}")
            continue
        counts[c["status"]] += 1
        if not c["rule"]:
            problems.append(f"check {c['name']!r} names no rule")
        if c["status"] != "pass" and not c["message"]:
            problems.append(f"check {c['name']!r} is {c['status']} without a message")
    if report.get("summary") != counts:
        problems.append(f"summary {report.get('summary')} does not count the checks {counts}")
    if counts["fail"]:
        problems.append(f"{counts['fail']} check(s) failed on {backend}")
    with open(path + ".txt") as f:
        text = f.read()
    for c in checks:
        if f"{c['group']}/{c['name']}" not in text:
            problems.append(f"the readable summary does not name {c['group']}/{c['name']}")
    print(f"{len(checks)} checks: {counts}")
    for p in problems:
        print("problem:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
