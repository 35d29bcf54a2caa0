"""vkdev's native Vulkan kernels (examples/vulkan/vkdev_kernels.cpp, GLSL compute shaders
through the vendor-kernel API of include/accelkit/torch/kernels.hpp): each against the CPU,
broadcast, strided, at storage offsets and at edge sizes (0 elements, 1, odd), counted
(torch.ops.vkdev_kernels.launches) so that a silent fallback fails; in-place forms; what they
do not take (other dtypes, too many dims, a span beyond one storage-buffer binding) goes to
the fallback and still equals the CPU, and wrong inputs raise the CPU's errors; kernels from
several threads and streams; the MLP training step equals the CPU's with its matrix
products, activations, bias sums and SGD update native; the benchmark's direct submissions
equal the CPU; VKDEV_NATIVE_KERNELS=0 turns the kernels off. Run in VKDEV_HOST_ACCESS none
and direct (tests/CMakeLists.txt)."""
import copy
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from backend import DEV
import native_kernels

if DEV != "vkdev":
    pytest.skip("vkdev's native Vulkan kernels", allow_module_level=True)

import torch_vkdev  # noqa: E402,F401

KOPS = torch.ops.vkdev_kernels
if not KOPS.enabled():
    pytest.skip("VKDEV_NATIVE_KERNELS=0: the native kernels are not registered",
                allow_module_level=True)

EXACT, CLOSE = native_kernels.EXACT, native_kernels.CLOSE
_gen, _randn, _special = native_kernels.gen, native_kernels.randn, native_kernels.special
_check = native_kernels.checker(KOPS)


ELEMENTWISE_SHAPES = [
    ((1000,), (1000,)), ((7,), (7,)), ((1,), (1,)), ((0,), (0,)), ((0, 3), (1, 3)), ((), ()),
    ((5, 1), (1, 7)), ((3, 4), (4,)), ((2, 3, 4, 5), (3, 1, 5)), ((33, 17), ()),
]


@pytest.mark.parametrize("sa,sb", ELEMENTWISE_SHAPES)
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_add_sub_and_mul_equal_the_cpu(op, sa, sb):
    a, b = _special(_randn(*sa, seed=1)), _randn(*sb, seed=2)
    n = 0 if torch.broadcast_shapes(sa, sb).numel() == 0 else 1
    _check("mul" if op == "mul" else "add", getattr(torch, op), a, b, launched=n)


def test_strided_offset_and_scalar_operands():
    a, b = _randn(17, 33, seed=3), _randn(33, 17, seed=4)
    _check("add", lambda x, y: x + y.t(), a, b)                 # transposed
    _check("add", lambda x, y: x.t() + y, a, b)                 # output keeps x.t()'s layout
    _check("mul", lambda x, y: x[::2, 1::3] * y.t()[::2, 1::3], a, b)   # sliced
    _check("add", lambda x, y: x[:, :1].expand(17, 33) + x, a, b)       # expanded
    _check("add", lambda x, y: x.view(-1)[5:300] + y.view(-1)[1:296], a, b)   # odd offsets
    _check("add", lambda x, y: torch.add(x, y.t(), alpha=0.5), a, b, tol=CLOSE)
    _check("add", lambda x, y: torch.sub(x, y.t(), alpha=-3), a, b, tol=CLOSE)
    _check("add", lambda x, y: x + 2.5, a, b)                   # a Python number
    _check("add", lambda x, y: x - 2, a, b)
    _check("add", lambda x, y: torch.add(x, 3, alpha=-2), a, b)
    _check("add", lambda x, y: x + True, a, b)
    _check("mul", lambda x, y: x * -0.75, a, b)
    _check("mul", lambda x, y: 3 * x, a, b)
    got = a.to(DEV).t() + b.to(DEV)
    assert got.stride() == (a.t() + b).stride()


def test_in_place_forms_equal_the_cpu_and_partial_overlap_falls_back():
    def inplace(f):
        def run(x, y):
            x = x.clone()
            f(x, y)
            return x
        return run

    def whole(x, y):
        assert x.add_(y, alpha=-0.1) is x
    a, b = _randn(9, 13, seed=5), _randn(13, seed=6)
    _check("add", inplace(whole), a, b, tol=CLOSE)
    _check("add", inplace(lambda x, y: x.sub_(y)), a, b)
    _check("mul", inplace(lambda x, y: x.mul_(y)), a, b)
    _check("add", inplace(lambda x, y: x.add_(x)), a, b)          # the same tensor: in place
    _check("add", inplace(lambda x, y: x[:, 1:].add_(2.0)), a, b)   # a view in place
    _check("mul", inplace(lambda x, y: x.t().mul_(0.5)), a, b)
    _check("add", inplace(lambda x, y: x[0].add_(x[1])), a, b)     # disjoint rows of one storage
    # x[1:] += x[:-1] reads what it writes elsewhere: the fallback, which raises the CPU's error.
    x = a.to(DEV)
    n0 = KOPS.launches("add")
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        x.view(-1)[1:].add_(x.view(-1)[:-1])
    assert KOPS.launches("add") == n0


@pytest.mark.parametrize("shape", [(1000,), (7,), (1,), (0,), (), (13, 9)])
def test_relu_and_threshold_backward_equal_the_cpu(shape):
    x, g = _special(_randn(*shape, seed=7)), _randn(*shape, seed=8)
    n = 0 if x.numel() == 0 else 1
    tb = torch.ops.aten.threshold_backward
    _check("relu", torch.relu, x, launched=n)
    _check("threshold_backward", lambda gg, xx: tb(gg, xx, 0.0), g, x, launched=n)
    _check("threshold_backward", lambda gg, xx: tb(gg, xx, 0.25), g, x, launched=n)
    if len(shape) == 2:
        _check("relu", lambda t: t.t().relu(), x)
        _check("threshold_backward", lambda gg, xx: tb(gg.t()[:1], xx.t(), 0.0), g, x)


MM_SHAPES = [(1, 1, 1), (7, 13, 5), (128, 64, 256), (33, 17, 1), (0, 3, 4), (3, 0, 4), (17, 16, 16)]


@pytest.mark.parametrize("m,k,n", MM_SHAPES)
def test_mm_and_addmm_equal_the_cpu(m, k, n):
    a, b = _randn(m, k, seed=9), _randn(k, n, seed=10)
    bias_row, bias_full = _randn(n, seed=11), _randn(m, n, seed=12)
    launched = 0 if m * n == 0 or k == 0 else 1   # k == 0: the fallback's beta * bias
    _check("mm", torch.mm, a, b, launched=launched, tol=CLOSE)
    _check("addmm", torch.addmm, bias_row, a, b, launched=launched, tol=CLOSE)
    _check("addmm", lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=-2.0), bias_full, a, b,
           launched=launched, tol=CLOSE)


def test_mm_of_transposed_sliced_and_offset_operands_and_biases():
    a, b = _randn(64, 96, seed=13), _randn(48, 64, seed=14)
    _check("mm", lambda x, y: torch.mm(x.t(), y.t()), a, b, tol=CLOSE)     # both transposed
    _check("mm", lambda x, y: torch.mm(x[::2, 5:50], y.t()[5:50, ::3]), a, b, tol=CLOSE)
    nan_bias = torch.full((48,), float("nan"))                              # beta 0 ignores it
    _check("addmm", lambda c, x, y: torch.addmm(c, x.t(), y.t(), beta=0), nan_bias, a, b, tol=CLOSE)
    for bias in (_randn(48, 3, seed=22).t()[:1], _randn(96, 1, seed=23),
                 _randn(96, seed=24).view(96, 1).expand(96, 48), torch.tensor(0.5)):
        _check("addmm", lambda c, x, y: torch.addmm(c, x.t(), y.t(), beta=-1.5, alpha=0.25),
               bias, a, b, tol=CLOSE)


SUMS = [
    ((1000,), None, False), ((7,), 0, False), ((1,), None, False), ((0,), None, False),
    ((0, 4), 0, False), ((4, 0), 1, True), ((), None, False), ((), 0, True),
    ((128, 256), 0, True), ((128, 256), 1, False), ((3, 5, 7), (0, 2), False),
    ((2, 3, 4, 5), (1, 3), True),
]


@pytest.mark.parametrize("shape,dim,keepdim", SUMS)
def test_sum_equals_the_cpu(shape, dim, keepdim):
    x = _randn(*shape, seed=15)
    out_numel = (x.sum() if dim is None else x.sum(dim, keepdim=keepdim)).numel()
    f = (lambda t: t.sum()) if dim is None else (lambda t: t.sum(dim, keepdim=keepdim))
    _check("sum", f, x, launched=1 if out_numel else 0, tol=CLOSE)


def test_sum_strided_accurate_and_keeps_infinities():
    x = _randn(64, 48, seed=16)
    _check("sum", lambda t: t.t().sum(0), x, tol=CLOSE)
    _check("sum", lambda t: t[::3, 1::2].sum((0, 1)), x, tol=CLOSE)
    _check("sum", lambda t: t.sum(dtype=torch.float32), x, tol=CLOSE)
    n = 1 << 20   # a serial float32 sum drifts; the compensated sum is exact here
    got = _check("sum", torch.sum, torch.arange(n, dtype=torch.float32))
    assert got.item() == float((n - 1) * n // 2)
    y = torch.tensor([[float("inf"), 1.0, 2.0], [float("-inf"), 1.0, 1e30],
                      [float("nan"), 0.0, 0.0], [float("inf"), float("-inf"), 1.0]])
    _check("sum", lambda t: t.sum(1), y)
    _check("sum", lambda t: t.sum(1), _special(_randn(70, 3, seed=26)), tol=CLOSE)   # one per invocation
    _check("sum", lambda t: t.transpose(0, 2).sum((0, 2)), _randn(5, 80, 6, seed=27), tol=CLOSE)


def test_a_tensor_deep_in_a_large_buffer_binds_and_a_span_beyond_a_binding_falls_back():
    # One allocation of 160 MiB, larger than lavapipe's maxStorageBufferRange (128 MiB): a
    # slice near its end binds from its own offset; a strided view spanning 156 MB, more than
    # one binding covers, takes the fallback (Note [vkdev kernel bindings]).
    big = torch.zeros(40_000_000, device=DEV)
    big[39_000_001:39_001_001] = torch.arange(1000.0).to(DEV)
    torch.vkdev.synchronize()
    n0 = KOPS.launches("add")
    tail = big[39_000_001:39_001_001] + 1
    assert KOPS.launches("add") - n0 == 1
    torch.testing.assert_close(tail.cpu(), torch.arange(1000.0) + 1, **EXACT)
    wide = big[::13_000_000]                        # 4 elements, 156 MB apart end to end
    n0 = KOPS.launches("add")
    torch.testing.assert_close((wide + 2).cpu(), torch.full((4,), 2.0), **EXACT)
    assert KOPS.launches("add") - n0 == 0


def test_what_the_kernels_do_not_take_falls_back_and_equals_the_cpu():
    x64, i64 = _randn(9, 4, seed=17).double(), torch.arange(36).view(9, 4)
    h = _randn(9, 4, seed=18).half()
    cases = [("add", torch.add, (x64, x64)), ("add", torch.add, (i64, i64)),
             ("add", lambda a, b: a + b, (h, h)), ("mul", torch.mul, (i64, 3)),
             ("mul", lambda a, b: a * b, (x64.float(), x64)),     # float32 * float64: promotes
             ("add", lambda a: a + (1 + 2j), (x64.float(),)),
             ("add", lambda a: a[::2, ::2, ::2, ::2, ::2] + 1,            # 5 unmergeable dims
              (_randn(3, 4, 5, 6, 7, seed=19),)),
             ("relu", torch.relu, (i64,)), ("mm", torch.mm, (x64, x64.t())),
             ("addmm", torch.addmm, (x64[0], x64.t(), x64)),
             ("sum", lambda a: a.sum(0), (i64,)),
             ("sum", lambda a: a.sum(dtype=torch.float64), (x64.float(),))]
    for kernel, f, args in cases:
        _check(kernel, f, *args, launched=0, tol=CLOSE)
    x = torch.ones(3, 4, device=DEV)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(x, x)
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.sum(5)
    with pytest.raises(RuntimeError, match="must match the size"):
        x + torch.ones(5, device=DEV)
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(3, dtype=torch.int64, device=DEV).add_(torch.ones(3, device=DEV))
    with pytest.raises(ValueError, match="vkdev: launches: no native kernel 'conv'"):
        KOPS.launches("conv")
    torch.testing.assert_close((x + x).cpu(), torch.full((3, 4), 2.0), **EXACT)   # still usable


def test_kernels_from_several_threads_and_streams_equal_the_cpu():
    x = _randn(64, 64, seed=20)
    want = torch.relu(x @ x + x).sum(0)
    errors, results = [], []

    def work():
        try:
            s = torch.vkdev.Stream()
            with torch.vkdev.stream(s):
                xd = x.to(DEV)
                for _ in range(10):
                    r = torch.relu(xd @ xd + xd).sum(0)
                s.synchronize()
                results.append(r.cpu())
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 4
    for r in results:
        torch.testing.assert_close(r, want, rtol=1e-4, atol=1e-4)


def test_the_mlp_training_step_equals_the_cpu_with_the_native_kernels():
    import torch.nn.functional as F
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 48), torch.nn.ReLU(),
                                torch.nn.Linear(48, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 5))
    dev_model = copy.deepcopy(model).to(DEV)
    x, y = _randn(33, 20, seed=21), torch.randint(0, 5, (33,), generator=_gen(22))
    xd, yd = x.to(DEV), y.to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1)
    names = ["addmm", "mm", "relu", "threshold_backward", "sum", "add"]
    before = {k: KOPS.launches(k) for k in names}
    for _ in range(3):
        for m, o, inp, tgt in ((model, opt, x, y), (dev_model, dev_opt, xd, yd)):
            o.zero_grad()
            loss = F.cross_entropy(m(inp), tgt)
            loss.backward()
            o.step()
            if m is model:
                want = loss.detach()
            else:
                torch.testing.assert_close(loss.detach().cpu(), want, rtol=1e-5, atol=1e-6)
    ran = {k: KOPS.launches(k) - before[k] for k in names}
    # Per step: 3 addmm forward, 2 relu, 2 threshold_backward, 3 bias sums, 5 mm (the first
    # layer's input needs no gradient), and SGD's update of 6 parameters (add_).
    assert ran == {"addmm": 9, "relu": 6, "threshold_backward": 6, "sum": 9, "mm": 15,
                   "add": 18}, ran
    for p, q in zip(model.parameters(), dev_model.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)


def test_the_benchmarks_direct_submissions_equal_the_cpu_and_check_their_arguments():
    # bench/vkdev_bench.py's baselines: the add shader and vkCmdCopyBuffer on command
    # buffers of their own, submitted with a fence (vkdev_test_ops.cpp).
    a, b = _randn(1001, seed=23), _randn(1001, seed=24)
    ad, bd = a.to(DEV), b.to(DEV)
    for per_submit in (False, True):
        out = torch.empty(1001, device=DEV)
        torch.vkdev.synchronize()
        KOPS.add_directly(ad, bd, out, 3, per_submit)
        torch.testing.assert_close(out.cpu(), a + b, **EXACT)
    src = torch.arange(4096.0).to(DEV)
    dst = torch.zeros(4100, device=DEV)
    torch.vkdev.synchronize()
    KOPS.copy_directly(src[1:], dst[3:], 4000, 2)                 # 1000 floats, offsets
    want = torch.zeros(4100)
    want[3:1003] = torch.arange(1.0, 1001.0)
    torch.testing.assert_close(dst.cpu(), want, **EXACT)
    with pytest.raises(ValueError, match="vkdev: add_directly: expected contiguous float32"):
        KOPS.add_directly(ad, bd.double(), out, 1)
    with pytest.raises(ValueError, match="vkdev: copy_directly: bytes=20000"):
        KOPS.copy_directly(src, dst, 20000, 1)


# The tests below start a child process each (the knob is read at the library's load): they
# test the registration, the same in every host-access mode, so they run in the none run only.
child_test = pytest.mark.skipif(os.environ.get("VKDEV_HOST_ACCESS", "none") != "none",
                                reason="registration: tested in the VKDEV_HOST_ACCESS=none run")


def _child(code, env=None):
    e = {**os.environ, **(env or {})}
    r = subprocess.run([sys.executable, "-W", "always", "-c",
                        "import torch, torch_vkdev\n" + textwrap.dedent(code)],
                       capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Overriding a previously registered kernel" not in r.stdout + r.stderr, r.stderr
    return r


@child_test
def test_vkdev_native_kernels_0_leaves_them_unregistered_and_a_bad_value_says_so():
    code = """
        x = torch.ones(8, device='vkdev')
        print('enabled', torch.ops.vkdev_kernels.enabled(), 'sum', (x + x).sum().item(),
              'launches', torch.ops.vkdev_kernels.launches())
        for op in ['aten::add.Tensor', 'aten::mm', 'aten::add_.Tensor']:
            line = [l for l in torch._C._dispatch_dump(op).splitlines() if l.startswith('PrivateUse1')]
            print(op, 'vkdev_kernels.cpp' in ' '.join(line))
    """
    r = _child(code)
    assert "enabled True sum 16.0 launches 2" in r.stdout, r.stdout
    for op in ["aten::add.Tensor", "aten::mm", "aten::add_.Tensor"]:
        assert f"{op} True" in r.stdout, r.stdout
    for value in ("0", "yes"):
        r = _child(code, {"VKDEV_NATIVE_KERNELS": value})
        assert "enabled False sum 16.0 launches 0" in r.stdout, r.stdout
        assert "aten::mm False" in r.stdout, r.stdout
    assert "VKDEV_NATIVE_KERNELS='yes': expected 0 or 1" in r.stderr, r.stderr
