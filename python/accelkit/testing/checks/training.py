"""The training group: small models trained on the device follow the CPU."""
import torch
import torch.nn.functional as F

from .base import check


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _cnn():
    # No bias before the batch norm: its true gradient is zero (the norm
    # takes the mean out), so what it gets is rounding noise, which Adam
    # scales up to steps of its learning rate whatever the noise's size: the
    # CPU's own values for it would be as arbitrary as the device's.
    return torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Conv2d(4, 8, 3, padding=1, bias=False),
                               torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(8, 4))


def _train(make, device, optimizer, steps, shape):
    torch.manual_seed(0)
    model = make().to(device)
    opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=0.01))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, *shape, generator=g).to(device)
    y = torch.randint(0, 4, (64,), generator=g).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def _training(ctx, make, optimizer, shape):
    cpu_losses, cpu_params = _train(make, "cpu", optimizer, 10, shape)
    losses, params = _train(make, ctx.name, optimizer, 10, shape)
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    ctx.close(torch.tensor(losses), torch.tensor(cpu_losses), "losses")
    for i, (a, b) in enumerate(zip(params, cpu_params)):
        ctx.close(a, b, f"parameter {i}")


for _make, _shape in ((_mlp, (16,)), (_cnn, (1, 8, 8))):
    for _optimizer in ("sgd", "adam"):
        def _fn(ctx, make=_make, optimizer=_optimizer, shape=_shape):
            _training(ctx, make, optimizer, shape)
        _kind = "an MLP" if _make is _mlp else "a CNN (convolutions, pooling, batch norm)"
        _fn.__name__ = f"{_make.__name__[1:]}_{_optimizer}"
        check("training", f"{_kind} trained 10 steps with {_optimizer} on the device follows "
                          "the CPU (losses and parameters, within the kit's tolerance)")(_fn)
