"""The device groups: streams and events, memory statistics, out of memory,
errors, and <NAME>_VISIBLE_DEVICES (in child processes)."""
import json
import os
import subprocess
import sys

import torch

from .base import check, expect_raises


# ---------------------------------------------------------------- streams

@check("streams", "the stream and device context managers make a stream or device current and "
                  "restore the previous one")
def guards(ctx):
    default = ctx.mod.current_stream(0)
    s = ctx.mod.Stream(0)
    with ctx.mod.stream(s):
        assert ctx.mod.current_stream(0) == s
        assert torch.accelerator.current_stream(0) == s
    assert ctx.mod.current_stream(0) == default
    last = ctx.devices - 1
    with ctx.mod.device(last):
        assert ctx.mod.current_device() == last
        assert torch.empty(1, device=ctx.name).device == torch.device(ctx.name, last)
    assert ctx.mod.current_device() == 0
    expect_raises(IndexError, lambda: ctx.mod.device(ctx.devices + 3).__enter__(), ctx.name)
    assert ctx.mod.current_device() == 0


@check("streams", "work on a side stream joined by an event is seen by the default stream; "
                  "query() is true once a stream and an event are done")
def side_stream_and_event(ctx):
    x = torch.randn(1 << 16, device=ctx.name)
    side = ctx.mod.Stream()
    side.wait_stream(ctx.mod.current_stream())
    with ctx.mod.stream(side):
        y = x * 3 + 1
        done = ctx.mod.Event()
        done.record(side)
    ctx.mod.current_stream().wait_event(done)
    y.record_stream(ctx.mod.current_stream())
    z = (y - 1).cpu()
    torch.testing.assert_close(z, x.cpu() * 3)
    done.synchronize()
    assert done.query(), "an event whose work is done queries false"
    side.synchronize()
    assert side.query(), "an idle stream queries false"
    assert ctx.mod.Event().query(), "an event never recorded must query true"


@check("streams", "event timing: elapsed_time between two recorded events is positive where the "
                  "schema reports event_timing, refused otherwise")
def event_timing(ctx):
    start, end = ctx.mod.Event(enable_timing=True), ctx.mod.Event(enable_timing=True)
    start.record()
    (torch.ones(1 << 16, device=ctx.name) * 2).sum()
    end.record()
    end.synchronize()
    if ctx.props["event_timing"]:
        assert start.elapsed_time(end) >= 0
    else:
        expect_raises(RuntimeError, lambda: start.elapsed_time(end), ctx.name)


@check("streams", "synchronize() waits for the work of every stream; priorities in the "
                  "reported range make streams")
def synchronize_and_priorities(ctx):
    pr = ctx.props["stream_priorities"]
    outs = []
    for p in sorted({pr["pytorch_default"], pr["pytorch_most_urgent"]}):
        s = ctx.mod.Stream(0, priority=p)
        with ctx.mod.stream(s):
            outs.append(torch.full((1 << 16,), float(p), device=ctx.name).cumsum(0))
    ctx.mod.synchronize()
    for o in outs:
        assert o.is_contiguous()
    for p, o in zip(sorted({pr["pytorch_default"], pr["pytorch_most_urgent"]}), outs):
        assert o[-1].item() == float(p) * (1 << 16)


# ----------------------------------------------------------------- memory

@check("memory", "memory_allocated, max_memory_allocated and memory_stats follow allocations "
                 "and frees")
def statistics(ctx):
    ctx.mod.empty_cache()
    base = ctx.mod.memory_allocated(0)
    ctx.mod.reset_peak_memory_stats(0)
    x = torch.empty(1 << 20, dtype=torch.uint8, device=ctx.name)
    assert ctx.mod.memory_allocated(0) >= base + (1 << 20)
    assert ctx.mod.max_memory_allocated(0) >= base + (1 << 20)
    assert ctx.mod.memory_reserved(0) >= ctx.mod.memory_allocated(0)
    stats = ctx.mod.memory_stats(0)
    assert stats["allocated_bytes.all.current"] == ctx.mod.memory_allocated(0)
    assert stats["allocation.all.current"] >= 1
    del x
    assert ctx.mod.memory_allocated(0) == base, "a freed tensor is still counted"
    assert ctx.mod.max_memory_allocated(0) >= base + (1 << 20)
    ctx.mod.reset_peak_memory_stats(0)
    assert ctx.mod.max_memory_allocated(0) == base
    free, total = ctx.mod.mem_get_info(0)
    assert 0 < free <= total, (free, total)
    assert f"{ctx.name} memory summary, device ID 0" in ctx.mod.memory_summary(0)


@check("memory", "empty_cache() returns cached blocks to the driver: memory_reserved falls "
                 "to what live tensors hold")
def empty_cache(ctx):
    ctx.mod.empty_cache()
    before = ctx.mod.memory_reserved(0)
    xs = [torch.empty(1 << 20, dtype=torch.uint8, device=ctx.name) for _ in range(4)]
    assert ctx.mod.memory_reserved(0) >= before + (4 << 20)
    del xs
    assert ctx.mod.memory_reserved(0) >= before + (4 << 20), "freed blocks should stay cached"
    ctx.mod.empty_cache()
    assert ctx.mod.memory_reserved(0) == before, \
        f"memory_reserved {ctx.mod.memory_reserved(0)} after empty_cache, {before} before"


# -------------------------------------------------------------------- oom

@check("oom", "a request beyond the device's memory raises torch.OutOfMemoryError naming the "
              "backend; the device allocates and computes again, its statistics unchanged")
def oom_then_recovery(ctx):
    x = torch.ones(1 << 16, device=ctx.name)
    allocated = ctx.mod.memory_allocated(0)
    too_much = ctx.props["total_memory"] + (1 << 30)
    for _ in range(2):
        expect_raises(torch.OutOfMemoryError,
                      lambda: torch.empty(too_much, dtype=torch.uint8, device=ctx.name), ctx.name)
    assert ctx.mod.memory_allocated(0) == allocated, "a failed allocation changed the statistics"
    y = torch.empty(4 << 20, dtype=torch.uint8, device=ctx.name).fill_(3)
    assert y.sum().item() == 3 * (4 << 20)
    assert x.sum().item() == 1 << 16
    del y
    ctx.mod.empty_cache()


# ----------------------------------------------------------------- errors

@check("errors", "a device index out of range is an IndexError naming the backend and the index; "
                 "the current device is unchanged")
def bad_device_index(ctx):
    bad = ctx.devices + 5
    expect_raises(IndexError, lambda: ctx.mod.set_device(bad), ctx.name, str(bad))
    expect_raises(IndexError, lambda: torch.empty(2, device=f"{ctx.name}:{bad}"), str(bad))
    expect_raises(IndexError, lambda: ctx.mod.get_device_properties(bad), ctx.name)
    assert ctx.mod.current_device() == 0


@check("errors", "a device of another type where the backend's is expected is a ValueError "
                 "naming the backend")
def wrong_device_type(ctx):
    expect_raises(ValueError, lambda: ctx.mod.get_device_properties("cpu"), ctx.name)


@check("errors", "operands on the device and on the CPU in one operator are a RuntimeError; "
                 "the device works after it")
def mixed_devices(ctx):
    a, b = torch.ones(3, device=ctx.name), torch.ones(3)
    expect_raises(RuntimeError, lambda: a + b, "same device")
    expect_raises(RuntimeError, lambda: torch.mm(torch.ones(2, 2, device=ctx.name),
                                                  torch.ones(2, 2)))
    assert (a + 1).sum().item() == 6.0


@check("errors", "an error inside an operator (a bad shape) is the CPU's exception type, and "
                 "the device works after it")
def operator_errors(ctx):
    a = torch.ones(2, 3, device=ctx.name)
    expect_raises(RuntimeError, lambda: a @ torch.ones(2, 3, device=ctx.name))
    expect_raises(IndexError, lambda: a[5])
    expect_raises(RuntimeError, lambda: a.view(4, 4))
    assert (a @ a.t()).cpu().tolist() == [[3.0, 3.0], [3.0, 3.0]]


# ------------------------------------------------------------- visibility

_VISIBLE_CHILD = r"""
import importlib, json, os, sys
import torch
name = sys.argv[1]
for module in ["torch_" + name, *filter(None, os.environ.get("ACCELKIT_TESTING_IMPORT", "").split(","))]:
    importlib.import_module(module)
mod = getattr(torch, name)
n = mod.device_count()
print(json.dumps({"count": n, "uuids": [mod.get_device_properties(i)["uuid"] for i in range(n)],
                  "error": mod.init_error() if hasattr(mod, "init_error") else ""}))
"""


def _visible_in_child(ctx, var, value):
    """torch.<name>'s devices (their UUIDs) in a new process whose
    visibility variable `var` is `value` (None: unset)."""
    env = dict(os.environ)
    if value is None:
        env.pop(var, None)
    else:
        env[var] = value
    p = subprocess.run([sys.executable, "-c", _VISIBLE_CHILD, ctx.name], capture_output=True,
                       text=True, env=env, timeout=300)
    if p.returncode != 0 or not p.stdout.strip():
        tail = (p.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise AssertionError(f"with {var}={value!r} a new process could not list the devices: "
                             f"{tail}")
    return json.loads(p.stdout.strip().splitlines()[-1])


@check("visibility", "<NAME>_VISIBLE_DEVICES, set before a process loads the backend, selects and "
                     "orders the devices it names (by UUID); an empty value hides them all")
def visible_devices(ctx):
    ctx.need_devices(1)
    var = f"{ctx.name.upper()}_VISIBLE_DEVICES"
    if var in os.environ:
        uuids = _visible_in_child(ctx, var, None)["uuids"]
    else:
        uuids = [ctx.mod.get_device_properties(i)["uuid"] for i in range(ctx.devices)]
    # A process each (a second of importing torch): "1,0" both selects and
    # reorders, so a runtime that applies the variable too (and numbers the
    # devices it names from 0) shows the wrong order.
    cases = [("1,0", [1, 0])] if len(uuids) >= 2 else [("0", [0])]
    cases.append(("", []))
    for value, physical in cases:
        got = _visible_in_child(ctx, var, value)
        want = [uuids[d] for d in physical]
        assert got["uuids"] == want, \
            f"with {var}={value!r}, torch.{ctx.name} has the devices {got['uuids']}, not " \
            f"{want} (physical {physical}){'; ' + got['error'] if got['error'] else ''}"
