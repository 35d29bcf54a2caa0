"""torch.<name>.random: the devices' default generators, as torch.cuda.random.

The generators are typed by device (Note [Device generators] in
include/accelkit/torch/generator.hpp); none of these functions initializes
the backend, so torch.manual_seed seeds the devices before their first use.
"""
from collections.abc import Iterable

import torch

from .. import _backend

__all__ = ["get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
           "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed"]


def _generator(device) -> torch.Generator:
    """A device's default generator (the current device's for None)."""
    return _backend.ops.default_generator(_backend.index_or_current(device))


def get_rng_state(device=None) -> torch.Tensor:
    """The state of a device's default generator (the current device's by
    default), as a CPU ByteTensor. IndexError for a device out of range."""
    return _generator(device).get_state()


def get_rng_state_all() -> list:
    """The states of every device's default generator, by index."""
    return [get_rng_state(i) for i in range(_backend.ops.device_count())]


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    """Restores a state from get_rng_state into a device's default generator
    (the current device's by default). TypeError for a tensor that is not a
    CPU ByteTensor, RuntimeError for one of another size, as on CUDA."""
    _generator(device).set_state(new_state)


def set_rng_state_all(new_states: Iterable) -> None:
    """Restores one state per device, in index order (from get_rng_state_all)."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def _seed64(seed) -> int:
    # A seed as PyTorch takes it: any int, kept modulo 2**64.
    return int(seed) & 0xFFFF_FFFF_FFFF_FFFF


def manual_seed(seed: int) -> None:
    """Seeds the current device's default generator."""
    _generator(None).manual_seed(_seed64(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every device's default generator (torch.manual_seed does too)."""
    for i in range(_backend.ops.device_count()):
        _generator(i).manual_seed(_seed64(seed))


def seed() -> None:
    """Seeds the current device's default generator with a random number."""
    _generator(None).seed()


def seed_all() -> None:
    """Seeds every device's default generator with one random number."""
    n = _backend.ops.device_count()
    if n:
        value = _generator(0).seed()
        for i in range(1, n):
            _generator(i).manual_seed(value)


def initial_seed(device=None) -> int:
    """The seed of a device's default generator (the current device's by default)."""
    return _generator(device).initial_seed()
