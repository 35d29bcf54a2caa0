"""A lost device through PyTorch (Note [Lost devices]): simdev with SIMDEV_STICKY_FAULTS=1 loses
a device when its queued work fails. The failure reaches Python once as torch.AcceleratorError
naming the device; every later op on that device raises torch.AcceleratorError naming the first
failure; the other device works on; tensors of the lost device can be deleted, empty_cache works,
and the process exits cleanly."""
import os
import subprocess
import sys

from backend import simdev_only, two_devices

SCRIPT = r"""
import gc
import torch, torch_simdev

def attempt(what, f):
    try:
        f()
        print(what, 'ran')
    except torch.AcceleratorError as e:
        print(what, 'accelerator error:', isinstance(e, RuntimeError), str(e).splitlines()[0])
    except Exception as e:
        print(what, 'other error:', type(e).__name__, str(e).splitlines()[0])

a = torch.arange(1 << 16, dtype=torch.float32, device='simdev:0')
b = torch.arange(4.0, device='simdev:1')
torch.simdev.synchronize(0)
torch.ops.simdev_driver.inject_fault('memcpy_async', 1, True)
c = a.clone()  # queued on simdev:0; fails on the device, which is then lost
attempt('first', lambda: torch.simdev.synchronize(0))
attempt('add', lambda: a + 1)
attempt('to_cpu', lambda: a.cpu())
attempt('from_cpu', lambda: torch.ones(4).to('simdev:0'))
attempt('empty', lambda: torch.empty(8, device='simdev:0'))
attempt('sync', lambda: torch.simdev.synchronize(0))
print('other device:', (b + 1).cpu().tolist())
print('copy to the other device:', torch.ones(2).to('simdev:1').cpu().tolist())
del a, c
gc.collect()
attempt('empty_cache', torch.simdev.empty_cache)
print('allocated on the lost device:', torch.simdev.memory_allocated(0))
print('end')
"""


@simdev_only
@two_devices
def test_a_lost_device_raises_accelerator_errors_naming_the_first_failure():
    env = dict(os.environ, SIMDEV_STICKY_FAULTS="1", SIMDEV_DEVICE_COUNT="2")
    env.pop("SIMDEV_INJECT_FAULT", None)
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env,
                       timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    first = "accelerator error: True simdev: device 0 lost: driver error 719 in "
    assert lines["first"].startswith(first), out
    call = lines["first"][len(first):].split(":")[0]  # the member that reported it
    for what in ("add", "to_cpu", "from_cpu", "empty", "sync"):
        got = lines[what]
        assert got.startswith("accelerator error: True simdev: device 0 is lost (driver error "
                              f"719 in {call}: asynchronous error of earlier work: queued "
                              "memcpy_async failed"), (what, out)
        assert " refused: a lost device runs no more work" in got, (what, out)
        assert got.count("simdev") == 1, (what, out)
    assert "device: [1.0, 2.0, 3.0, 4.0]" in lines["other"], out
    assert lines["copy"] == "to the other device: [1.0, 1.0]", out
    assert lines["empty_cache"] == "ran", out
    assert "on the lost device: 0" in lines["allocated"], out
    assert r.stdout.splitlines()[-1] == "end", out
    assert "Traceback" not in r.stderr and "terminate" not in r.stderr, out


@simdev_only
def test_without_sticky_faults_a_failure_of_queued_work_is_a_plain_error_and_the_device_works():
    env = dict(os.environ, SIMDEV_STICKY_FAULTS="0")
    env.pop("SIMDEV_INJECT_FAULT", None)
    r = subprocess.run([sys.executable, "-c", r"""
import torch, torch_simdev
a = torch.arange(8.0, device='simdev:0')
torch.ops.simdev_driver.inject_fault('memcpy_async', 1, True)
c = a.clone()
try:
    torch.simdev.synchronize(0)
    print('no error')
except torch.AcceleratorError as e:
    print('error:', str(e).splitlines()[0])
print('after:', (a + 1).cpu().tolist())
"""], capture_output=True, text=True, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "error: simdev: driver error 719 in " in r.stdout, out
    assert "after: [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]" in r.stdout, out
