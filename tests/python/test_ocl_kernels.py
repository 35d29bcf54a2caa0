"""ocl's native OpenCL kernels (examples/opencl/opencl_kernels.cpp, through the vendor-kernel
API of include/accelkit/torch/kernels.hpp): each against the CPU, broadcast, strided and at
edge sizes (0 elements, 1, odd), counted (torch.ops.ocl_kernels.launches) so that a silent
fallback fails; what they do not take goes to the fallback and still equals the CPU; the
kernels queue in order on a held non-default stream; the MLP training step equals the CPU's
with the native kernels doing its matrix products, activations and bias sums; a failed
program build is one clear RuntimeError; OCL_NATIVE_KERNELS=0 turns them off."""
import os
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from backend import DEV
import native_kernels

if DEV != "ocl":
    pytest.skip("ocl's native OpenCL kernels", allow_module_level=True)

import torch_ocl  # noqa: E402,F401

KOPS = torch.ops.ocl_kernels
if not KOPS.enabled():  # python.ocl.svm_*; python.ocl.native_kernels_* run this file
    pytest.skip("OCL_NATIVE_KERNELS=0: the native kernels are not registered",
                allow_module_level=True)

EXACT, CLOSE = native_kernels.EXACT, native_kernels.CLOSE
_gen, _randn, _special = native_kernels.gen, native_kernels.randn, native_kernels.special
_check = native_kernels.checker(KOPS)


ELEMENTWISE_SHAPES = [
    ((1000,), (1000,)),
    ((7,), (7,)),            # odd
    ((1,), (1,)),
    ((0,), (0,)),
    ((0, 3), (1, 3)),        # empty, broadcast
    ((), ()),                # 0-dim
    ((5, 1), (1, 7)),        # both broadcast
    ((3, 4), (4,)),          # a bias row
    ((2, 3, 4, 5), (3, 1, 5)),
    ((33, 17), ()),          # a 0-dim device tensor
]


@pytest.mark.parametrize("sa,sb", ELEMENTWISE_SHAPES)
@pytest.mark.parametrize("op", ["add", "mul"])
def test_add_and_mul_equal_the_cpu(op, sa, sb):
    a, b = _special(_randn(*sa, seed=1)), _randn(*sb, seed=2)
    n = 0 if torch.broadcast_shapes(sa, sb).numel() == 0 else 1
    _check(op, getattr(torch, op), a, b, launched=n)


def test_strided_inputs_and_scalars():
    a, b = _randn(17, 33, seed=3), _randn(33, 17, seed=4)
    _check("add", lambda x, y: x + y.t(), a, b)                 # transposed
    _check("add", lambda x, y: x.t() + y, a, b)                 # output keeps x.t()'s layout
    _check("mul", lambda x, y: x[::2, 1::3] * y.t()[::2, 1::3], a, b)   # sliced
    _check("add", lambda x, y: x[:, :1].expand(17, 33) + x, a, b)       # expanded
    _check("add", lambda x, y: torch.add(x, x, alpha=0.5), a, b, tol=CLOSE)
    _check("add", lambda x, y: x + 2.5, a, b)                   # a Python number
    _check("add", lambda x, y: torch.add(x, 3, alpha=-2), a, b)
    _check("mul", lambda x, y: x * -0.75, a, b)
    _check("mul", lambda x, y: 3 * x, a, b)
    got = (a.to(DEV).t() + b.to(DEV))
    assert got.stride() == (a.t() + b).stride()


@pytest.mark.parametrize("shape", [(1000,), (7,), (1,), (0,), (), (13, 9)])
def test_relu_and_threshold_backward_equal_the_cpu(shape):
    x, g = _special(_randn(*shape, seed=5)), _randn(*shape, seed=6)
    n = 0 if x.numel() == 0 else 1
    _check("relu", torch.relu, x, launched=n)
    tb = torch.ops.aten.threshold_backward
    _check("threshold_backward", lambda gg, xx: tb(gg, xx, 0.0), g, x, launched=n)
    _check("threshold_backward", lambda gg, xx: tb(gg, xx, 0.25), g, x, launched=n)


def test_relu_and_threshold_backward_strided_and_broadcast():
    x, g = _randn(40, 25, seed=7), _randn(25, 40, seed=8)
    _check("relu", lambda t: t.t().relu(), x)
    tb = torch.ops.aten.threshold_backward
    _check("threshold_backward", lambda gg, xx: tb(gg.t(), xx, 0.0), g, x)
    _check("threshold_backward", lambda gg, xx: tb(gg[:1].t(), xx, 0.0), g, x)


MM_SHAPES = [(1, 1, 1), (7, 13, 5), (128, 64, 256), (33, 17, 1), (0, 3, 4), (3, 0, 4), (17, 16, 16)]


@pytest.mark.parametrize("m,k,n", MM_SHAPES)
def test_mm_and_addmm_equal_the_cpu(m, k, n):
    a, b = _randn(m, k, seed=9), _randn(k, n, seed=10)
    bias_row, bias_full = _randn(n, seed=11), _randn(m, n, seed=12)
    launched = 0 if m * n == 0 else 1
    _check("mm", torch.mm, a, b, launched=launched, tol=CLOSE)
    _check("addmm", torch.addmm, bias_row, a, b, launched=launched, tol=CLOSE)
    _check("addmm", lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=-2.0), bias_full, a, b,
           launched=launched, tol=CLOSE)


def test_mm_of_transposed_and_sliced_operands():
    a, b = _randn(64, 96, seed=13), _randn(48, 64, seed=14)
    _check("mm", lambda x, y: torch.mm(y, x), a, b, tol=CLOSE)
    _check("mm", lambda x, y: torch.mm(x.t(), y.t()), a, b, tol=CLOSE)     # both transposed
    _check("mm", lambda x, y: torch.mm(x[::2, 5:50], y.t()[5:50, ::3]), a, b, tol=CLOSE)
    # beta 0 ignores the bias, NaN included, as the CPU does.
    nan_bias = torch.full((48,), float("nan"))
    _check("addmm", lambda c, x, y: torch.addmm(c, x.t(), y.t(), beta=0), nan_bias, a, b, tol=CLOSE)
    strided_bias = _randn(48, 3, seed=22).t()     # (3, 48), strides (1, 3)
    _check("addmm", lambda c, x, y: torch.addmm(c[:1], x.t(), y.t()), strided_bias, a, b, tol=CLOSE)


@pytest.mark.parametrize("bias_shape,view", [
    ((), None), ((9,), None), ((1, 9), None), ((6, 1), None), ((6, 9), None),
    ((9,), "expand"),        # (6, 9) with strides (0, 1)
    ((6, 1), "expand"),      # (6, 9) with strides (1, 0)
    ((9, 6), "t"),           # (6, 9) with strides (1, 6)
    ((6, 18), "step"),       # (6, 9) with strides (18, 2)
])
def test_addmm_broadcast_and_strided_bias(bias_shape, view):
    a, b = _randn(6, 5, seed=23), _randn(5, 9, seed=24)
    bias = _randn(*bias_shape, seed=25)
    shape = {None: lambda c: c, "expand": lambda c: c.expand(6, 9), "t": lambda c: c.t(),
             "step": lambda c: c[:, ::2]}[view]
    _check("addmm", lambda c, x, y: torch.addmm(shape(c), x, y), bias, a, b, tol=CLOSE)
    _check("addmm", lambda c, x, y: torch.addmm(shape(c), x, y, beta=-1.5, alpha=0.25),
           bias, a, b, tol=CLOSE)


def _dispatcher_calls(f):
    """The operators f() calls through the dispatcher, nested calls included."""
    from torch.profiler import ProfilerActivity, profile
    torch.ocl.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        f()
    torch.ocl.synchronize()
    return sorted(e.name for e in prof.events())


def _operands():
    x, w = _randn(6, 5, seed=26).to(DEV), _randn(9, 5, seed=28).to(DEV)
    row, bias = _randn(5, seed=27).to(DEV), _randn(9, seed=29).to(DEV)
    return dict(x=x, xt=x.t(), wt=w.t(), row=row, col=_randn(6, 1).to(DEV),
                row6=_randn(1, 6).to(DEV), bias=bias, bias0=bias.expand(6, 9), bias1=bias[:1])


NO_DISPATCH = {  # case: (kernel, operator, operand names, extra arguments)
    "add_broadcast": ("add", torch.add, ("x", "row"), {}),
    "add_transposed": ("add", torch.add, ("xt", "row6"), {}),
    "add_alpha": ("add", torch.add, ("x", "row"), dict(alpha=2)),
    "mul_column": ("mul", torch.mul, ("x", "col"), {}),
    "mul_float": ("mul", lambda t: torch.mul(t, 2.5), ("x",), {}),
    "add_int": ("add", lambda t: torch.add(t, 3, alpha=2), ("x",), {}),
    "add_bool": ("add", lambda t: t + True, ("x",), {}),
    "relu": ("relu", torch.relu, ("xt",), {}),
    "threshold_backward": ("threshold_backward", torch.ops.aten.threshold_backward,
                           ("x", "row"), dict(threshold=0.0)),
    "mm": ("mm", torch.mm, ("x", "wt"), {}),
    "addmm_linear": ("addmm", torch.addmm, ("bias", "x", "wt"), {}),
    "addmm_stride0": ("addmm", torch.addmm, ("bias0", "x", "wt"), {}),
    "addmm_one": ("addmm", torch.addmm, ("bias1", "x", "wt"), {}),
    "sum": ("sum", torch.sum, ("x",), {}),
    "sum_dim": ("sum", torch.sum, ("xt",), dict(dim=0)),
}


@pytest.mark.parametrize("case", sorted(NO_DISPATCH))
def test_kernels_make_no_views_or_outputs_through_the_dispatcher(case):
    # The output comes from empty_generic/empty_strided_generic on the allocator and broadcast
    # strides are computed, a Python number is read from its wrapped tensor: the operator's own
    # aten:: call is the only dispatcher call (no aten::empty*, expand or its as_strided, item
    # or its _local_scalar_dense per call).
    kernel, f, names, kwargs = NO_DISPATCH[case]
    ops = _operands()
    args = [ops[n] for n in names]
    n0 = KOPS.launches(kernel)
    calls = _dispatcher_calls(lambda: f(*args, **kwargs))
    assert KOPS.launches(kernel) - n0 == 1, kernel
    assert calls == [f"aten::{kernel}"], calls


SUMS = [
    ((1000,), None, False), ((7,), 0, False), ((1,), None, False), ((0,), None, False),
    ((0, 4), 0, False), ((4, 0), 1, True), ((), None, False), ((), 0, True),
    ((128, 256), 0, True), ((128, 256), 1, False), ((3, 5, 7), (0, 2), False),
    ((3, 5, 7), -1, True), ((2, 3, 4, 5), (1, 3), True),
]


@pytest.mark.parametrize("shape,dim,keepdim", SUMS)
def test_sum_equals_the_cpu(shape, dim, keepdim):
    x = _randn(*shape, seed=15)
    out_numel = (x.sum() if dim is None else x.sum(dim, keepdim=keepdim)).numel()
    f = (lambda t: t.sum()) if dim is None else (lambda t: t.sum(dim, keepdim=keepdim))
    _check("sum", f, x, launched=1 if out_numel else 0, tol=CLOSE)


def test_sum_strided_and_with_dtype():
    x = _randn(64, 48, seed=16)
    _check("sum", lambda t: t.t().sum(0), x, tol=CLOSE)
    _check("sum", lambda t: t[::3, 1::2].sum((0, 1)), x, tol=CLOSE)
    _check("sum", lambda t: t.sum(dtype=torch.float32), x, tol=CLOSE)
    _check("sum", lambda t: _special(t).sum(1), x, tol=CLOSE)


def test_sum_is_as_accurate_as_the_cpus_and_keeps_infinities():
    # A serial float32 sum of 2^20 values drifts (by 3e5 here); the kernel's compensated
    # sum gives the exact value, as the CPU's cascade summation does.
    n = 1 << 20
    x = torch.arange(n, dtype=torch.float32)
    got = _check("sum", torch.sum, x, tol=EXACT)
    assert got.item() == float((n - 1) * n // 2)
    _check("sum", lambda t: t.view(1024, 1024).sum(1), x, tol=EXACT)
    y = torch.tensor([[float("inf"), 1.0, 2.0], [float("-inf"), 1.0, 1e30],
                      [float("nan"), 0.0, 0.0], [float("inf"), float("-inf"), 1.0]])
    _check("sum", lambda t: t.sum(1), y, tol=EXACT)


def test_what_the_kernels_do_not_take_falls_back_and_equals_the_cpu():
    x64, i64 = _randn(9, 4, seed=17).double(), torch.arange(36).view(9, 4)
    h = _randn(9, 4, seed=18).half()
    cases = [("add", torch.add, (x64, x64)), ("add", torch.add, (i64, i64)),
             ("add", lambda a, b: a + b, (h, h)), ("mul", torch.mul, (i64, 3)),
             ("mul", lambda a, b: a * b, (x64.float(), x64)),     # float32 * float64: promotes
             ("add", lambda a: a + (1 + 2j), (x64.float(),)),
             ("relu", torch.relu, (i64,)), ("mm", torch.mm, (x64, x64.t())),
             ("addmm", torch.addmm, (x64[0], x64.t(), x64)),
             ("sum", lambda a: a.sum(0), (i64,)),
             ("sum", lambda a: a.sum(dtype=torch.float64), (x64.float(),))]
    for kernel, f, args in cases:
        _check(kernel, f, *args, launched=0, tol=CLOSE)
    # ...and the fallback raises what the CPU raises for what is wrong.
    x = torch.ones(3, 4, device=DEV)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(x, x)
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.sum(5)
    with pytest.raises(RuntimeError, match="must match the size"):
        x + torch.ones(5, device=DEV)


def test_kernels_queue_in_order_on_a_held_side_stream():
    a = torch.arange(4096, dtype=torch.float32, device=DEV)
    b = torch.full((4096,), 0.5, device=DEV)
    torch.ocl.synchronize()
    side = torch.ocl.Stream()
    n0 = KOPS.launches()
    with torch.ocl.stream(side):
        gate = KOPS.hold()
        c = torch.relu(a * b + b)      # three kernels behind the gate
        d = c.sum()
    try:
        assert not side.query()        # the kernels wait behind the gate...
        assert torch.ocl.current_stream().query()    # ...on the side stream's queue only
        ev = torch.ocl.Event()
        ev.record(side)
        assert not ev.query()
    finally:
        KOPS.release(gate)
    side.synchronize()
    assert side.query() and ev.query()
    assert KOPS.launches() - n0 == 4
    want = torch.relu(torch.arange(4096.) * 0.5 + 0.5)
    torch.testing.assert_close(c.cpu(), want, **EXACT)
    torch.testing.assert_close(d.cpu(), want.sum(), **CLOSE)


def test_a_kernel_runs_on_its_own_stream_while_the_default_stream_is_held():
    # Queued on the side stream, the kernel completes while the default stream is held:
    # a kernel enqueued on the wrong queue would leave d unwritten.
    a = torch.full((1000,), 3.0, device=DEV)
    torch.ocl.synchronize()
    gate = KOPS.hold()
    try:
        side = torch.ocl.Stream()
        with torch.ocl.stream(side):
            d = torch.mm(a.view(10, 100), a.view(100, 10))
            side.synchronize()
            got = d.cpu()
        assert not torch.ocl.current_stream().query()
    finally:
        KOPS.release(gate)
    torch.ocl.synchronize()
    torch.testing.assert_close(got, torch.full((10, 10), 900.0), **EXACT)


def test_inputs_of_a_queued_kernel_on_a_side_stream_are_not_reused_early():
    n = 1 << 16
    a = torch.full((n,), 1.0, device=DEV)
    b = torch.full((n,), 2.0, device=DEV)
    torch.ocl.synchronize()
    side = torch.ocl.Stream()
    with torch.ocl.stream(side):
        gate = KOPS.hold()
        c = a + b
    try:
        del a, b
        junk = [torch.full((n,), 100.0, device=DEV) for _ in range(4)]
        torch.ocl.current_stream().synchronize()
    finally:
        KOPS.release(gate)
    side.synchronize()
    assert sorted(set(c.cpu().tolist())) == [3.0]
    del junk


def test_kernels_from_several_threads_equal_the_cpu():
    x = _randn(64, 64, seed=19)
    want = torch.relu(x @ x + x).sum(0)
    errors, results = [], []

    def work():
        try:
            s = torch.ocl.Stream()
            with torch.ocl.stream(s):
                xd = x.to(DEV)
                for _ in range(20):
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
    import copy
    import torch.nn.functional as F
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 48), torch.nn.ReLU(),
                                torch.nn.Linear(48, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 5))
    dev_model = copy.deepcopy(model).to(DEV)
    x, y = _randn(33, 20, seed=20), torch.randint(0, 5, (33,), generator=_gen(21))
    xd, yd = x.to(DEV), y.to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dev_opt = torch.optim.SGD(dev_model.parameters(), lr=0.1)
    names = ["addmm", "mm", "relu", "threshold_backward", "sum"]
    before = {k: KOPS.launches(k) for k in names}
    for _ in range(5):
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
    # Per step: 3 addmm forward, 2 relu, 2 threshold_backward, 3 bias sums, and the
    # weight and input gradients (5 mm: the first layer's input needs none).
    assert ran == {"addmm": 15, "relu": 10, "threshold_backward": 10, "sum": 15, "mm": 25}, ran
    for p, q in zip(model.parameters(), dev_model.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)


# The tests below start a child process each (the knobs are read at the library's load):
# they test the registration and the build, the same in both SVM kinds, so they run in the
# fine-grained run only, to keep python.ocl.svm_coarse short.
child_test = pytest.mark.skipif(os.environ.get("OCL_SVM") == "coarse",
                                reason="registration and build: tested in the fine-grained run")


def _child(code, env=None):
    e = {**os.environ, **(env or {})}
    r = subprocess.run([sys.executable, "-W", "always", "-c",
                        "import torch, torch_ocl\n" + textwrap.dedent(code)],
                       capture_output=True, text=True, env=e, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Overriding a previously registered kernel" not in r.stdout + r.stderr, r.stderr
    return r


@child_test
def test_a_failed_program_build_is_one_clear_runtime_error_and_the_backend_stays_usable():
    r = _child("""
        x = torch.ones(8, device='ocl')
        msgs = []
        for _ in range(2):
            try:
                x + x
            except RuntimeError as e:
                msgs.append(str(e))
        print('same', len(msgs) == 2 and msgs[0] == msgs[1])
        print('first', msgs[0].splitlines()[0])
        print('log', 'build log' in msgs[0])
        print('sub', (x - x).cpu().sum().item(), 'cpu', x.cpu().sum().item())
    """, {"OCL_KERNEL_BUILD_OPTIONS": "-Dfloat=no_such_type"})
    first = [l for l in r.stdout.splitlines() if l.startswith("first ")][0]
    assert first.startswith("first ocl: building the native OpenCL kernels for device 0 failed: "
                            "clBuildProgram: CL_BUILD_PROGRAM_FAILURE"), first
    assert first.count("ocl:") == 1, first
    assert "same True" in r.stdout and "log True" in r.stdout, r.stdout
    assert "sub 0.0 cpu 8.0" in r.stdout, r.stdout
    assert "two vendor kernels" not in r.stderr, r.stderr


@child_test
def test_ocl_native_kernels_0_leaves_them_unregistered_and_a_bad_value_says_so():
    code = """
        x = torch.ones(8, device='ocl')
        print('enabled', torch.ops.ocl_kernels.enabled(), 'sum', (x + x).sum().item(),
              'launches', torch.ops.ocl_kernels.launches())
    """
    r = _child(code, {"OCL_NATIVE_KERNELS": "0"})
    assert r.stdout.split()[-6:] == ["enabled", "False", "sum", "16.0", "launches", "0"], r.stdout
    r = _child(code, {"OCL_NATIVE_KERNELS": "yes"})
    assert "OCL_NATIVE_KERNELS='yes': expected 0 or 1" in r.stderr, r.stderr
    assert r.stdout.split()[-6:] == ["enabled", "False", "sum", "16.0", "launches", "0"], r.stdout


@child_test
def test_a_second_vendor_kernel_for_one_operator_is_reported_and_the_first_stays():
    # OCL_TEST_SECOND_RELU=1 registers a second `relu` (opencl_test_ops.cpp, returning its
    # input unchanged): refused with an error naming both places, through the
    # diagnostics hook (a warning at import); the native relu stays, and the native
    # kernels replaced the SDK's without PyTorch's override warning (_child checks).
    r = _child("""
        x = torch.tensor([-1.0, 2.0], device='ocl')
        n0 = torch.ops.ocl_kernels.launches('relu')
        print('relu', torch.relu(x).cpu().tolist(), torch.ops.ocl_kernels.launches('relu') - n0)
        for op in ['aten::add.Tensor', 'aten::mm', 'aten::sum.dim_IntList', 'aten::relu']:
            line = [l for l in torch._C._dispatch_dump(op).splitlines() if l.startswith('PrivateUse1')]
            print(op, 'opencl_kernels.cpp' in ' '.join(line), len(line))
    """, {"OCL_TEST_SECOND_RELU": "1"})
    assert "two vendor kernels for aten::relu: at " in r.stderr, r.stderr
    line = [l for l in r.stderr.splitlines() if "two vendor kernels" in l][0]
    assert "opencl_kernels.cpp:" in line and "opencl_test_ops.cpp:" in line, line
    assert "relu [0.0, 2.0] 1" in r.stdout, r.stdout
    for op in ["aten::add.Tensor", "aten::mm", "aten::sum.dim_IntList", "aten::relu"]:
        assert f"{op} True 1" in r.stdout, r.stdout


def test_the_benchmarks_direct_enqueue_equals_the_cpu_and_a_bad_track_names_itself():
    # torch.ops.ocl_kernels.add_directly, bench/opencl_bench.py's baseline: the native add
    # enqueued with raw OpenCL calls, without and with the runtime's per-launch tracking
    # (track: 1 an event per launch, 2 a clFlush, 3 both).
    a, b = _randn(1000, seed=23), _randn(1000, seed=24)
    ad, bd = a.to(DEV), b.to(DEV)
    for track in range(4):
        out = torch.empty(1000, device=DEV)
        KOPS.add_directly(ad, bd, out, 3, track)
        torch.ocl.synchronize()  # the direct enqueues bypass the stream's last command
        torch.testing.assert_close(out.cpu(), a + b, **EXACT)
    with pytest.raises(ValueError, match="track=4: expected 0, 1"):
        KOPS.add_directly(ad, bd, torch.empty(1000, device=DEV), 1, 4)
