"""The tensor groups: tensors, copies, dtypes, views and the CPU fallback,
each against the CPU's values."""
import warnings

import torch
import torch.nn.functional as F

from .base import Skip, check


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
