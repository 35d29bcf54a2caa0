"""What the tests of a backend's native kernels share (test_ocl_kernels.py,
test_vkdev_kernels.py): tolerances, seeded inputs, special values, and a check
that runs a function on the CPU and on the device and counts the kernel's
launches through the backend's `launches` operator."""
import torch

from backend import DEV

EXACT = dict(rtol=0, atol=0, equal_nan=True)
CLOSE = dict(rtol=1e-5, atol=1e-5, equal_nan=True)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed=0):
    return torch.randn(shape, generator=gen(seed))


def special(t):
    """A copy of t with NaN, inf and -inf as its first three elements."""
    t = t.clone()
    flat = t.view(-1)
    if flat.numel() >= 3:
        flat[0], flat[1], flat[2] = float("nan"), float("inf"), float("-inf")
    return t


def checker(kops):
    """check(kernel, f, *args, launched=1, tol=EXACT): f on the CPU and on DEV
    (tensors moved), equal within tol; `kernel` ran `launched` times, counted by
    kops.launches."""
    def check(kernel, f, *args, launched=1, tol=EXACT):
        dev_args = [a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args]
        getattr(torch, DEV).synchronize()
        n0 = kops.launches(kernel)
        got = f(*dev_args)
        n = kops.launches(kernel) - n0
        want = f(*args)
        assert got.device.type == DEV
        assert got.shape == want.shape and got.dtype == want.dtype
        torch.testing.assert_close(got.cpu(), want, **tol)
        assert n == launched, f"{kernel}: {n} launches, expected {launched}"
        return got
    return check
