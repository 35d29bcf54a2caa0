"""DDP over simdev with torchrun (tests/python/ddp_train.py): two processes,
one device each, train to the parameters of the same training on one CPU
process, to float tolerance."""
import os

import pytest

if os.environ.get("ACCELKIT_TEST_BACKEND", "simdev") != "simdev":
    # simdev's devices and test knobs (a held stream, SIMDEV_VISIBLE_DEVICES per rank).
    pytest.skip("the distributed tests run on simdev", allow_module_level=True)

import subprocess
import sys

import torch
import torch.distributed as dist

import torch_simdev  # noqa: F401

sys.path.insert(0, os.path.dirname(__file__))
import ddp_train  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "ddp_train.py")


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
@pytest.mark.parametrize("visible", [
    pytest.param(False, id="two_devices"),
    pytest.param(True, id="visible_per_rank", marks=pytest.mark.skipif(
        os.environ.get("SIMDEV_HOST_VISIBLE") == "0", reason="one memory mode is enough"))])
def test_ddp_torchrun_matches_one_cpu_process(tmp_path, visible):
    out = tmp_path / "params.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           SCRIPT, str(out)] + (["--visible-per-rank"] if visible else [])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("SIMDEV_VISIBLE_DEVICES", None)
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = torch.load(out)
    assert got.pop("_devices") == (1 if visible else int(os.environ.get("SIMDEV_DEVICE_COUNT", "2")))
    want = ddp_train.train(ddp_train.model(), "cpu").state_dict()
    assert got.keys() == want.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=k)
    # and the training moved them
    assert not torch.allclose(want["0.weight"], ddp_train.model().state_dict()["0.weight"])
