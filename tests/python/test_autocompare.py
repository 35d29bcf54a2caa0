"""Autocompare (accelkit/testing/autocompare.py): the backend also runs the
listed operators on the CPU at run time and warns or raises when a result
differs. A deliberately wrong kernel, registered for the backend through
torch.library for the length of a test, is what it must catch."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

from accelkit.testing import autocompare
from accelkit.testing.autocompare import AutocompareMismatch, AutocompareWarning

from backend import DEV, ENV, renamed


@pytest.fixture
def wrong_mm():
    """aten::mm on the device answers the CPU's product plus one."""
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
        lib.impl("mm", lambda a, b: (torch.mm(a.cpu(), b.cpu()) + 1).to(a.device), "PrivateUse1")
    yield
    lib._destroy()


@pytest.fixture
def compare():
    modes = []

    def start(*args, **kwargs):
        modes.append(autocompare.enable(DEV, *args, **kwargs))
        return modes[-1]
    yield start
    autocompare.disable()


def _operands():
    g = torch.Generator().manual_seed(0)
    return torch.randn(5, 3, generator=g).to(DEV), torch.randn(3, 4, generator=g).to(DEV)


def test_a_wrong_kernel_is_reported_with_its_arguments(wrong_mm, compare):
    mode = compare(["mm"])
    a, b = _operands()
    with pytest.warns(AutocompareWarning) as caught:
        got = a @ b
    text = str(caught[0].message)
    assert f"{DEV}: autocompare: aten::mm differs from the CPU" in text
    assert "Greatest absolute difference: 1.0" in text
    assert f"arg 0: tensor(shape=(5, 3), dtype=torch.float32, device={DEV}:0, stride=(3, 1)" in text
    assert "arg 1: tensor(shape=(3, 4)" in text
    assert torch.equal(got.cpu(), a.cpu() @ b.cpu() + 1)  # the device's answer is returned
    assert mode.counts["aten::mm"] == [1, 1]


def test_raise_mode_raises_a_runtime_error_and_the_device_stays_usable(wrong_mm, compare):
    compare(["aten::mm"], action="raise")
    a, b = _operands()
    with pytest.raises(AutocompareMismatch, match="aten::mm differs"):
        a @ b
    assert issubclass(AutocompareMismatch, RuntimeError)
    assert (a + 1).sum().item() == pytest.approx((a.cpu() + 1).sum().item(), rel=1e-5)


def test_operators_not_listed_are_not_compared(wrong_mm, compare):
    mode = compare(["add", "mul.Tensor"])
    a, b = _operands()
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutocompareWarning)
        (a @ b) * 2 + 1
    assert "aten::mm" not in mode.counts
    assert mode.counts["aten::mul.Tensor"] == [1, 0] and mode.counts["aten::add.Tensor"] == [1, 0]


def test_the_dump_replays_the_mismatch(wrong_mm, compare, tmp_path):
    compare(["mm"], dump=str(tmp_path))
    a, b = _operands()
    with pytest.warns(AutocompareWarning, match="dumped to"):
        a @ b
    (path,) = tmp_path.iterdir()
    got, want, dump = autocompare.replay(str(path), DEV)
    assert dump["op"] == "aten::mm" and torch.equal(dump["args"][0], a.cpu())
    assert torch.equal(got, want + 1) and torch.equal(dump["device_result"], got)


def test_all_compares_a_training_step_forward_and_backward_without_a_false_alarm(compare):
    mode = compare("all")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 3)).to(DEV)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(32, 8).to(DEV), torch.randint(0, 3, (32,)).to(DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutocompareWarning)
        for _ in range(2):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        torch.nn.functional.dropout(x, 0.5)  # random: never compared
    assert all(bad == 0 for _, bad in mode.counts.values())
    # The backward's operators too (autograd's thread inherits the mode).
    assert {"aten::addmm", "aten::mm", "aten::threshold_backward"} <= set(mode.counts)
    assert not any("dropout" in op or "bernoulli" in op for op in mode.counts)
    assert len(mode.counts) > 10


def test_disable_refuses_while_a_later_mode_or_another_thread_holds_the_stack(wrong_mm, compare):
    import threading
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passing(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode = compare(["mm"])
    a, b = _operands()
    with Passing():
        with pytest.raises(RuntimeError, match="pushed after autocompare"):
            autocompare.disable()
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(RuntimeError,
                                                                    autocompare.disable)))
    t.start()
    t.join()
    assert errors and "another thread" in str(errors[0].value)
    assert autocompare.active() is mode  # still on: the wrong mm is still caught
    with pytest.warns(AutocompareWarning):
        torch.mm(a, b)
    autocompare.disable()
    assert autocompare.active() is None


def test_the_environment_enables_it_when_the_backend_is_installed():
    code = renamed("""
import warnings, torch
lib = torch.library.Library("aten", "IMPL")
import torch_simdev
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    lib.impl("mm", lambda a, b: (torch.mm(a.cpu(), b.cpu()) * 2).to(a.device), "PrivateUse1")
a = torch.ones(2, 2, device="simdev")
try:
    a @ a
except RuntimeError as e:
    print(type(e).__name__, str(e).splitlines()[0])
""")
    env = dict(os.environ, **{f"{ENV}AUTOCOMPARE": "mm,add", f"{ENV}AUTOCOMPARE_ACTION": "raise"})
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert f"AutocompareMismatch {DEV}: autocompare: aten::mm differs from the CPU" in r.stdout, \
        r.stdout + r.stderr
    env[f"{ENV}AUTOCOMPARE_ACTION"] = "loudly"
    r = subprocess.run([sys.executable, "-c", renamed("import torch_simdev")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"ValueError: {DEV}: {ENV}AUTOCOMPARE_ACTION must be warn or raise, got 'loudly'" \
        in r.stderr
