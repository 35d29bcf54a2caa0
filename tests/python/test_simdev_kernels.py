"""Vendor kernels (include/accelkit/torch/kernels.hpp) on simdev: its native float32
kernels (examples/simdev/simdev_kernels.cpp: add, mul and their in-place forms, relu,
threshold_backward, gelu and its backward, mm, addmm, sum over dims) run on the current
stream's queue, asynchronously, and equal the CPU's results, with any strides (the
transposed views autograd passes) and the shapes of a Linear layer's forward and
backward; a graph captures them and replays them reading memory at run time; they
replace the SDK's kernels without PyTorch's override warning; `div.Tensor` opts out
of its host kernel alone.

The kernels are registered at the library's load when SIMDEV_NATIVE_KERNELS=1, so each
test runs in a child process."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

if os.environ.get("ACCELKIT_TEST_BACKEND", "simdev") != "simdev":
    pytest.skip("simdev's native kernels (SIMDEV_NATIVE_KERNELS)", allow_module_level=True)

HOST_VISIBLE = os.environ.get("SIMDEV_HOST_VISIBLE", "1") != "0"
OVERRIDE_WARNING = "Overriding a previously registered kernel"
# The operators simdev_kernels.cpp registers (div.Tensor: the CPU fallback).
REGISTERED = ["aten::add.Tensor", "aten::add_.Tensor", "aten::mul.Tensor", "aten::mul_.Tensor",
              "aten::relu", "aten::threshold_backward", "aten::gelu", "aten::gelu_backward",
              "aten::mm", "aten::addmm", "aten::sum.dim_IntList", "aten::div.Tensor"]


def _run(code, native="1"):
    env = {**os.environ, "SIMDEV_NATIVE_KERNELS": native}
    r = subprocess.run([sys.executable, "-c", "import torch, torch_simdev\n" + textwrap.dedent(code)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_native_add_and_relu_run_on_simdev_and_equal_the_cpu():
    r = _run("""
        g = torch.Generator().manual_seed(5)
        a, b = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
        a[3] = float('nan')
        launches = torch.ops.simdev_driver.launches
        n0 = launches()
        s = (a.to('simdev') + b.to('simdev')).cpu()
        r = torch.relu(a.to('simdev')).cpu()
        n1 = launches()
        torch.testing.assert_close(s, a + b, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(r, torch.relu(a), rtol=0, atol=0, equal_nan=True)
        # What the kernels do not take goes to the CPU fallback, and equals the CPU too.
        x = torch.randint(-9, 9, (5, 7), generator=g)
        for f, args in [(torch.add, (x, x)), (torch.add, (a.double(), b.double())),
                        (lambda p, q: torch.add(p, q, alpha=0.5), (a, b)), (torch.relu, (x,)),
                        (torch.relu, (a.double(),))]:
            got = f(*[t.to('simdev') for t in args]).cpu()
            torch.testing.assert_close(got, f(*args), rtol=0, atol=0, equal_nan=True)
        print('launches', n1 - n0, launches() - n1)
    """)
    assert r.stdout.split()[-3:] == ["launches", "2", "0"], r.stdout + r.stderr


def test_each_native_kernel_equals_the_cpu_with_any_strides():
    # Each case: the kernel's launches (0: the CPU fallback takes the arguments; clone
    # is a copy, not a launch) and the tolerance (products and sums add in another
    # order than the CPU's).
    r = _run("""
        import json
        import torch.nn.functional as F
        aten = torch.ops.aten
        g = torch.Generator().manual_seed(7)
        def r(*shape):
            return torch.randn(*shape, generator=g)
        a, b, big = r(5, 7), r(5, 7), r(12, 20)
        a[1, 2] = float('nan')
        exact, close, matrix = (0.0, 0.0), None, (1e-4, 1e-4)
        cases = {
            'add': (torch.add, (a, b), 1, exact),
            'add transposed': (lambda p, q: p.t() + q.t(), (a, b), 1, exact),
            'add row broadcast': (torch.add, (a, r(7)), 1, exact),
            'add outer broadcast': (torch.add, (r(5, 1), r(1, 7)), 1, exact),
            'add python float': (lambda p: p + 2.5, (a,), 1, exact),
            'add python int': (lambda p: p + 2, (a,), 1, exact),
            'add 0-dim device tensor': (torch.add, (a, r(())), 1, exact),
            'add sliced': (lambda p: p[::2, 3:] + p[1::2, :-3], (big,), 1, exact),
            'mul': (torch.mul, (a, b), 1, exact),
            'mul transposed and contiguous': (lambda p, q: p.t() * q, (a, r(7, 5)), 1, exact),
            'mul python float': (lambda p: p * 0.25, (a,), 1, exact),
            'mul column broadcast': (torch.mul, (a, r(5, 1)), 1, exact),
            'add_ broadcast': (lambda p, q: p.clone().add_(q), (a, r(7)), 1, exact),
            'add_ into a transposed view': (lambda p, q: p.clone().t().add_(q), (a, r(7, 5)), 1,
                                            exact),
            'add_ itself': (lambda p: p.clone().add_(p), (b,), 1, exact),
            'mul_ python float': (lambda p: p.clone().mul_(3.0), (a,), 1, exact),
            'relu': (torch.relu, (a,), 1, exact),
            'relu transposed': (lambda p: p.t().relu(), (a,), 1, exact),
            'relu expanded': (lambda p: p.expand(4, 7).relu(), (r(7),), 1, exact),
            'threshold_backward': (lambda p, q: aten.threshold_backward(p, q, 0), (a, b), 1,
                                   exact),
            'threshold_backward 0.5 broadcast grad': (
                lambda p, q: aten.threshold_backward(p.expand(5, 7), q, 0.5), (r(1, 7), b), 1,
                exact),
            'gelu': (F.gelu, (big,), 1, close),
            'gelu tanh': (lambda p: F.gelu(p, approximate='tanh'), (big.t(),), 1, close),
            'gelu_backward': (lambda p, q: aten.gelu_backward(p, q), (big, r(12, 20)), 1, close),
            'gelu_backward tanh': (lambda p, q: aten.gelu_backward(p, q, approximate='tanh'),
                                   (big, r(12, 20)), 1, close),
            'mm': (torch.mm, (r(6, 9), r(9, 4)), 1, matrix),
            'mm first transposed': (lambda p, q: p.t().mm(q), (r(9, 6), r(9, 4)), 1, matrix),
            'mm second transposed': (lambda p, q: p.mm(q.t()), (r(6, 9), r(4, 9)), 1, matrix),
            'mm both transposed': (lambda p, q: p.t().mm(q.t()), (r(9, 6), r(4, 9)), 1, matrix),
            'mm strided slices': (lambda p, q: p[::2, 1:10].mm(q[:9, ::3]), (big, big.t()), 1,
                                  matrix),
            'mm large k': (torch.mm, (r(3, 700), r(700, 5)), 1, matrix),
            'addmm row bias': (lambda c, p, q: torch.addmm(c, p, q), (r(4), r(6, 9), r(9, 4)), 2,
                               matrix),
            'addmm full bias': (lambda c, p, q: torch.addmm(c, p, q.t()),
                                (r(6, 4), r(6, 9), r(4, 9)), 2, matrix),
            'addmm column bias': (lambda c, p, q: torch.addmm(c, p.t(), q),
                                  (r(6, 1), r(9, 6), r(9, 4)), 2, matrix),
            'addmm 0-dim bias': (lambda c, p, q: torch.addmm(c, p, q), (r(()), r(6, 9), r(9, 4)),
                                 2, matrix),
            'sum dim 0': (lambda p: p.sum(0), (big,), 1, close),
            'sum transposed': (lambda p: p.t().sum(1), (big,), 1, close),
            'sum dims keepdim': (lambda p: p.sum((0, 2), keepdim=True), (r(4, 5, 6),), 1, close),
            'sum negative dim': (lambda p: p.sum(-1), (r(4, 5, 6),), 1, close),
            'sum all': (lambda p: p.sum(), (r(4, 5, 6),), 1, close),
            'sum of a 0-dim tensor': (lambda p: p.sum(0), (r(()),), 1, close),
            'sum expanded': (lambda p: p.expand(3, 4).sum(1), (r(3, 1),), 1, close),
            # What the kernels do not take: the CPU fallback.
            'add alpha': (lambda p, q: torch.add(p, q, alpha=2), (a, b), 0, exact),
            'mul float64': (torch.mul, (a.double(), b.double()), 0, exact),
            'add_ alpha': (lambda p, q: p.clone().add_(q, alpha=2), (a, b), 0, exact),
            'gelu float64': (F.gelu, (a.double(),), 0, close),
            'mm float64': (torch.mm, (r(6, 9).double(), r(9, 4).double()), 0, close),
            'addmm beta': (lambda c, p, q: torch.addmm(c, p, q, beta=0.5),
                           (r(4), r(6, 9), r(9, 4)), 0, matrix),
            'sum to float64': (lambda p: p.sum(0, dtype=torch.float64), (big,), 0, close),
            'sum of integers': (lambda p: p.sum(0), (torch.arange(12).view(3, 4),), 0, exact),
        }
        launches = torch.ops.simdev_driver.launches
        seen = {}
        for name, (f, args, _, tol) in cases.items():
            on_device = [t.to('simdev') for t in args]
            n0 = launches()
            got = f(*on_device)
            seen[name] = launches() - n0
            rtol, atol = tol if tol else (None, None)
            torch.testing.assert_close(got.cpu(), f(*args), rtol=rtol, atol=atol,
                                       equal_nan=True, msg=lambda m: name + ': ' + m)
        print(json.dumps({'expected': {n: c[2] for n, c in cases.items()}, 'seen': seen}))
    """)
    result = json.loads(r.stdout.splitlines()[-1])
    assert result["seen"] == result["expected"], r.stdout
    assert len(result["seen"]) >= 40


# Ends a child that ran a backward pass on the device without finalizing the
# interpreter: PyTorch's autograd device thread may drop its last reference to the
# finished backward's thread-local state (Python objects such as a dispatch mode) while
# the interpreter finalizes, and the thread then aborts the process ("terminate called
# without an active exception") after every check has passed.
QUIET_EXIT = """
    import os, sys
    sys.stdout.flush()
    os._exit(0)
"""

LINEAR_STEP = """
    import copy
    from torch.utils._python_dispatch import TorchDispatchMode
    launches = torch.ops.simdev_driver.launches

    class Log(TorchDispatchMode):  # each operator the backend runs, with its launches
        def __init__(self):
            super().__init__()
            self.calls = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            n0 = launches()
            out = func(*args, **(kwargs or {}))
            self.calls.append((func.name(), launches() - n0))
            return out

    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 24, bias=False), torch.nn.GELU(),
                                torch.nn.Linear(24, 8))
    twin = copy.deepcopy(model).to('simdev')
"""


@pytest.mark.parametrize("batch", [1, 4])
def test_a_linear_models_forward_and_backward_run_on_native_kernels_alone(batch):
    # Forward, then two backward passes (the second accumulates into .grad): every
    # operator with a result to compute launches a native kernel; the rest are views,
    # copies and allocations.
    r = _run(LINEAR_STEP + f"""
    x, grad = torch.randn({batch}, 16), torch.randn({batch}, 8)
    for _ in range(2):
        model(x).backward(grad)
    with Log() as log:
        out = twin(x.to('simdev'))
        for _ in range(2):
            twin(x.to('simdev')).backward(grad.to('simdev'))
    torch.testing.assert_close(out.cpu(), model(x), rtol=1e-5, atol=1e-5)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-5)
    # Views, copies (AccumulateGrad clones a gradient it cannot take over) and allocations.
    moves = {{'aten::t', 'aten::view', 'aten::detach', 'aten::_to_copy', 'aten::empty_strided',
              'aten::new_empty_strided', 'aten::empty_like', 'aten::copy_', 'aten::clone'}}
    computed = sorted({{name for name, n in log.calls if name not in moves}})
    idle = sorted({{name for name, n in log.calls if name not in moves and n == 0}})
    print('calls', log.calls)
    print('computed', computed)
    print('idle', idle)
    """ + QUIET_EXIT)
    lines = r.stdout.splitlines()
    assert lines[-1] == "idle []", r.stdout
    for op in ["aten::addmm", "aten::mm", "aten::relu", "aten::threshold_backward", "aten::gelu",
               "aten::gelu_backward", "aten::sum.dim_IntList", "aten::add_.Tensor"]:
        assert f"'{op}'" in lines[-2], r.stdout


def test_a_linear_models_step_is_queued_behind_a_held_stream():
    # Forward and backward are all queued: nothing waits for the stream, which stays
    # busy until the gate opens; the results then equal the CPU's.
    r = _run(LINEAR_STEP + """
    x, grad = torch.randn(4, 16), torch.randn(4, 8)
    xd, gd = x.to('simdev'), grad.to('simdev')
    a, b = torch.randn(6, 9), torch.randn(6, 9)
    ad, bd = a.to('simdev'), b.to('simdev')
    torch.simdev.synchronize()
    s = torch.simdev.current_stream()
    gate = torch.ops.simdev_driver.hold(s)
    n0 = launches()
    out = twin(xd)
    grads = torch.autograd.grad(out, list(twin.parameters()), gd)
    extra = [ad.t().mm(bd), (ad * 2.0).sum(1, keepdim=True), ad.clone().mul_(bd)]
    busy = not s.query()
    queued = launches() - n0
    torch.ops.simdev_driver.release(gate)
    s.synchronize()
    expected_out = model(x)
    expected = torch.autograd.grad(expected_out, list(model.parameters()), grad)
    torch.testing.assert_close(out.cpu(), expected_out, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    for got, want in zip(extra, [a.t().mm(b), (a * 2.0).sum(1, keepdim=True), a * b]):
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    print('busy', busy, 'queued', queued > 10, 'idle', s.query())
    """ + QUIET_EXIT)
    assert r.stdout.split()[-6:] == ["busy", "True", "queued", "True", "idle", "True"], \
        r.stdout + r.stderr


def test_every_native_kernel_is_captured_and_replays_reading_memory_at_run_time():
    # A graph (torch.accelerator.Graph) records the kernels' launches without running
    # them; each replay reads the inputs written since, and in-place results build on
    # the previous replay's, as eager calls would.
    r = _run("""
        import torch.nn.functional as F
        aten = torch.ops.aten
        g0 = torch.Generator().manual_seed(11)
        x, w, bias = (torch.randn(*shape, generator=g0).to('simdev')
                      for shape in [(6, 9), (4, 9), (4,)])
        acc = torch.zeros(6, 4, device='simdev')

        def step(x, w, bias, acc):
            h = torch.addmm(bias, x, w.t())
            r = torch.relu(h * 0.5 + 1.0)
            t = aten.threshold_backward(r, h, 0.25)
            e = F.gelu(t) + aten.gelu_backward(t, h, approximate='tanh')
            m = x.t().mm(x)
            acc.add_(e).mul_(0.5)
            return e.sum(0) + m.sum((0, 1), keepdim=True).view(()), acc

        s = torch.Stream(device='simdev')
        launches = torch.ops.simdev_driver.launches
        g = torch.accelerator.Graph()
        with s:
            g.capture_begin()
            n0 = launches()
            out, _ = step(x, w, bias, acc)
            captured = launches() - n0
            g.capture_end()
        s.synchronize()
        untouched = acc.abs().sum().item() == 0
        expected_acc = torch.zeros(6, 4)
        for _ in range(3):
            new = [torch.randn(*t.shape, generator=g0) for t in (x, w, bias)]
            for t, v in zip((x, w, bias), new):
                t.copy_(v)
            torch.simdev.synchronize()
            g.replay()
            torch.accelerator.synchronize()
            expected, expected_acc = step(*new, expected_acc)
            torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(acc.cpu(), expected_acc, rtol=1e-5, atol=1e-5)
        g.reset()
        print('captured', captured, 'untouched', untouched)
    """)
    assert r.stdout.split()[-4:] == ["captured", "15", "untouched", "True"], r.stdout + r.stderr


def test_without_the_knob_the_host_kernels_serve_add():
    r = _run("""
        a = torch.ones(8, device='simdev')
        print('sum', (a + a).sum().item(), 'launches', torch.ops.simdev_driver.launches())
    """, native="0")
    assert r.stdout.split()[-4:] == ["sum", "16.0", "launches", "0"], r.stdout + r.stderr


def test_a_native_kernel_waits_its_turn_on_a_held_stream():
    # The kernel is queued behind the gate: the call returns, the stream is busy and
    # the output is not written until the gate opens.
    r = _run("""
        a = torch.arange(4096, dtype=torch.float32, device='simdev')
        b = torch.full((4096,), 0.5, device='simdev')
        torch.simdev.synchronize()
        s = torch.simdev.current_stream()
        gate = torch.ops.simdev_driver.hold(s)
        c = a + b
        busy = not s.query()
        torch.ops.simdev_driver.release(gate)
        s.synchronize()
        assert torch.equal(c.cpu(), torch.arange(4096, dtype=torch.float32) + 0.5)
        print('busy', busy, 'idle', s.query())
    """)
    assert r.stdout.split()[-4:] == ["busy", "True", "idle", "True"], r.stdout + r.stderr


def test_inputs_freed_while_a_kernel_on_another_stream_is_queued_are_not_reused_early():
    # The kernel runs on a side stream (held) and records its inputs' use there: once
    # freed, their blocks must not go to new tensors of the default stream (written
    # at once) before the kernel has read them.
    r = _run("""
        n = 1 << 16
        a = torch.full((n,), 1.0, device='simdev')
        b = torch.full((n,), 2.0, device='simdev')
        torch.simdev.synchronize()
        side = torch.simdev.Stream()
        gate = torch.ops.simdev_driver.hold(side)
        with torch.simdev.stream(side):
            c = a + b
        del a, b
        junk = [torch.full((n,), 100.0, device='simdev') for _ in range(4)]
        torch.simdev.current_stream().synchronize()
        torch.ops.simdev_driver.release(gate)
        side.synchronize()
        print('values', sorted(set(c.cpu().tolist())))
    """)
    assert r.stdout.split()[-2:] == ["values", "[3.0]"], r.stdout + r.stderr


def test_overriding_gives_no_warning_and_the_vendor_kernel_wins():
    r = _run("""
        import re
        for op in %r:
            table = torch._C._dispatch_dump(op)
            line = [l for l in table.splitlines() if l.startswith('PrivateUse1')]
            print(op, 'simdev_kernels.cpp' in ' '.join(line), len(line))
    """ % (REGISTERED,))
    assert OVERRIDE_WARNING not in r.stdout + r.stderr, r.stderr
    for op in REGISTERED:
        assert f"{op} True 1" in r.stdout, r.stdout + r.stderr
    # The check can fail: PyTorch's own override of a kernel the SDK registered says it.
    control = _run("""
        lib = torch.library.Library('aten', 'IMPL')
        lib.impl('relu', lambda x: x, 'PrivateUse1')
    """, native="0")
    assert OVERRIDE_WARNING in control.stdout + control.stderr


def test_div_opts_out_of_its_host_kernel_alone():
    # With host-visible memory a host kernel writes its result on the device (no
    # copy); the CPU fallback computes a CPU result and copies it over.
    r = _run("""
        g = torch.Generator().manual_seed(1)
        a, b = torch.randn(64, 33, generator=g), torch.randn(64, 33, generator=g)
        x, y = a.to('simdev'), b.to('simdev')
        torch.simdev.synchronize()
        copies = torch.ops.simdev_driver.copies
        def copies_of(f):
            c0 = copies()
            out = f(x, y)
            torch.simdev.synchronize()
            n = copies() - c0
            torch.testing.assert_close(out.cpu(), f(a, b), rtol=0, atol=0)
            return n
        print('div', copies_of(torch.div), 'sub', copies_of(torch.sub))
    """)
    div, sub = (int(v) for v in r.stdout.split()[-3::2])
    assert div >= 1, r.stdout
    if HOST_VISIBLE:
        assert sub == 0, r.stdout


def test_an_operator_served_by_a_native_kernel_keeps_its_device_activity():
    # Kernels<R>::enqueued() counts the launch (Note [Device work of an
    # operator]): torch.profiler shows the operator's device activity.
    r = _run("""
        from torch.profiler import ProfilerActivity, profile
        a = torch.randn(4096, device='simdev')
        torch.simdev.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.SIMDEV]) as prof:
            b = torch.relu(a)
            torch.simdev.synchronize()
        pu1 = torch.autograd.DeviceType.PrivateUse1
        print('activities', sorted({e.name for e in prof.events() if e.device_type == pu1}))
        print('launches', torch.ops.simdev_driver.launches())
    """)
    assert "'aten::relu'" in r.stdout and "launches 1" in r.stdout, r.stdout + r.stderr
