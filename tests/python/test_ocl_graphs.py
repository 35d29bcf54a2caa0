"""Graphs on ocl through PyTorch (torch.ocl.CUDAGraph, torch.ocl.graph, make_graphed_callables)
over PoCL's cl_khr_command_buffer (Note [ocl graphs] in examples/opencl/opencl_command_buffer.hpp):
the native kernels (mm, addmm, relu, add, mul, sum, threshold_backward) are recorded, so an MLP's
forward and its training step's backward capture and replay equal to eager; what has no native
kernel is refused during capture naming the operator, and the stream stays usable; a device
without a usable cl_khr_command_buffer (OCL_COMMAND_BUFFER=0 here) refuses to capture naming it;
scripts/gpu_check_graphs.py's checks pass on ocl."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from backend import DEV

if DEV != "ocl":
    pytest.skip("ocl's graphs", allow_module_level=True)

import torch_ocl  # noqa: E402,F401

KOPS = torch.ops.ocl_kernels
if not KOPS.enabled():
    pytest.skip("OCL_NATIVE_KERNELS=0: only native kernels can be captured on ocl",
                allow_module_level=True)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
CLOSE = dict(rtol=1e-5, atol=1e-5)


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 10))


def _warm_and_capture(fn, *args):
    """fn(*args) three times on a side stream, then captured: (graph, output)."""
    s = torch.ocl.Stream()
    s.wait_stream(torch.ocl.current_stream())
    with torch.ocl.stream(s):
        for _ in range(3):
            fn(*args)
    torch.ocl.current_stream().wait_stream(s)
    g = torch.ocl.CUDAGraph()
    with torch.ocl.graph(g):
        out = fn(*args)
    return g, out


def test_mlp_forward_capture_replays_equal_eager_with_native_kernels():
    cpu_model = _mlp()
    model = _mlp().to(DEV)
    static_x = torch.zeros(1, 64, device=DEV)  # batch 1: a decode-like step
    with torch.no_grad():
        n0 = KOPS.launches("")
        g, static_y = _warm_and_capture(model, static_x)
        captured = KOPS.launches("") - n0
        # Seven native kernels per forward (four addmm, three relu), in each of
        # the three warm-up runs and the capture; none ran as the fallback.
        assert captured == 4 * 7
        for seed in (1, 2, 3):
            x = torch.randn(1, 64, generator=torch.Generator().manual_seed(seed))
            static_x.copy_(x.to(DEV))
            before = KOPS.launches("")
            g.replay()
            assert KOPS.launches("") == before  # a replay launches the recorded commands
            torch.testing.assert_close(static_y.cpu(), model(x.to(DEV)).cpu(), **CLOSE)
            torch.testing.assert_close(static_y.cpu(), cpu_model(x), **CLOSE)
    g.reset()


def test_training_step_graphed_with_make_graphed_callables_equals_eager():
    eager, graphed = _mlp(1).to(DEV), _mlp(1).to(DEV)
    sample = torch.randn(8, 64, device=DEV, requires_grad=True)
    graphed = torch.ocl.make_graphed_callables(graphed, (sample,))
    for seed in (5, 6):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(seed)).to(DEV)
        grads = []
        for m in (eager, graphed):
            m.zero_grad(set_to_none=True)
            xi = x.clone().requires_grad_(True)
            y = m(xi)
            y.backward(torch.ones_like(y))
            grads.append([y.detach().cpu(), xi.grad.cpu()] +
                         [p.grad.cpu() for p in m.parameters()])
        for got, want in zip(grads[1], grads[0]):
            torch.testing.assert_close(got, want, **CLOSE)


def test_an_operator_without_a_native_kernel_is_refused_by_name_and_the_stream_stays_usable():
    x = torch.randn(256, device=DEV)
    s = torch.ocl.Stream()
    g = torch.ocl.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"exp"):
        with torch.ocl.graph(g, stream=s):
            torch.exp(x)  # no native kernel: the fallback, refused while capturing
    assert not torch.ocl.is_current_stream_capturing()
    with torch.ocl.stream(s):
        y = x + x  # the stream runs work again
    s.synchronize()
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)


def test_capture_refused_naming_cl_khr_command_buffer_where_the_device_cannot_record():
    code = textwrap.dedent("""
        import torch, torch_ocl
        x = torch.ones(4, device="ocl")
        g = torch.ocl.CUDAGraph()
        try:
            with torch.ocl.graph(g):
                y = x + x
        except RuntimeError as e:
            print("refused:", e)
        else:
            print("captured")
    """)
    env = dict(os.environ, OCL_COMMAND_BUFFER="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "refused:" in out.stdout, out.stdout
    assert "cl_khr_command_buffer" in out.stdout and "ocl" in out.stdout, out.stdout


def test_gpu_check_graphs_checks_pass_on_ocl():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_check_graphs.py"),
                          "--backend", "ocl", "--ops", "30", "--numel", "256", "--replays", "20",
                          "--rounds", "3"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "gpu_check_graphs: 3 of 3 passed" in out.stdout
    assert "ocl replay / ocl eager, host" in out.stdout
