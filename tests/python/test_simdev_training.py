"""Real workloads on simdev, each compared with the same computation on the CPU.
(Training small models against the CPU is the conformance kit's group
"training": accelkit.testing, ctest conformance.py.*.)"""
import torch
import torch.nn.functional as F

from backend import DEV, two_devices

TOL = dict(rtol=1e-5, atol=1e-6)  # the kernels are the CPU's: results match closely


def _data(device, n=64, shape=(16,), classes=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return x.to(device), y.to(device)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


@two_devices
def test_model_on_device_one_with_data_moved_across_devices():
    torch.manual_seed(0)
    model = _mlp().to(f"{DEV}:1")
    ref = _mlp()
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    x, y = _data(f"{DEV}:0")
    out = model(x.to(f"{DEV}:1"))
    assert out.device == torch.device(f"{DEV}:1")
    torch.testing.assert_close(out.cpu(), ref(x.cpu()), **TOL)
    loss = F.cross_entropy(out, y.to(f"{DEV}:1"))
    loss.backward()
    assert all(p.grad.device == torch.device(f"{DEV}:1") for p in model.parameters())
