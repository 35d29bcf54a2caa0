"""The Python kit's checks: what a backend made by accelkit must do from the
PyTorch side, for any device name, with no test knob of any backend.

The registry (base.py: check, Skip, Context) and the groups, registered in
the order they run: names (names.py); tensors, copies, dtypes, views,
fallback (tensors.py); training (training.py); streams, memory, oom,
errors, visibility (device.py).
"""
import time

from .base import CHECKS, Check, Context, Skip, check, expect_raises  # noqa: F401
# Importing a group's module registers its checks: in the order they run.
from . import names as _names, tensors as _tensors, training as _training  # noqa: F401
from . import device as _device  # noqa: F401


GROUPS = list(dict.fromkeys(c.group for c in CHECKS))


def run(ctx, report, groups=None, skip=(), names=None, log=None):
    """Runs the selected checks in order, adding each result to `report`."""
    for c in CHECKS:
        if (groups and c.group not in groups) or c.group in skip or \
                (names and c.name not in names and f"{c.group}/{c.name}" not in names):
            continue
        t0 = time.monotonic()
        status, message = "pass", ""
        if ctx.devices == 0:
            status, message = "skip", "no device"
        else:
            try:
                c.fn(ctx)
            except Skip as e:
                status, message = "skip", str(e)
            except Exception as e:  # noqa: BLE001
                text = str(e).strip()
                status, message = "fail", f"{type(e).__name__}: {text[:2000]}"
            finally:
                try:
                    ctx.mod.synchronize()
                    ctx.mod.set_device(0)
                except Exception as e:  # noqa: BLE001
                    if status == "pass":
                        status, message = "fail", f"the device was unusable after the check: {e}"
        status = report.add(c.group, c.name, c.rule, status, message, time.monotonic() - t0)
        if log:
            log(f"{status:<4} {c.group}/{c.name}" + (f": {message.splitlines()[0]}" if message else ""))
