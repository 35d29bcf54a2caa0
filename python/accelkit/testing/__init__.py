"""accelkit's conformance kit, Python side: what a backend made by accelkit
must do from the PyTorch side, for any device name.

    python -m accelkit.testing --device acme [--groups tensors,copies] [--skip training]
        [--report acme.json] [--opinfo quick|full|none] [--opinfo-ops a,b] [--import m]
        [--known-differences FILE] [--list]

From a backend's wheel alone (the SDK travels inside it as torch_acme._accelkit):
python -m torch_acme.testing, or python -m torch_acme._accelkit.testing; both
default --device to the package's backend.
The checks (the checks package) run in order in this process, grouped:
names, tensors, copies, dtypes, views, fallback, training, streams, memory,
oom, errors, visibility; then, unless --opinfo none, PyTorch's own operator samples (op_db)
on the device against the CPU (opinfo.py), each operator in a child process
(group "opinfo", one check per operator, dtype and direction). The report
(report.py) has the C++ kit's schema (Note [Conformance report]) with
"kit": "python"; its path is --report, else $ACCELKIT_CONFORMANCE_REPORT,
else accelkit_conformance_python_<name>.json; a readable summary goes
beside it (.txt) and to stdout. A failure on the SDK's list of known
differences (OpInfo operators: known_differences.py) or on the vendor's own
(--known-differences FILE, known_differences.py says its format) is reported
apart, as a known difference. The exit status is 1 if any other check failed.

Autocompare (autocompare.py), for chasing numerics at run time, is enabled
by <NAME>_AUTOCOMPARE when the backend is installed.
"""
from .checks import CHECKS, GROUPS, Context, Skip, check  # noqa: F401
from .report import Report  # noqa: F401

__all__ = ["main", "run", "Report", "CHECKS", "GROUPS", "check", "Skip"]


def load(name):
    """Imports the backend `name` (its package torch_<name>, unless
    torch.<name> exists already) and returns torch.<name>."""
    import importlib

    import torch
    if not hasattr(torch, name):
        importlib.import_module(f"torch_{name}")
    if not hasattr(torch, name):
        raise ValueError(f"accelkit.testing: importing torch_{name} made no torch.{name}")
    return getattr(torch, name)


def run(name, imports=(), groups=None, skip=(), names=None, opinfo="quick", opinfo_ops=None,
        opinfo_dtypes=None, opinfo_samples=1, opinfo_directions=("forward", "backward"), jobs=2,
        rtol=1e-4, atol=1e-5, log=None, known_differences=None):
    """Runs the kit on the backend `name` (after importing `imports`, here
    and in the OpInfo children); the Report. `known_differences`: the
    vendor's list (a path, or what known_differences.load returned)."""
    import importlib
    import os
    import sys

    if sys.flags.optimize:
        # The checks are assert statements: python -O would pass them all.
        raise RuntimeError(f"{name}: accelkit's conformance kit does not run under python -O "
                           "(PYTHONOPTIMIZE), which removes the assert statements its checks are "
                           "made of")
    from . import checks
    from . import known_differences as kd
    if isinstance(known_differences, (str, os.PathLike)):
        known_differences = kd.load(known_differences)
    load(name)
    for module in imports:
        importlib.import_module(module)
    if imports:
        os.environ["ACCELKIT_TESTING_IMPORT"] = ",".join(imports)  # for the children
    ctx = Context(name, rtol=rtol, atol=atol)
    report = Report(name, ctx.devices, known_differences)
    checks.run(ctx, report, groups=groups, skip=skip, names=names, log=log)
    if opinfo != "none" and ctx.devices and (not groups or "opinfo" in groups) and "opinfo" not in skip \
            and not names:
        from . import opinfo as op
        op.kit_run(report, name, ctx, full=opinfo == "full", ops=opinfo_ops,
                   dtypes=opinfo_dtypes, samples=opinfo_samples,
                   directions=opinfo_directions, jobs=jobs, log=log)
    return report
