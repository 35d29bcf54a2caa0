"""Real workloads on simdev, each compared with the same computation on the CPU."""
import pytest
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


def _cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 8, 3, padding=1),
                               torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(8, 4))


def _train(make, device, optimizer, steps, data_shape):
    torch.manual_seed(0)
    model = make().to(device)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=0.01))
    x, y = _data(device, shape=data_shape)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("make,shape", [(_mlp, (16,)), (_cnn, (1, 8, 8))], ids=["mlp", "cnn"])
def test_training_matches_cpu(make, shape, optimizer):
    cpu_losses, cpu_params = _train(make, "cpu", optimizer, 30, shape)
    sim_losses, sim_params = _train(make, DEV, optimizer, 30, shape)
    assert sim_losses[-1] < sim_losses[0]  # it learns
    torch.testing.assert_close(torch.tensor(sim_losses), torch.tensor(cpu_losses), **TOL)
    for a, b in zip(sim_params, cpu_params):
        torch.testing.assert_close(a, b, **TOL)


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
