"""torch_cudart (examples/cudart) through PyTorch (ctest: python.cudart).

Without a GPU or driver (this CI): the module imports, torch.cudart says no device, and a
tensor on it raises a RuntimeError naming CUDA's error; the process stays usable; the graph
names are there, and scripts/gpu_check_graphs.py stops saying there is no device. With a GPU
(scripts/gpu_check): the backend's own kernels (add, mul, relu of float32, float16, bfloat16)
and the fallback agree with the CPU."""
import ctypes
import ctypes.util
import os
import subprocess
import sys

import pytest
import torch

import torch_cudart  # noqa: F401  (registers torch.cudart)


def cuda_error():
    """CUDA's answer to cudaGetDeviceCount, asked of libcudart directly: (code, name)."""
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch_cudart.__file__), "_C.so"))
    count = ctypes.c_int(0)
    code = lib.cudaGetDeviceCount(ctypes.byref(count))
    lib.cudaGetErrorName.restype = ctypes.c_char_p
    return code, lib.cudaGetErrorName(code).decode(), count.value


CODE, NAME, COUNT = cuda_error()
no_gpu = pytest.mark.skipif(CODE == 0 and COUNT > 0, reason="a GPU is present")
gpu = pytest.mark.skipif(not (CODE == 0 and COUNT > 0), reason=f"no GPU: {NAME}")


@no_gpu
def test_no_device_is_reported_not_raised():
    assert torch.cudart.is_available() is False
    assert torch.cudart.device_count() == 0


@no_gpu
@pytest.mark.parametrize("make", [
    lambda: torch.empty(4, device="cudart"),
    lambda: torch.ones(4).to("cudart"),
    lambda: torch.zeros(2, 2, device="cudart:0"),
])
def test_tensor_creation_raises_naming_cuda_error(make):
    with pytest.raises(RuntimeError) as info:
        make()
    message = str(info.value)
    assert "cudart" in message
    assert NAME in message, message  # e.g. cudaErrorInsufficientDriver
    # The process stays usable, and the answer stays the same.
    assert torch.ones(3).add(1).sum().item() == 6.0
    assert torch.cudart.device_count() == 0


@gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 0), (torch.float16, 1e-3),
                                       (torch.bfloat16, 1e-2)])
def test_kernels_match_cpu(dtype, tol):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1000, 37, generator=g).to(dtype)
    b = torch.randn(1000, 37, generator=g).to(dtype)
    a[0, 0] = float("nan")
    da, db = a.to("cudart"), b.to("cudart")
    for got, want in ((da + db, a + b), (da * db, a * b), (torch.relu(da), torch.relu(a))):
        assert got.device.type == "cudart" and got.dtype == dtype
        torch.testing.assert_close(got.cpu(), want, atol=tol, rtol=tol, equal_nan=True)


@gpu
def test_fallback_arguments_match_cpu():
    a = torch.randn(8, 5)
    row = torch.randn(5)
    da = a.to("cudart")
    torch.testing.assert_close((da + row.to("cudart")).cpu(), a + row)  # broadcast: fallback
    torch.testing.assert_close(da.add(da, alpha=2).cpu(), a.add(a, alpha=2))
    torch.testing.assert_close((da * 3).cpu(), a * 3)
    torch.testing.assert_close(torch.relu(da.t()).cpu(), torch.relu(a.t()))  # not contiguous


@no_gpu
def test_graph_names_exist_and_gpu_check_graphs_reports_no_device():
    for name in ("CUDAGraph", "Graph", "graph", "graph_pool_handle", "make_graphed_callables",
                 "is_current_stream_capturing"):
        assert callable(getattr(torch.cudart, name)), name
    assert torch.cudart.is_current_stream_capturing() is False
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                          "gpu_check_graphs.py")
    out = subprocess.run([sys.executable, script, "--backend", "cudart"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 2, out.stdout + out.stderr  # no device: nothing run
    assert "gpu_check_graphs: no cudart device" in out.stdout
    assert NAME in out.stdout, out.stdout  # CUDA's reason, from the init error
