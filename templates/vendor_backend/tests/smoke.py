"""skel through PyTorch: tensors, copies, a training step against the CPU.
Run with build/python on PYTHONPATH (ctest: skel.python.smoke)."""
import os

# Loaded by the import below, not by `import torch` through an installed
# backend's entry point (PyTorch has one slot for such a device).
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
import torch  # noqa: E402
import torch_skel  # noqa: E402,F401

assert torch.skel.device_count() == 1, torch.skel.device_count()
x = torch.arange(12.0).reshape(3, 4)
d = x.to("skel")
assert d.device.type == "skel"
assert torch.equal((d * 2 + 1).sum(0).cpu(), (x * 2 + 1).sum(0))
assert torch.equal(d.t().contiguous().cpu(), x.t().contiguous())

# One step of a small model, on the device and on the CPU.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
twin = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
twin.load_state_dict(model.state_dict())
twin.to("skel")
target = torch.randn(3, 2)
for m, inp, tgt in ((model, x, target), (twin, d, target.to("skel"))):
    loss = torch.nn.functional.mse_loss(m(inp), tgt)
    loss.backward()
for a, b in zip(model.parameters(), twin.parameters()):
    torch.testing.assert_close(b.grad.cpu(), a.grad)

s = torch.skel.Stream()
e = torch.skel.Event()
with torch.skel.stream(s):
    y = d + 1
    e.record()
e.synchronize()
assert torch.equal(y.cpu(), x + 1)
print("skel smoke: ok")
