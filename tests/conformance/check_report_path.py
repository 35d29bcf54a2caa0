"""A conformance kit says so when it cannot write its report (Note
[Conformance report]; ctest: conformance.cpp.report_path,
conformance.py.report_path).

usage: check_report_path.py --cpp KIT_BINARY WORKDIR [CATCH2_ARGS...]
       check_report_path.py --python BACKEND WORKDIR [KIT_ARGS...]
                                     (python -m accelkit.testing --device BACKEND)

- A report in a folder that does not exist: the kit exits 2 before any
  check, naming the file and the reason, and makes no folder.
- A report that can be opened but not written (a link to /dev/full, where
  every write fails): the kit runs its checks, then (Python: after its
  summary) names the file and the reason and exits non-zero.
Prints "report path: ok"."""
import errno
import os
import re
import shutil
import subprocess
import sys

CHECK_LINE = re.compile(r"^(pass|fail|skip) ", re.M)


def run_kit(mode, what, extra, path):
    if mode == "--cpp":
        command = [what, *extra]
    else:
        command = [sys.executable, "-m", "accelkit.testing", "--device", what, *extra]
    env = dict(os.environ, ACCELKIT_CONFORMANCE_REPORT=path)
    return subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=280)


def main():
    mode, what, work, *extra = sys.argv[1:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    problems = []

    missing = os.path.join(work, "missing", "report.json")
    r = run_kit(mode, what, extra, missing)
    print(r.stdout[-1000:])
    said = f"{missing}: {os.strerror(errno.ENOENT)}"
    if r.returncode != 2 or said not in r.stdout or "no check run" not in r.stdout:
        problems.append(f"a report in a missing folder: exit {r.returncode}, wanted 2 and "
                        f"{said!r} and 'no check run' in the output")
    if mode == "--python" and CHECK_LINE.search(r.stdout):
        problems.append("a report in a missing folder: checks ran before the kit refused")
    if os.path.exists(os.path.dirname(missing)):
        problems.append(f"the kit made {os.path.dirname(missing)}")

    if os.path.exists("/dev/full"):
        full = os.path.join(work, "full.json")
        os.symlink("/dev/full", full)
        r = run_kit(mode, what, extra, full)
        print(r.stdout[-1000:])
        said = f"{full}: {os.strerror(errno.ENOSPC)}"
        at = r.stdout.find(said)
        if r.returncode == 0 or at < 0:
            problems.append(f"a report that cannot be written: exit {r.returncode}, wanted "
                            f"non-zero and {said!r} in the output")
        if mode == "--python":
            totals = re.search(r"^\d+ passed, \d+ failed, \d+ skipped", r.stdout, re.M)
            if not CHECK_LINE.search(r.stdout):
                problems.append("a report that cannot be written: no check ran")
            if not totals or at >= 0 and totals.start() > at:
                problems.append("a report that cannot be written: the summary's totals are "
                                "missing or come after the error")
    for p in problems:
        print("problem:", p)
    if not problems:
        print("report path: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
