"""simdev, accelkit's simulated accelerator, as a PyTorch device.

``import torch_simdev`` loads the backend library, which registers the
``simdev`` device type with PyTorch, and installs ``torch.simdev``, the
device module, so that ``torch.device("simdev:1")``, ``tensor.to("simdev")``,
``tensor.simdev()`` and ``torch.simdev.device_count()`` work.
"""
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
torch.ops.load_library(os.path.join(_HERE, "_C.so"))

from . import device_module as _device_module  # noqa: E402

torch._register_device_module("simdev", _device_module)

from . import _sharing  # noqa: E402,F401  (torch.multiprocessing: a clear error, never a hang)
torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
)

__all__ = ["device_module"]
