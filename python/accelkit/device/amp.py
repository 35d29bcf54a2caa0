"""torch.<name>.amp: automatic mixed precision on the device, as torch.cuda.amp.

The autocast policy is CUDA's (Note [Autocast policy] in
include/accelkit/torch/autocast.hpp); the lower-precision dtypes allowed are
those the device's capability schema reports (get_amp_supported_dtype).
"""
import torch

from .. import _backend

__all__ = ["autocast", "custom_fwd", "custom_bwd", "GradScaler"]


def _supported() -> list:
    from . import get_amp_supported_dtype
    return get_amp_supported_dtype()


class autocast(torch.amp.autocast_mode.autocast):  # noqa: N801 (torch.cuda.amp.autocast)
    """torch.autocast(<name>, ...). Unlike torch.autocast, which warns and
    disables itself for a dtype the backend does not support, this raises a
    ValueError naming the dtype and the supported ones."""

    def __init__(self, enabled: bool = True, dtype: torch.dtype = torch.float16,
                 cache_enabled: bool = True):
        if enabled and dtype not in _supported():
            raise ValueError(
                f"{_backend.name}: autocast to {dtype} is not supported: the capability schema "
                f"of the current device reports {', '.join(map(str, _supported())) or 'none'} "
                "as lower-precision dtypes")
        super().__init__(_backend.name, enabled=enabled, dtype=dtype, cache_enabled=cache_enabled)


def custom_fwd(fwd=None, *, cast_inputs=None):
    """torch.amp.custom_fwd for this device type."""
    return torch.amp.custom_fwd(fwd, device_type=_backend.name, cast_inputs=cast_inputs)


def custom_bwd(bwd=None):
    """torch.amp.custom_bwd for this device type."""
    return torch.amp.custom_bwd(bwd, device_type=_backend.name)


class GradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler(<name>, ...)."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        super().__init__(_backend.name, init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)
