"""The profiler (Note [Profiler device times]).

torch.autograd.profiler.profile(use_device="simdev") marks every operator
with the backend's profiler stubs. Without them PyTorch's default stubs
throw at every mark: a C++ backtrace on stderr per operator, and device
times of about -1.5e16 us."""
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from torch.autograd.profiler import profile

from backend import DEV, MOD, renamed, simdev_only

driver = torch.ops.simdev_driver


def _run(code, **env):
    full = {**os.environ, **{renamed(k): v for k, v in env.items()}}  # SIMDEV_X: <ENV>X
    return subprocess.run([sys.executable, "-c", renamed("import torch, torch_simdev\n" + textwrap.dedent(code))],
                          capture_output=True, text=True, env=full, timeout=120)


def _not_kineto(err):
    """stderr without the two lines Kineto itself writes per profiling
    session ("profiler_start", "profiler_stop"), CPU-only profiling too."""
    return [l for l in err.splitlines() if "SyncActivityProfilerHandler" not in l]


def _events(prof, name):
    """Events named `name`, of torch.autograd.profiler.profile or of
    torch.profiler.profile."""
    events = prof.function_events if hasattr(prof, "function_events") else prof.events()
    return [e for e in events if e.name == name]


def test_profiling_operators_gives_device_times_and_writes_nothing(capfd):
    x = torch.randn(256, device=DEV)
    MOD.synchronize()
    capfd.readouterr()
    t0 = time.perf_counter()
    with profile(use_device=DEV) as prof:
        for _ in range(10):
            y = (x * 2).relu()
        MOD.synchronize()
    wall_us = (time.perf_counter() - t0) * 1e6
    out, err = capfd.readouterr()
    assert out == "" and _not_kineto(err) == []         # nothing per operator
    muls = _events(prof, "aten::mul")
    assert len(muls) == 10
    for e in prof.function_events:
        assert 0 <= e.device_time_total <= wall_us, (e.name, e.device_time_total)
        assert 0 <= e.cpu_time_total <= wall_us, (e.name, e.cpu_time_total)
    assert all(e.device_time_total > 0 for e in muls)   # every operator is timed
    assert torch.equal(y.cpu(), (x.cpu() * 2).relu())
    table = prof.key_averages().table(sort_by="device_time_total")
    assert "aten::mul" in table


@simdev_only
def test_a_held_stream_shows_in_the_device_time_of_the_operator_that_held_it():
    s = torch.accelerator.current_stream()
    MOD.synchronize()
    t0 = time.perf_counter()
    with profile(use_device=DEV) as prof:
        gate = driver.hold(s)             # the stream stops here...
        driver.release_later(gate, 50)    # ...for 50 ms from now
        MOD.synchronize()
    wall_us = (time.perf_counter() - t0) * 1e6
    (held,) = _events(prof, "simdev_driver::hold")
    # From the mark before the gate to the one behind it: at least the 50 ms
    # the gate stayed shut, at most the whole profiled block.
    assert 50_000 <= held.device_time_total <= wall_us
    assert held.cpu_time_total < 50_000   # queueing the gate took the host no time


def test_profiling_before_the_device_is_used_creates_no_context_and_times_nothing():
    r = _run("""
        from torch.autograd.profiler import profile
        with profile(use_device="simdev") as prof:
            y = torch.ones(8) * 2
            # (profile's exit calls torch.simdev.synchronize(), which
            # initializes, as torch.cuda.synchronize() does)
            assert not torch.simdev.is_initialized()
        assert all(e.device_time_total == 0 for e in prof.function_events)
        assert [e.name for e in prof.function_events if e.name == "aten::mul"]
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert _not_kineto(r.stderr) == []


@simdev_only
def test_a_device_without_event_timing_gets_host_times_and_says_so_once():
    r = _run("""
        import warnings
        from torch.autograd.profiler import profile
        assert not torch.simdev.get_device_properties(0)["event_timing"]
        x = torch.randn(64, device="simdev")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with profile(use_device="simdev") as prof:
                for _ in range(5):
                    y = x + 1
        said = [str(w.message) for w in caught if "event timing" in str(w.message)]
        assert len(said) == 1, said
        assert "host times" in said[0] and "simdev:0" in said[0], said
        adds = [e for e in prof.function_events if e.name == "aten::add"]
        assert len(adds) == 5 and all(e.device_time_total > 0 for e in adds)
        print("ok")
    """, SIMDEV_EVENT_TIMING="0")
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


# ------------------------------------- torch.profiler (Kineto): device activities

@simdev_only
def test_torch_profiler_records_the_devices_activity_linked_to_each_operator():
    from torch.profiler import ProfilerActivity, profile as kineto_profile
    assert getattr(ProfilerActivity, DEV.upper()) == ProfilerActivity.PrivateUse1   # the Python rename
    x = torch.randn(256, device=DEV)
    s = torch.accelerator.current_stream()
    MOD.synchronize()
    t0 = time.perf_counter()
    with kineto_profile(activities=[ProfilerActivity.CPU, getattr(ProfilerActivity, DEV.upper())]) as prof:
        gate = driver.hold(s)
        driver.release_later(gate, 50)
        y = (x * 2).relu()                # waits for the gate (host kernels) or queues behind it
        MOD.synchronize()
    wall_us = (time.perf_counter() - t0) * 1e6
    device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert device, "no device activity recorded"
    assert all(e.device_index == 0 for e in device)
    cpu = torch.autograd.DeviceType.CPU
    (held,) = [e for e in _events(prof, "simdev_driver::hold") if e.device_type == cpu]
    assert 50_000 <= held.device_time_total <= wall_us
    (mul,) = [e for e in _events(prof, "aten::mul") if e.device_type == cpu]
    assert 0 < mul.device_time_total <= wall_us
    # Each device activity is one operator's, named after it, within the block.
    assert {e.name for e in device} >= {"simdev_driver::hold", "aten::mul"}
    assert all(0 <= e.device_time_total <= wall_us for e in device)
    assert torch.equal(y.cpu(), (x.cpu() * 2).relu())


def test_cpu_only_tracing_records_no_device_activity():
    from torch.profiler import ProfilerActivity, profile as kineto_profile
    x = torch.randn(256, device=DEV)
    with kineto_profile(activities=[ProfilerActivity.CPU]) as prof:
        (x * 2).relu()
        MOD.synchronize()
    assert not [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    assert _events(prof, "aten::mul")


def test_use_device_with_use_kineto_traces_the_devices_activity_too():
    x = torch.randn(256, device=DEV)
    MOD.synchronize()
    with profile(use_device=DEV, use_kineto=True) as prof:
        y = (x * 2).relu()
        MOD.synchronize()
    pu1 = torch.autograd.DeviceType.PrivateUse1
    ops = [e for e in _events(prof, "aten::mul") if e.device_type != pu1]
    device = [e for e in _events(prof, "aten::mul") if e.device_type == pu1]
    assert len(ops) == 1 and len(device) == 1
    assert 0 < device[0].device_time_total <= ops[0].device_time_total
    assert torch.equal(y.cpu(), (x.cpu() * 2).relu())


def test_operators_that_did_no_device_work_get_no_device_activity(tmp_path):
    """Note [Device work of an operator]: views, allocations, dtype queries
    and conversions of CPU scalars do nothing on the device, so they get no
    device activity (as a CUDA operator that launched no kernel gets none),
    while the operators that worked keep theirs, their device time in the
    tables and their row in the Chrome trace."""
    import json
    from torch.profiler import ProfilerActivity, profile as kineto_profile
    x = torch.randn(4, 64, device=DEV)
    MOD.synchronize()
    with kineto_profile(activities=[ProfilerActivity.CPU, getattr(ProfilerActivity, DEV.upper())]) as prof:
        v = x.view(-1)                            # a view
        buf = torch.empty(64, device=DEV)    # an allocation
        t = x.t()                                 # a view
        y = v * 2.5                               # device work (and a CPU scalar's conversion)
        z = torch.zeros(8, device=DEV)       # an allocation, then a fill: device work
        MOD.synchronize()
    pu1, cpu = torch.autograd.DeviceType.PrivateUse1, torch.autograd.DeviceType.CPU
    device = [e for e in prof.events() if e.device_type == pu1]
    names = {e.name for e in prof.events() if e.device_type == cpu}
    assert {"aten::view", "aten::empty", "aten::t", "aten::mul", "aten::zero_"} <= names, names
    # Every device activity is the work of an operator that did some: the
    # multiplication (through the fallback's copies, _copy_from, without
    # host-visible memory) and the fill.
    worked = {"aten::mul", "aten::_copy_from", "aten::zero_"}
    assert {e.name for e in device} <= worked, [e.name for e in device]
    assert "aten::zero_" in {e.name for e in device}
    (mul,) = [e for e in _events(prof, "aten::mul") if e.device_type == cpu]
    assert mul.device_time_total > 0
    for name in ("aten::view", "aten::empty", "aten::t"):
        assert all(e.device_time_total == 0 for e in _events(prof, name)), name
    avg = {a.key: a for a in prof.key_averages()}
    assert avg["aten::mul"].self_device_time_total > 0
    assert avg["aten::view"].device_time_total == 0
    table = prof.key_averages().table(sort_by="device_time_total")
    assert f"Self {DEV.upper()}" in table and f"{DEV.upper()} total" in table
    # The Chrome trace: the worked operators' activities, as kernels.
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    kernels = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "kernel"]
    assert sorted(k["name"] for k in kernels) == sorted(e.name for e in device), kernels
    assert all(k["dur"] >= 0 for k in kernels)
    assert torch.equal(y.cpu(), x.cpu().view(-1) * 2.5) and buf.shape == (64,) and t.shape == (64, 4)
    assert torch.equal(z.cpu(), torch.zeros(8))
