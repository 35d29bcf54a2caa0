"""The Python kit's checks: what a backend made by accelkit must do from the
PyTorch side, for any device name, with no test knob of any backend.

Each check is a function of a Context, registered with the group it belongs
to and the rule it proves (in words, as the report names it). It passes by
returning, fails by raising (the message says what broke the rule) and is
skipped by raising Skip (e.g. a check of two devices on a backend with one).
"""
import inspect
import json
import os
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F

from .names import CUDA_ONLY


class Skip(Exception):
    """Raised by a check that does not apply to the backend; says why."""


class Check:
    def __init__(self, group, name, rule, fn):
        self.group, self.name, self.rule, self.fn = group, name, rule, fn


CHECKS = []


def check(group, rule):
    """Registers the decorated function as the check `group`/<its name>."""
    def register(fn):
        CHECKS.append(Check(group, fn.__name__, rule, fn))
        return fn
    return register


class Context:
    """What the checks know of the backend under test."""

    def __init__(self, name, rtol=1e-4, atol=1e-5):
        self.name = name
        self.mod = getattr(torch, name)
        self.devices = self.mod.device_count()
        self.props = self.mod.get_device_properties(0) if self.devices else None
        self.rtol, self.atol = rtol, atol
        self.dev = torch.device(name, 0)

    def dtypes(self):
        """The dtypes the capability schema reports that this torch knows."""
        return [getattr(torch, d) for d in self.props["dtypes"]
                if isinstance(getattr(torch, d, None), torch.dtype)]

    def close(self, got, want, what, **tol):
        tol = tol or {"rtol": self.rtol, "atol": self.atol}
        torch.testing.assert_close(got.cpu() if isinstance(got, torch.Tensor) else got, want,
                                   equal_nan=True, msg=lambda m: f"{what}: {m}", **tol)

    def need_devices(self, n):
        if self.devices < n:
            raise Skip(f"needs {n} devices; {self.name} has {self.devices}")


def expect_raises(kind, f, *contains):
    """f() must raise `kind` (exactly that class or a subclass) whose message
    holds every string of `contains`; the exception."""
    try:
        f()
    except kind as e:
        for c in contains:
            if c not in str(e):
                raise AssertionError(f"{type(e).__name__} raised without {c!r} in its "
                                     f"message: {e}") from None
        return e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {kind.__name__}, got {type(e).__name__}: {e}") from None
    raise AssertionError(f"expected {kind.__name__}, nothing was raised")


# ------------------------------------------------------------------ names

@check("names", "torch.<name> has every public name of torch.cuda but CUDA's own "
                "(its toolkit, libraries, graphs, NVML: accelkit.testing.names.CUDA_ONLY)")
def cuda_names(ctx):
    missing = [n for n in torch.cuda.__all__ if not hasattr(ctx.mod, n) and n not in CUDA_ONLY]
    assert missing == [], f"torch.{ctx.name} lacks {missing}"


def _parameters(f):
    target = f.__new__ if inspect.isclass(f) and f.__new__ is not object.__new__ else f
    if inspect.isclass(f) and target is f:
        target = f.__init__
    params = list(inspect.signature(target).parameters.values())
    return [(p.name, p.kind) for p in params if p.name not in ("self", "cls")]


@check("names", "torch.<name>'s functions and classes take torch.cuda's parameters "
                "(names and kinds; initial_seed also takes a device)")
def cuda_parameters(ctx):
    differ = {}
    for n in torch.cuda.__all__:
        ours, theirs = getattr(ctx.mod, n, None), getattr(torch.cuda, n)
        if ours is None or inspect.ismodule(ours) or not callable(ours) or n == "initial_seed":
            continue
        try:
            expected = _parameters(theirs)
        except (TypeError, ValueError):
            continue  # a builtin without a signature
        if _parameters(ours) != expected:
            differ[n] = (_parameters(ours), expected)
    assert differ == {}, f"parameters differ from torch.cuda's: {differ}"


@check("names", "the device is PyTorch's accelerator: torch.accelerator and torch.<name> agree, "
                "torch.<name>.amp and .random import by their torch names")
def accelerator(ctx):
    import importlib
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == ctx.name, f"torch.accelerator names {acc}"
    assert torch.accelerator.device_count() == ctx.devices == len(
        [ctx.mod.get_device_name(i) for i in range(ctx.devices)])
    assert importlib.import_module(f"torch.{ctx.name}.amp") is ctx.mod.amp
    assert importlib.import_module(f"torch.{ctx.name}.random") is ctx.mod.random
    assert ctx.mod.is_available() == (ctx.devices > 0)


# ---------------------------------------------------------------- tensors

@check("tensors", "factory functions make tensors on the device with the CPU's values")
def factories(ctx):
    d = ctx.name
    for got, want in ((torch.zeros(3, 4, device=d), torch.zeros(3, 4)),
                      (torch.ones(5, dtype=torch.int64, device=d), torch.ones(5, dtype=torch.int64)),
                      (torch.arange(10, device=d), torch.arange(10)),
                      (torch.full((2, 3), 2.5, device=d), torch.full((2, 3), 2.5)),
                      (torch.eye(4, device=d), torch.eye(4)),
                      (torch.empty(0, device=d), torch.empty(0))):
        assert got.device == ctx.dev, f"made on {got.device}, expected {ctx.dev}"
        assert torch.equal(got.cpu(), want), f"{got.cpu()} on the device, {want} on the CPU"


@check("tensors", "elementwise operators, reductions and matrix products match the CPU")
def operators_match_the_cpu(ctx):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(33, 17, generator=g), torch.randn(17, 9, generator=g)
    c = torch.rand(33, 17, generator=g) + 0.5
    da, db, dc = a.to(ctx.name), b.to(ctx.name), c.to(ctx.name)
    cases = {
        "add": (lambda x, y, z: x + 2 * z), "mul": (lambda x, y, z: x * z),
        "div": (lambda x, y, z: x / z), "exp": (lambda x, y, z: x.exp()),
        "sqrt": (lambda x, y, z: z.sqrt()), "relu": (lambda x, y, z: x.relu()),
        "sum": (lambda x, y, z: x.sum(dim=1)), "mean": (lambda x, y, z: x.mean()),
        "max": (lambda x, y, z: x.max(dim=0).values), "argmax": (lambda x, y, z: x.argmax(dim=1)),
        "mm": (lambda x, y, z: x @ y), "softmax": (lambda x, y, z: x.softmax(dim=-1)),
        "where": (lambda x, y, z: torch.where(x > 0, x, z)),
        "cumsum": (lambda x, y, z: x.cumsum(0)),
    }
    for name, f in cases.items():
        ctx.close(f(da, db, dc), f(a, b, c), name)


@check("tensors", "a convolution gives the CPU's values and the CPU's strides (channels-last for "
                  "a channels-last input), which torch.compile's fake convolution promises for "
                  "the device")
def convolution_strides(ctx):
    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(8, 3, 3, 3, generator=g), torch.randn(8, generator=g)
    for fmt in (torch.contiguous_format, torch.channels_last):
        x = torch.randn(2, 3, 8, 8, generator=g).to(memory_format=fmt)
        want = F.conv2d(x, w.to(memory_format=fmt), bias, padding=1)
        got = F.conv2d(x.to(ctx.name), w.to(memory_format=fmt).to(ctx.name), bias.to(ctx.name),
                       padding=1)
        assert got.stride() == want.stride(), \
            f"conv2d of a {fmt} input: strides {got.stride()} on the device, {want.stride()} on " \
            "the CPU (a compiled graph's stride check fails on them)"
        ctx.close(got, want, f"conv2d ({fmt})")


@check("tensors", "item() and tolist() read device values; comparisons give bool tensors")
def scalars(ctx):
    x = torch.tensor([1.5, -2.0, 3.25], device=ctx.name)
    assert x[2].item() == 3.25 and x.tolist() == [1.5, -2.0, 3.25]
    m = x > 0
    assert m.dtype == torch.bool and m.device == ctx.dev and m.cpu().tolist() == [True, False, True]
    assert bool((x == x).all())


# ----------------------------------------------------------------- copies

@check("copies", "host to device to host copies are exact at every size (0 B to 1 MiB + 7)")
def round_trip_sizes(ctx):
    g = torch.Generator().manual_seed(1)
    for n in (0, 1, 7, 255, 4096 + 3, (1 << 20) + 7):
        x = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
        y = x.to(ctx.name)
        assert y.device == ctx.dev
        back = y.cpu()
        assert torch.equal(back, x), f"{n} bytes came back changed"


@check("copies", "copies of non-contiguous views, into strided destinations and with dtype "
                 "conversion keep the values")
def strided_and_converting(ctx):
    x = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    d = x.to(ctx.name)
    t = d.t()
    assert not t.is_contiguous() and torch.equal(t.cpu(), x.t())
    half = torch.empty(10, 6, dtype=torch.float16, device=ctx.name)
    half.copy_(t)
    assert torch.equal(half.cpu(), x.t().half()), "device-to-device copy with conversion"
    dst = torch.zeros(10, 12, device=ctx.name)[:, ::2]
    dst.copy_(x.t())
    assert torch.equal(dst.cpu(), x.t()), "host to strided device view"
    host = torch.zeros(6, 20)[:, ::2]
    host.copy_(d)
    assert torch.equal(host, x), "device to strided host view"
    assert torch.equal(d[:, 3].cpu(), x[:, 3]) and d[2, 7].item() == 27.0


@check("copies", "device to device copies (clone, and across devices) are exact")
def device_to_device(ctx):
    x = torch.randn(1000, 3)
    d = x.to(ctx.name)
    assert torch.equal(d.clone().cpu(), x)
    if ctx.devices > 1:
        other = d.to(f"{ctx.name}:1")
        assert other.device == torch.device(ctx.name, 1) and torch.equal(other.cpu(), x)
        back = torch.empty_like(d)
        back.copy_(other)
        assert torch.equal(back.cpu(), x)


@check("copies", "non_blocking copies from and to pinned memory land once the stream is "
                 "synchronized")
def non_blocking_pinned(ctx):
    x = torch.randn(1 << 16)
    pinned = x.pin_memory()  # the accelerator's pinned host memory
    assert pinned.is_pinned()
    d = pinned.to(ctx.name, non_blocking=True)
    out = torch.empty_like(pinned).pin_memory()
    out.copy_(d * 2, non_blocking=True)
    ctx.mod.current_stream().synchronize()
    assert torch.equal(out, x * 2)


# ----------------------------------------------------------------- dtypes

@check("dtypes", "every dtype the capability schema reports copies to the device and back "
                 "exactly and agrees with supported_dtypes()")
def schema_dtypes_round_trip(ctx):
    dtypes = ctx.dtypes()
    assert dtypes, "the capability schema reports no dtype"
    assert ctx.mod.supported_dtypes(0) == list(ctx.props["dtypes"])
    g = torch.Generator().manual_seed(2)
    for dt in dtypes:
        src = torch.randn(37, 3, generator=g) * 8
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "ComplexHalf support is experimental"
            x = src.to(dt) if not dt.is_complex else torch.complex(src, -src).to(dt)
        y = x.to(ctx.name)
        assert y.dtype == dt and y.device == ctx.dev
        assert torch.equal(y.cpu().view(torch.uint8), x.view(torch.uint8)), \
            f"{dt}: the bytes changed on the way"


@check("dtypes", "arithmetic in each floating and integer dtype the schema reports matches the CPU")
def schema_dtypes_arithmetic(ctx):
    tried = 0
    for dt in ctx.dtypes():
        if dt not in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                      torch.int32, torch.int16, torch.int8, torch.uint8, torch.complex64):
            continue
        x = torch.arange(1, 25).reshape(4, 6).to(dt)
        got = ((x.to(ctx.name) * 3 + x.to(ctx.name)).sum(0)).cpu()
        ctx.close(got, (x * 3 + x).sum(0), f"{dt}", rtol=0, atol=0)
        tried += 1
    if not tried:
        raise Skip("the schema reports no arithmetic dtype this check knows")


# ------------------------------------------------------------------ views

@check("views", "views alias the device memory of their base: writes through a view show in "
                "the base")
def views_alias(ctx):
    x = torch.arange(24.0, device=ctx.name)
    for v in (x.view(4, 6), x.view(4, 6).t(), x[3:15:2], x.as_strided((3, 3), (4, 1), 2),
              x.unsqueeze(0).expand(2, 24), x.view(2, 12).narrow(1, 4, 4)):
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(), \
            "a view has storage of its own"
    x.view(4, 6)[1].fill_(-1)
    x[3:15:2].mul_(0)
    want = torch.arange(24.0)
    want.view(4, 6)[1].fill_(-1)
    want[3:15:2].mul_(0)
    assert torch.equal(x.cpu(), want)


@check("views", "resize_ and set_ work on device tensors and keep what they should")
def resize_and_set(ctx):
    x = torch.arange(12.0, device=ctx.name)
    y = torch.empty(0, device=ctx.name)
    y.resize_(100)
    assert y.numel() == 100
    y.zero_()
    assert y.sum().item() == 0.0
    z = torch.empty(0, device=ctx.name).set_(x)
    assert z.data_ptr() == x.data_ptr()
    x.resize_(20)
    assert torch.equal(x[:12].cpu(), torch.arange(12.0)), "resize_ lost the prefix"


@check("views", "every ATen view operator the CPU implements has a kernel for the device "
                "(its own or a composite one): a view cannot fall back to the CPU")
def every_view_has_a_kernel(ctx):
    C = torch._C
    composite = ("PrivateUse1", "CompositeExplicitAutograd", "CompositeImplicitAutograd",
                 "CompositeExplicitAutogradNonFunctional")
    missing, views = [], 0
    for s in C._jit_get_all_schemas():
        if not s.name.startswith("aten::") or s.name.startswith("aten::_nested"):
            continue
        if not any(r.alias_info is not None and not r.alias_info.is_write for r in s.returns):
            continue
        name = s.name + ("." + s.overload_name if s.overload_name else "")
        try:
            has = {k: C._dispatch_has_kernel_for_dispatch_key(name, k) for k in ("CPU",) + composite}
        except RuntimeError:
            continue  # a TorchScript-only schema, not in the dispatcher
        if not any(has.values()):
            continue  # sparse, quantized or nested tensors only
        views += 1
        if not any(has[k] for k in composite):
            missing.append(name)
    assert views > 50, f"only {views} view operators found"
    assert missing == [], f"view operators without a kernel: {missing}"


# --------------------------------------------------------------- fallback

@check("fallback", "an operator without a kernel for the device runs through the CPU fallback "
                   "with the CPU's result, on the device, and is counted in fallback_report()")
def fallback_runs_and_is_reported(ctx):
    candidates = {"aten::erfinv": lambda x: torch.erfinv(x.clamp(-0.9, 0.9)),
                  "aten::digamma": lambda x: torch.digamma(x.abs() + 1),
                  "aten::cosh": torch.cosh, "aten::mm": lambda x: x @ x,
                  "aten::lgamma": lambda x: torch.lgamma(x.abs() + 1)}
    fallen = [op for op in candidates
              if not torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1")]
    if not fallen:
        raise Skip(f"{ctx.name} has kernels of its own for every operator this check tries "
                   f"({', '.join(candidates)})")
    x = torch.randn(8, 8)
    ctx.mod.reset_fallback_report()
    for op in fallen:
        got = candidates[op](x.to(ctx.name))
        assert got.device == ctx.dev, f"{op} returned a tensor on {got.device}"
        ctx.close(got, candidates[op](x), op)
    counted = {op.split(".")[0]: n for op, n, _ in ctx.mod.fallback_report()}
    for op in fallen:
        assert counted.get(op, 0) > 0, f"{op} fell back but fallback_report() says {counted}"


# --------------------------------------------------------------- training

def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _cnn():
    # No bias before the batch norm: its true gradient is zero (the norm
    # takes the mean out), so what it gets is rounding noise, which Adam
    # scales up to steps of its learning rate whatever the noise's size: the
    # CPU's own values for it would be as arbitrary as the device's.
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 8, 3, padding=1, bias=False),
                               torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(8, 4))


def _train(make, device, optimizer, steps, shape):
    torch.manual_seed(0)
    model = make().to(device)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=0.01))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, *shape, generator=g).to(device)
    y = torch.randint(0, 4, (64,), generator=g).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def _training(ctx, make, optimizer, shape):
    cpu_losses, cpu_params = _train(make, "cpu", optimizer, 10, shape)
    losses, params = _train(make, ctx.name, optimizer, 10, shape)
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    ctx.close(torch.tensor(losses), torch.tensor(cpu_losses), "losses")
    for i, (a, b) in enumerate(zip(params, cpu_params)):
        ctx.close(a, b, f"parameter {i}")


for _make, _shape in ((_mlp, (16,)), (_cnn, (1, 8, 8))):
    for _optimizer in ("sgd", "adam"):
        def _fn(ctx, make=_make, optimizer=_optimizer, shape=_shape):
            _training(ctx, make, optimizer, shape)
        _kind = "an MLP" if _make is _mlp else "a CNN (convolutions, pooling, batch norm)"
        _fn.__name__ = f"{_make.__name__[1:]}_{_optimizer}"
        check("training", f"{_kind} trained 10 steps with {_optimizer} on the device follows "
                          "the CPU (losses and parameters, within the kit's tolerance)")(_fn)


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
        report.add(c.group, c.name, c.rule, status, message, time.monotonic() - t0)
        if log:
            log(f"{status:<4} {c.group}/{c.name}" + (f": {message.splitlines()[0]}" if message else ""))
