"""The host kernels (include/accelkit/torch/host_kernels.hpp): PyTorch's CPU kernels run
directly on simdev memory for the hottest operators. Each result must equal the CPU's
exactly, whatever path serves it: with host-visible memory the host kernel (or, for
arguments it does not take, the fallback), without it the fallback. The suite runs in
both modes (SIMDEV_HOST_VISIBLE=1 and 0)."""
import os
import platform
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from backend import DEV, ENV, MOD, renamed, simdev_capacity, simdev_only

HOST_VISIBLE = os.environ.get(f"{ENV}HOST_VISIBLE", "1") != "0"


def _sim(x):
    return x.to(DEV) if isinstance(x, torch.Tensor) else x


def _same(fn, *args):
    want = fn(*args)
    got = fn(*[_sim(a) for a in args])
    assert got.device.type == DEV
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


g = torch.Generator().manual_seed(3)
A = torch.randn(33, 65, generator=g)
B = torch.randn(33, 65, generator=g)
ROW = torch.randn(65, generator=g)
W = torch.randn(40, 65, generator=g)
I = torch.randint(-9, 9, (33, 65), generator=g)
J = torch.randint(1, 9, (33, 65), generator=g)
X4 = torch.randn(3, 11, 5, 13, generator=g)  # a batch of images
KW = torch.randn(8, 11, 3, 3, generator=g)   # convolution weight
KB = torch.randn(8, generator=g)

CASES = {
    "add": (torch.add, A, B),
    "add broadcast": (torch.add, A, ROW),
    "add alpha": (lambda a, b: torch.add(a, b, alpha=-0.25), A, B),
    "add non-contiguous": (lambda a, b: a.t() + b.t(), A, B),
    "add python scalar": (lambda a: a + 2.5, A),
    "add int": (torch.add, I, J),
    "add float and double (promotes)": (lambda a, b: a + b.double(), A, B),
    "sub": (torch.sub, A, B),
    "mul": (torch.mul, A, B),
    "mul scalar": (lambda a: a * 0.5, A),
    "div": (torch.div, A, B),
    "div int by int (promotes to float)": (torch.div, I, J),
    "relu": (torch.relu, A),
    "relu_": (lambda a: a.clone().relu_(), A),
    "clamp_min": (lambda a: torch.clamp_min(a, 0.25), A),
    "threshold_backward": (lambda gr, a: torch.ops.aten.threshold_backward(gr, a, 0.0), B, A),
    "sum dim 0": (lambda a: a.sum(0), A),
    "sum dim 1 keepdim": (lambda a: a.sum(1, keepdim=True), A),
    "sum all": (lambda a: a.sum(), A),
    "sum to double": (lambda a: a.sum(0, dtype=torch.float64), A),
    # The CPU sums Half and BFloat16 over two reduced dimensions through a
    # float buffer, but only for CPU tensors (they take the fallback).
    "sum of half over dims (1, 3)": (lambda x: (x * 8).half().sum((1, 3)), X4),
    "sum of bfloat16 over dims (0, 2) keepdim": (lambda x: (x * 8).bfloat16().sum((0, 2), keepdim=True), X4),
    "mm": (lambda a, w: a @ w.t(), A, W),
    # The CPU kernel writes a temporary and copies it into the strided out: a
    # device-to-device copy issued inside the host kernel.
    "mm into a transposed out=": (lambda a, w: torch.mm(a, w.t(), out=torch.empty(
        40, 33, device=a.device).t()), A, W),
    "addmm (linear)": (lambda a, w, b: F.linear(a, w, b), A, W, W[:, 0].contiguous()),
    "log_softmax": (lambda a: F.log_softmax(a, 1), A),
    "nll_loss": (lambda a, t: F.nll_loss(F.log_softmax(a, 1), t), A, J[:, 0]),
    "cross_entropy, weighted": (lambda a, t, w: F.cross_entropy(a, t, weight=w), A, J[:, 0], ROW.abs()),
    "add_ in place": (lambda a, b: a.clone().add_(b, alpha=2), A, B),
    "mul_ in place": (lambda a, b: a.clone().mul_(b), A, B),
    "sub_ in place, alpha": (lambda a, b: a.clone().sub_(b, alpha=0.5), A, B),
    "div_ in place": (lambda a, b: a.clone().div_(b), A, B),
    "div_ in place, broadcast": (lambda a, r: a.clone().div_(r), A, ROW),
    # CPU scalar operands: converted to the tensor's dtype first, as the CPU does,
    # unless that would change the result (then the fallback serves them).
    "scalar minus tensor": (lambda a: 2.0 - a, A),
    "add_ python scalar in place": (lambda a: a.clone().add_(0.1), A),
    "mul_ python scalar in place": (lambda a: a.clone().mul_(0.9), A),
    "div by python scalar": (lambda a: a / 3.0, A),
    "int times python int": (lambda i: i * 3, I),
    "int plus python float (promotes)": (lambda i: i + 0.5, I),
    "int divided by python int (promotes)": (lambda i: i / 2, I),
    "zero-dim CPU tensor operand": (lambda a: a * torch.tensor(2.5), A),
    "zero-dim CPU double operand": (lambda a: a + torch.tensor(0.1, dtype=torch.float64), A),
    "zero-dim CPU tensor as self": (lambda a: torch.sub(torch.tensor(1.5), a), A),
    "double tensor times 0.1": (lambda a: a.double() * 0.1, A),
    "half tensor times 0.1 (original precision)": (lambda a: a.half() * 0.1, A),
    "bfloat16 tensor plus 0.3": (lambda a: a.bfloat16() + 0.3, A),
    # Pointwise functions: functional, in place, out=.
    "exp": (torch.exp, A),
    "log": (lambda a: torch.log(a.abs() + 1), A),
    "sqrt": (lambda a: torch.sqrt(a.abs()), A),
    "rsqrt": (lambda a: torch.rsqrt(a.abs() + 0.5), A),
    "tanh": (torch.tanh, A),
    "sigmoid": (torch.sigmoid, A),
    "neg": (torch.neg, A),
    "reciprocal": (lambda a: torch.reciprocal(a + 10), A),
    "exp_ in place": (lambda a: a.clone().exp_(), A),
    "sqrt out=": (lambda a: torch.sqrt(a.abs(), out=torch.empty_like(a)), A),
    "tanh non-contiguous": (lambda a: torch.tanh(a.t()), A),
    "exp of int (promotes to float)": (torch.exp, I),
    "lerp": (lambda a, b: torch.lerp(a, b, 0.1), A, B),
    "lerp_ in place": (lambda a, b: a.clone().lerp_(b, 0.9), A, B),
    "addcmul": (lambda a, b, r: torch.addcmul(a, b, r, value=0.5), A, B, ROW),
    "addcmul_ in place": (lambda a, b: a.clone().addcmul_(b, b, value=-0.1), A, B),
    "addcdiv": (lambda a, b: torch.addcdiv(a, b, b.abs() + 1, value=2), A, B),
    "addcdiv_ in place": (lambda a, b: a.clone().addcdiv_(a, b.abs() + 1e-3, value=-0.01), A, B),
    "mean all": (lambda a: a.mean(), A),
    "mean dim -1 keepdim": (lambda a: a.mean(-1, keepdim=True), A),
    "mean dims (0, 1) to double": (lambda a: a.mean((0, 1), dtype=torch.float64), A),
    "mean of half (the CPU sums in float)": (lambda a: a.half().mean(0), A),
    "mean of complex": (lambda a, b: torch.complex(a, b).mean(1), A, B),
    "adaptive_avg_pool2d to 1x1 (a mean)": (lambda a: F.adaptive_avg_pool2d(a.view(3, 11, 5, 13), 1), A),
    # Convolution reads its inputs through host views (Convolution in torch/convolution.hpp).
    "conv2d with bias": (lambda x, w, b: F.conv2d(x, w, b, padding=1), X4, KW, KB),
    "conv2d of a non-contiguous input": (lambda x, w: F.conv2d(x.transpose(2, 3), w), X4, KW),
    "tanh_backward": (lambda g, a: torch.ops.aten.tanh_backward(g, torch.tanh(a)), B, A),
    "sigmoid_backward": (lambda g, a: torch.ops.aten.sigmoid_backward(g, torch.sigmoid(a)), B, A),
}


@pytest.mark.parametrize("name", list(CASES))
def test_result_equals_the_cpu(name):
    fn, *args = CASES[name]
    _same(fn, *args)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the elementwise host kernels need x86-64 kernel stubs")
def test_elementwise_operators_have_host_kernels():
    for op in ("add_.Tensor", "sub_.Tensor", "mul_.Tensor", "div_.Tensor", "exp", "tanh_",
               "sigmoid.out", "lerp_.Scalar", "addcdiv_", "tanh_backward", "mean.out"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + op, "PrivateUse1"), op


def test_out_variant_resizes_a_wrong_sized_output():
    out = torch.empty(3, device=DEV)
    torch.add(A.to(DEV), B.to(DEV), out=out)
    assert out.shape == A.shape
    torch.testing.assert_close(out.cpu(), A + B, rtol=0, atol=0)


def test_backward_of_every_kernel_matches_the_cpu():
    def grads(device):
        torch.manual_seed(0)
        w = W.clone().to(device).requires_grad_()
        a = A.clone().to(device).requires_grad_()
        t = J[:, 0].to(device)
        h = F.linear(a, w) * 0.5 - 0.1
        loss = F.cross_entropy(torch.relu(h) / 2.0 + torch.tanh(h) * torch.sigmoid(h), t)
        loss.backward()
        return loss.detach().cpu(), w.grad.cpu(), a.grad.cpu()

    for want, got in zip(grads("cpu"), grads(DEV)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_convolution_backward_matches_the_cpu():
    def grads(device):
        x, w, b = (t.clone().to(device).requires_grad_() for t in (X4, KW, KB))
        F.conv2d(x, w, b, padding=1).square().sum().backward()
        return x.grad.cpu(), w.grad.cpu(), b.grad.cpu()

    for want, got in zip(grads("cpu"), grads(DEV)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_convolution_results_are_made_in_device_memory_the_host_addresses():
    # Note [CPU results in device memory] (torch/host_results.hpp): where the host
    # addresses the device's memory directly, the CPU convolution's results are made
    # there and adopted, not copied (no aten::copy_ inside the operator); elsewhere
    # they are copied. Either way nothing the CPU kernels took is kept.
    x, w, b = (t.clone().to(DEV).requires_grad_() for t in (X4, KW, KB))
    MOD.synchronize()
    base = MOD.memory_allocated()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = F.conv2d(x, w, b, padding=1)
        y.square().sum().backward()

    def under(e, names):
        while e is not None:
            if e.name in names:
                return True
            e = e.cpu_parent
        return False

    ops = {"aten::convolution_overrideable", "aten::convolution_backward_overrideable"}
    copies = [e for e in prof.events() if e.name == "aten::copy_" and under(e, ops)]
    direct = MOD.get_device_properties(0).host_access == "direct"
    assert (not copies) == direct, [e.name for e in copies]
    xc, wc, bc = (t.clone().requires_grad_() for t in (X4, KW, KB))
    want = F.conv2d(xc, wc, bc, padding=1)
    want.square().sum().backward()
    torch.testing.assert_close(y.cpu(), want.detach(), rtol=0, atol=0)
    for got, ref in ((x, xc), (w, wc), (b, bc)):
        torch.testing.assert_close(got.grad.cpu(), ref.grad, rtol=0, atol=0)
        got.grad = None
    del y
    MOD.synchronize()
    assert MOD.memory_allocated() == base


@simdev_capacity
def test_a_convolution_out_of_device_memory_raises_and_loses_nothing():
    # Where the host addresses the device's memory directly, the CPU kernel's memory is
    # the device's where it has room, CPU memory otherwise (Note [CPU results in device
    # memory]): a result beyond the cap is out of memory on the device, as it was before;
    # a temporary beyond what is free (256 MiB here) is CPU memory, without an out of
    # memory counted or the cache released.
    x = torch.randn(1, 1, 2048, 2048).to(DEV)
    w = torch.randn(8, 1, 3, 3).to(DEV)
    MOD.synchronize()
    base = MOD.memory_allocated()
    MOD.set_per_process_memory_fraction(0.25, 0)  # 64 of 256 MiB; the result needs 128
    try:
        with pytest.raises(torch.OutOfMemoryError, match=f"{DEV}: out of memory on {DEV}:0"):
            F.conv2d(x, w, padding=1)
        MOD.synchronize()
        assert MOD.memory_allocated() == base
    finally:
        MOD.set_per_process_memory_fraction(1.0, 0)
    ooms = MOD.memory_stats()["num_ooms"]
    got = F.conv2d(x, w, padding=1)
    assert MOD.memory_stats()["num_ooms"] == ooms
    torch.testing.assert_close(got.cpu(), F.conv2d(x.cpu(), w.cpu(), padding=1), rtol=0, atol=0)
    del got
    MOD.synchronize()
    assert MOD.memory_allocated() == base


def test_device_work_queued_inside_a_kernel_is_waited_for():
    # nll_loss_backward zeroes its output on the device (an asynchronous memset on
    # simdev's stream) before its CPU code writes into it. Reused memory holds old
    # values, so a memset that landed late would wipe the result or leave garbage.
    logits = torch.randn(256, 10, generator=g)
    target = torch.randint(0, 10, (256,), generator=g)
    want = torch.autograd.grad(F.cross_entropy(logits.requires_grad_(), target), logits)[0]
    for _ in range(20):
        x = logits.detach().to(DEV).requires_grad_()
        junk = torch.full((256, 10), 7.0, device=DEV)  # fills the cache with non-zeros
        del junk
        got = torch.autograd.grad(F.cross_entropy(x, target.to(DEV)), x)[0]
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_kernels_order_after_work_queued_on_the_current_stream():
    side = torch.Stream(device=DEV)  # no index: the current device
    assert side.device_index == MOD.current_device()
    src = torch.arange(1 << 20, dtype=torch.float32).pin_memory()
    with MOD.stream(side):
        dst = torch.empty(1 << 20, device=DEV)
        dst.copy_(src, non_blocking=True)
        total = (dst + 1).sum()
    torch.accelerator.synchronize()
    assert total.item() == float(((1 << 20) - 1) * (1 << 20) / 2 + (1 << 20))


def test_host_kernels_count_in_the_fallback_report():
    MOD.reset_fallback_report()
    a = A.to(DEV)
    for _ in range(3):
        a + a
    report = {op: count for op, count, _ in MOD.fallback_report()}
    assert report.get("aten::add.Tensor", 0) == 3, report


def test_fallback_policy_error_refuses_host_kernels_too():
    code = """
import torch, torch_simdev
a = torch.ones(4, device='simdev')
try:
    a + a
    print('ran')
except NotImplementedError as e:
    print('refused:', e)
"""
    r = subprocess.run([sys.executable, "-c", renamed(code)], capture_output=True, text=True,
                       env=dict(os.environ, **{ENV + "FALLBACK": "error"}), timeout=120)
    assert f"refused: The operator 'aten::add.Tensor' is not implemented for {DEV}" in r.stdout, \
        r.stdout + r.stderr


@simdev_only
def test_a_driver_fault_while_ordering_a_kernel_is_a_runtime_error_and_nothing_is_lost():
    # The kernel waits for the current stream first; the driver fails that wait once.
    code = """
import torch, torch_simdev
a = torch.ones(4, device='simdev')
for i in range(3):
    try:
        b = a * 2 + 1
        print('ok', b.cpu().tolist())
    except RuntimeError as e:
        print('error:', str(e).splitlines()[0])
del b
print('allocated', torch.simdev.memory_allocated())
"""
    r = subprocess.run([sys.executable, "-c", renamed(code)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, SIMDEV_INJECT_FAULT="stream_synchronize@2"))
    lines = r.stdout.splitlines()
    assert any(l.startswith(f"error: {DEV}: driver error 999 in stream_synchronize")
               for l in lines), r.stdout + r.stderr
    assert lines.count("ok [3.0, 3.0, 3.0, 3.0]") == 2, r.stdout + r.stderr
    assert lines[-1] == "allocated 512", r.stdout + r.stderr  # only `a` (one 512-byte block)


MAPPED = os.environ.get(f"{ENV}HOST_VISIBLE", "1") == "mapped"
mapped_only = pytest.mark.skipif(not MAPPED, reason="simdev's mapped mode (SIMDEV_HOST_VISIBLE=mapped)")


@simdev_only
@mapped_only
def test_mapped_memory_faults_when_the_host_touches_it_outside_a_map():
    # What makes the mapped mode's suite mean something: device memory the SDK
    # did not map is out of the host's reach, so a host path that forgot its
    # map scope dies at once (SIGSEGV) instead of passing.
    code = """
import ctypes, torch, torch_simdev
x = torch.ones(1024, device='simdev')
torch.simdev.synchronize()
print('mapped', torch.simdev.get_device_properties(0).host_access, flush=True)
ctypes.string_at(x.data_ptr(), 16)
print('read without a map', flush=True)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=os.environ)
    assert "mapped mapped" in r.stdout, r.stdout + r.stderr
    assert "read without a map" not in r.stdout, r.stdout + r.stderr
    assert r.returncode == -11, (r.returncode, r.stdout + r.stderr)  # SIGSEGV


@simdev_only
@mapped_only
def test_a_failed_unmap_fails_the_operator_and_the_device_stays_usable():
    # The host's writes reach the device at host_unmap (as OpenCL's coarse
    # SVM at clEnqueueSVMUnmap): an operator whose unmap fails must fail, not
    # report the failure and return a result that may never have landed.
    code = """
import torch, torch_simdev
g = torch.Generator().manual_seed(5)
A, B = torch.randn(33, 65, generator=g), torch.randn(33, 65, generator=g)
a, b = A.to('simdev'), B.to('simdev')
c = torch.empty(33, 65, device='simdev')
m = torch.empty(65, device='simdev')
ops = {'mul': lambda: a * b, 'mul.out': lambda: torch.mul(a, b, out=c),
       'mean.out': lambda: torch.mean(a, 0, out=m), 'cos_': lambda: c.cos_()}
for name, f in ops.items():
    torch.simdev.synchronize()
    torch.ops.simdev_driver.inject_fault('host_unmap', 1)
    try:
        f()
        torch.simdev.synchronize()
        print(name, 'ok')
    except RuntimeError as e:
        print(name, 'error:', str(e).splitlines()[0])
    print(name, 'fired', not torch.ops.simdev_driver.fault_pending('host_unmap'))
    torch.ops.simdev_driver.clear_faults()
r = a * b + a
print('after', torch.equal(r.cpu(), A * B + A))
del a, b, c, m, r, ops, f
torch.simdev.synchronize()
torch.simdev.empty_cache()  # every block back to the driver: none is left mapped
print('driver bytes', torch.ops.simdev_driver.bytes_in_use(0))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=os.environ)
    lines = r.stdout.splitlines()
    for name in ("mul", "mul.out", "mean.out", "cos_"):
        assert f"{name} fired True" in lines, r.stdout + r.stderr
        err = [l for l in lines if l.startswith(f"{name} error: ")]
        assert err and err[0].startswith(f"{name} error: simdev: driver error 999 in host_unmap"), \
            r.stdout + r.stderr
        assert err[0].count("simdev:") == 1, err[0]  # the backend named once
    assert "after True" in lines, r.stdout + r.stderr
    assert "driver bytes 0" in lines, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout + r.stderr


@simdev_only
@mapped_only
def test_mapped_memory_waits_for_other_streams_reading_the_storage():
    # Two streams may read one tensor (PyTorch allows it); the host path on
    # the current stream maps the whole storage, so it waits for the other
    # stream's queued read first (Note [Mapped memory and other streams])
    # instead of the driver refusing the map.
    x = A.to(DEV)
    y = torch.empty_like(x)
    MOD.synchronize()
    side = MOD.Stream()
    gate = torch.ops.simdev_driver.hold(side)
    with MOD.stream(side):
        y.copy_(x)  # queued on `side` behind the gate: it reads x
    torch.ops.simdev_driver.release_later(gate, 200)
    z = x * 2  # a host kernel on the current stream, mapping x
    torch.testing.assert_close(z.cpu(), A * 2, rtol=0, atol=0)
    side.synchronize()
    torch.testing.assert_close(y.cpu(), A, rtol=0, atol=0)


@simdev_only
@mapped_only
def test_mapped_memory_runs_host_kernels_and_the_fallback_in_place():
    a, b = A.to(DEV), B.to(DEV)
    MOD.synchronize()
    copies = torch.ops.simdev_driver.copies()
    maps = torch.ops.simdev_driver.host_maps()
    MOD.reset_fallback_report()
    c = a * b + a   # host kernels: mul.Tensor, add.Tensor
    c.cos_()        # the zero-copy fallback
    MOD.synchronize()
    assert torch.ops.simdev_driver.copies() == copies  # nothing went through copies
    assert torch.ops.simdev_driver.host_maps() >= maps + 3
    report = {op: n for op, n, _ in MOD.fallback_report()}
    assert report.get("aten::mul.Tensor") == 1, report  # a host kernel
    assert sum(n for op, n in report.items() if op.startswith("aten::cos")) == 1, report
    torch.testing.assert_close(c.cpu(), (A * B + A).cos_(), rtol=0, atol=0)


@simdev_only
@mapped_only
def test_mapped_host_kernels_keep_the_cpus_aliasing_and_resizes():
    # On mapped memory a host kernel gives the CPU kernel CPU tensors at the
    # addresses host_map returned (simdev's: a mapping of their own, the
    # device pointers faulting), one per device storage: out= over an input,
    # a partial overlap, views of one storage and a resize past the storage
    # behave as on the CPU (Note [Host kernels on mapped memory]).
    a, b = A.to(DEV), B.to(DEV)
    MOD.synchronize()
    maps = torch.ops.simdev_driver.host_maps()
    MOD.reset_fallback_report()
    c = a.clone()
    torch.mul(c, b, out=c)  # out= is an input: a full overlap
    torch.testing.assert_close(c.cpu(), A * B, rtol=0, atol=0)
    d = a.clone()
    d[:, :32].add_(d[:, 32:64])  # two disjoint views of one storage, in place
    want = A.clone()
    want[:, :32].add_(want[:, 32:64])
    torch.testing.assert_close(d.cpu(), want, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        d[1:].add_(d[:-1])  # a partial overlap, refused as on the CPU
    with pytest.raises(RuntimeError, match="unsupported operation"):
        want[1:].add_(want[:-1])
    grown = torch.empty(0, device=DEV)  # a storage of no bytes, resized by the kernel
    torch.add(a, b, out=grown)
    torch.testing.assert_close(grown.cpu(), A + B, rtol=0, atol=0)
    m = torch.empty(0, device=DEV)
    torch.mean(a, 0, out=m)
    torch.testing.assert_close(m.cpu(), A.mean(0), rtol=0, atol=0)
    r = torch.relu(a)  # the CPU kernel allocates its result: copied to the device
    assert r.device.type == DEV
    torch.testing.assert_close(r.cpu(), torch.relu(A), rtol=0, atol=0)
    report = {op: n for op, n, _ in MOD.fallback_report()}
    assert report.get("aten::mul.out") == 1 and report.get("aten::add.out") == 1, report
    assert torch.ops.simdev_driver.host_maps() > maps
