"""The Python kit catches what it claims to (the Python side).

usage: python_kit_catches.py BACKEND WORKDIR

Runs python -m accelkit.testing on BACKEND with a module imported (the
kit's --import, so in its OpInfo children too) that registers deliberately
broken kernels for the backend through torch.library: aten::mm answers the
product plus one, aten::sin raises, aten::flip kills the process,
aten::convolution returns contiguous outputs for channels-last inputs. The kit must
exit 1 and its report must fail the checks that use them, naming their rule:
tensors/operators_match_the_cpu and the training checks (mm), and in the
OpInfo group mm as a mismatch with its largest error, sin as an error, flip
as a crash (forward; the backward's gradients are the tests of
opinfo's own), while add, run after the crash, still matches; the module
also numbers devices as if <NAME>_VISIBLE_DEVICES were applied twice, which
visibility/visible_devices must fail; the report must follow the schema (check_conformance_report.py's
checks, except that failures are expected here); and under python -O (which
strips the asserts the checks are made of) the kit must refuse to run.

Known differences (--known-differences FILE): with a vendor's list naming mm
and sin, those two are reported as known differences (apart from the checks,
with the list's reason), to_sparse as one from the SDK's own list, while flip,
unlisted, still fails the run; a list that names every failure of a run
makes it pass (exit 0); a malformed list is refused before any check runs."""
import json
import os
import subprocess
import sys

BROKEN = '''
import os
import warnings
import torch
lib = torch.library.Library("aten", "IMPL")


def wrong_mm(a, b):
    return (torch.mm(a.cpu(), b.cpu()) + 1).to(a.device)


def failing_sin(x):
    raise RuntimeError("broken_kernels: sin fails on purpose")


def crashing_flip(x, dims):
    os._exit(70)


def contiguous_convolution(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    return torch.convolution(x.cpu(), w.cpu(), None if b is None else b.cpu(), stride, padding,
                             dilation, transposed, output_padding, groups).contiguous().to(x.device)


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
    lib.impl("mm", wrong_mm, "PrivateUse1")
    lib.impl("sin", failing_sin, "PrivateUse1")
    lib.impl("flip", crashing_flip, "PrivateUse1")
    lib.impl("convolution", contiguous_convolution, "PrivateUse1")

# Devices numbered as by a backend that applies <NAME>_VISIBLE_DEVICES a
# second time: logical device i answers for the i-th device the variable names.
_mod = getattr(torch, os.environ["BROKEN_BACKEND"])
_order = os.environ.get(os.environ["BROKEN_BACKEND"].upper() + "_VISIBLE_DEVICES")
if _order:
    _order = [int(x) for x in _order.split(",")]
    _properties = _mod.get_device_properties
    _mod.get_device_properties = lambda device=None: _properties(
        _order[device] if isinstance(device, int) and device < len(_order) else device)
'''


VENDOR_LIST = """# known differences of the broken kernels
opinfo/mm *: broken_kernels answers the product plus one
  opinfo/sin float32 forward : broken_kernels raises
tensors/convolution_str?des: broken_kernels returns contiguous outputs
opinfo/never_run *: matches nothing
"""


def known_differences(backend, work, env):
    """The kit's --known-differences (module docstring); problems found."""
    problems = []
    listed = os.path.join(work, "known.txt")
    with open(listed, "w") as f:
        f.write(VENDOR_LIST)

    def kit(*args, report):
        path = os.path.join(work, report)
        run = subprocess.run([sys.executable, "-m", "accelkit.testing", "--device", backend,
                              "--import", "broken_kernels", "--jobs", "1", "--report", path, *args],
                             env=env, capture_output=True, text=True, timeout=280)
        sys.stdout.write(run.stdout[-2000:])
        sys.stderr.write(run.stderr[-2000:])
        if run.returncode == 2:
            return run, None, ""
        with open(path) as f, open(path + ".txt") as t:
            return run, json.load(f), t.read()

    run, report, text = kit("--groups", "opinfo", "--opinfo-ops", "mm,sin,flip,add,to_sparse",
                            "--opinfo-dtypes", "float32", "--opinfo-directions", "forward",
                            "--known-differences", listed, report="known.json")
    if run.returncode != 1:
        problems.append(f"known differences: the kit exited {run.returncode}, expected 1 "
                        "(flip is not listed)")
    if report is None:
        return problems + ["known differences: no report"]
    checks = {c["name"]: c["status"] for c in report["checks"]}
    known = {c["name"]: c for c in report.get("known_differences", [])}
    if checks != {"flip float32 forward": "fail", "add float32 forward": "pass"}:
        problems.append(f"known differences: the checks are {checks}, expected flip failed and "
                        "add passed (mm, sin and to_sparse known)")
    expect = {"mm float32 forward": ("broken_kernels answers the product plus one", listed,
                                     "mismatch"),
              "sin float32 forward": ("broken_kernels raises", listed, "error: RuntimeError"),
              "to_sparse float32 forward": ("sparse layouts are not supported", "accelkit",
                                            "NotImplementedError")}
    for name, (reason, source, message) in expect.items():
        c = known.get(name)
        if c is None or not c["reason"].startswith(reason) or c["source"] != source \
                or c["status"] != "known" or message not in c["message"] or not c["rule"]:
            problems.append(f"known differences: {name} is {c}, expected known ({reason!r}, "
                            f"{source}, {message!r})")
    if report["summary"] != {"pass": 1, "fail": 1, "skip": 0}:
        problems.append(f"known differences: summary {report['summary']} counts them")
    for line in ("known differences (not failures):",
                 "  known opinfo/mm float32 forward: broken_kernels answers the product plus one",
                 f"{listed}:5: opinfo/never_run *",
                 "1 passed, 1 failed, 0 skipped, 3 known differences"):
        if line not in text or line not in run.stdout:
            problems.append(f"known differences: the summary (printed and .txt) lacks {line!r}")

    # Every failure listed: the run passes.
    run, report, _ = kit("--checks", "tensors/convolution_strides,tensors/factories",
                         "--known-differences", listed, report="known_all.json")
    statuses = report and {c["name"]: c["status"] for c in report["checks"] + report["known_differences"]}
    if run.returncode != 0 or statuses != {"convolution_strides": "known", "factories": "pass"}:
        problems.append(f"known differences: a run whose failures are all listed exited "
                        f"{run.returncode} with {statuses}, expected 0 (convolution_strides known)")

    # A malformed list: refused, naming the file and line, nothing run.
    with open(listed, "a") as f:
        f.write("opinfo/add float32 forward\n")
    run, report, _ = kit("--checks", "tensors/factories", "--known-differences", listed,
                         report="known_bad.json")
    if run.returncode != 2 or f"{listed}:6: 'opinfo/add float32 forward' is not 'CHECK: REASON'" \
            not in run.stderr:
        problems.append(f"known differences: a malformed list gave exit {run.returncode} "
                        f"({run.stderr.strip()[-300:]!r}), expected 2 naming {listed}:6")
    return problems


def main():
    backend, work = sys.argv[1:3]
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "broken_kernels.py"), "w") as f:
        f.write(BROKEN)
    path = os.path.join(work, "broken.json")
    env = dict(os.environ, BROKEN_BACKEND=backend, PYTHONPATH=os.pathsep.join(
        [work] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    run = subprocess.run(
        [sys.executable, "-m", "accelkit.testing", "--device", backend, "--import",
         "broken_kernels", "--groups", "tensors,training,visibility,opinfo", "--opinfo-ops",
         "mm,sin,flip,add", "--opinfo-dtypes", "float32", "--opinfo-directions", "forward",
         "--jobs", "1", "--report", path],
        env=env, capture_output=True, text=True, timeout=280)
    sys.stdout.write(run.stdout[-3000:])
    sys.stderr.write(run.stderr[-3000:])
    problems = []
    if run.returncode != 1:
        problems.append(f"the kit exited {run.returncode}, expected 1 (checks failed)")
    with open(path) as f:
        report = json.load(f)
    if (report["schema"], report["version"], report["kit"]) != ("accelkit.conformance", 1, "python"):
        problems.append("schema, version or kit wrong")
    checks = {f"{c['group']}/{c['name']}": c for c in report["checks"]}
    expect = {
        "tensors/operators_match_the_cpu": ("fail", "mm"),
        "tensors/factories": ("pass", ""),
        "tensors/convolution_strides": ("fail", "strides (512, 64, 8, 1) on the device"),
        "training/mlp_sgd": ("fail", "losses"),
        "opinfo/mm float32 forward": ("fail", "mismatch: Mismatch: output 0"),
        "opinfo/sin float32 forward": ("fail", "error: RuntimeError: broken_kernels: sin fails"),
        "opinfo/flip float32 forward": ("fail", "crash: the process died (70)"),
        "opinfo/add float32 forward": ("pass", ""),
        "visibility/visible_devices": ("fail", "VISIBLE_DEVICES='1,0'"),
    }
    for name, (status, text) in expect.items():
        c = checks.get(name)
        if c is None:
            problems.append(f"{name} is not in the report")
        elif c["status"] != status or text not in c["message"]:
            problems.append(f"{name}: {c['status']} {c['message'][:300]!r}, expected {status} "
                            f"with {text!r}")
        elif status == "fail" and not c["rule"]:
            problems.append(f"{name} fails without naming its rule")
    mm = checks.get("opinfo/mm float32 forward", {})
    if "largest absolute error" not in mm.get("message", ""):
        problems.append(f"the mismatch of mm does not give its largest error: {mm.get('message')!r}")
    if "opinfo/mm float32 forward" in checks and \
            "OpInfo samples of mm (float32, forward)" not in checks["opinfo/mm float32 forward"]["rule"]:
        problems.append("the OpInfo check's rule does not name its operator")
    counts = {s: sum(c["status"] == s for c in report["checks"]) for s in ("pass", "fail", "skip")}
    if report["summary"] != counts:
        problems.append(f"summary {report['summary']} does not count the checks {counts}")
    with open(path + ".txt") as f:
        text = f.read()
    if "rule: PyTorch's OpInfo samples of flip (float32, forward)" not in text:
        problems.append("the readable summary does not give the failing check's rule")
    # Its checks are asserts: under python -O it refuses to run at all.
    optimized = subprocess.run([sys.executable, "-O", "-m", "accelkit.testing", "--device", backend,
                                "--groups", "names", "--opinfo", "none", "--report",
                                os.path.join(work, "optimized.json")],
                               env=env, capture_output=True, text=True, timeout=120)
    if optimized.returncode != 2 or "python -O" not in optimized.stderr:
        problems.append(f"under python -O the kit exited {optimized.returncode} "
                        f"({optimized.stderr.strip()[-200:]!r}), expected 2 and a refusal")
    problems += known_differences(backend, work, env)
    print(f"{len(checks)} checks: {counts}")
    for p in problems:
        print("problem:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
