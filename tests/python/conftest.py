import pytest
import torch

import torch_simdev  # noqa: F401  registers the simdev device


@pytest.fixture(autouse=True)
def _reset_device():
    yield
    torch.simdev.set_device(0)
    torch.accelerator.synchronize(0)
