import pytest
import torch

from backend import MOD  # imports torch_<backend> (ACCELKIT_TEST_BACKEND), registering it


@pytest.fixture(autouse=True)
def _reset_device():
    yield
    MOD.set_device(0)
    torch.accelerator.synchronize(0)
