"""The names group: torch.<name> offers torch.cuda's names and parameters
and is PyTorch's accelerator."""
import importlib
import inspect

import torch

from ..names import CUDA_ONLY
from .base import check


@check("names", "torch.<name> has every public name of torch.cuda but CUDA's own "
                "(its toolkit, libraries, NVML: accelkit.testing.names.CUDA_ONLY)")
def cuda_names(ctx):
    missing = [n for n in torch.cuda.__all__ if not hasattr(ctx.mod, n) and n not in CUDA_ONLY]
    assert missing == [], f"torch.{ctx.name} lacks {missing}"


def _parameters(f):
    target = f.__new__ if inspect.isclass(f) and f.__new__ is not object.__new__ else f
    if inspect.isclass(f) and target is f:
        target = f.__init__
    params = list(inspect.signature(target).parameters.values())
    if inspect.isclass(f) and target is not f.__init__ and all(
            p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params[1:]):
        # A generic __new__ (a C++ class's, as torch.cuda.MemPool's): the
        # parameters are __init__'s.
        params = list(inspect.signature(f.__init__).parameters.values())
    return [(p.name, p.kind) for p in params if p.name not in ("self", "cls")]


@check("names", "torch.<name>'s functions and classes take torch.cuda's parameters "
                "(names and kinds; initial_seed also takes a device)")
def cuda_parameters(ctx):
    differ = {}
    for n in torch.cuda.__all__:
        ours, theirs = getattr(ctx.mod, n, None), getattr(torch.cuda, n)
        if ours is None or inspect.ismodule(ours) or not callable(ours) or n == "initial_seed":
            continue
        try:
            expected = _parameters(theirs)
        except (TypeError, ValueError):
            continue  # a builtin without a signature
        if _parameters(ours) != expected:
            differ[n] = (_parameters(ours), expected)
    assert differ == {}, f"parameters differ from torch.cuda's: {differ}"


@check("names", "the device is PyTorch's accelerator: torch.accelerator and torch.<name> agree, "
                "torch.<name>.amp and .random import by their torch names")
def accelerator(ctx):
    acc = torch.accelerator.current_accelerator()
    assert acc is not None and acc.type == ctx.name, f"torch.accelerator names {acc}"
    assert torch.accelerator.device_count() == ctx.devices == len(
        [ctx.mod.get_device_name(i) for i in range(ctx.devices)])
    assert importlib.import_module(f"torch.{ctx.name}.amp") is ctx.mod.amp
    assert importlib.import_module(f"torch.{ctx.name}.random") is ctx.mod.random
    assert ctx.mod.is_available() == (ctx.devices > 0)
