"""The fake convolution of the installed backend's device answered as the
CPU's, so that torch.compile traces the device's convolutions with the
strides the SDK's convolution gives (Note [The convolution's strides under
fake tensors])."""
import torch

from .. import _backend
from .cpu_checks import _changed, _unchecked

# Note [The convolution's strides under fake tensors]
# Problem: torch.compile traces with fake tensors, whose convolution
# (torch._subclasses.fake_impls.conv) gives the output the memory format
# ATen picks for the backend _select_conv_backend chooses on the fake
# tensors' device: on a PrivateUse1 device, Overrideable, always contiguous.
# The SDK's convolution runs the CPU's on the same sizes and strides and
# keeps its strides, so a device convolution returns what the CPU's returns
# (channels-last for a channels-last input, as CUDA's does), not the fake's
# contiguous: Inductor's stride check of such a graph fails, and
# backend="aot_eager" runs on wrong strides.
# Decision: the fake convolution of the installed backend's device type is
# answered as the CPU's: the original implementation runs on CPU fake
# tensors of the same sizes and strides, and its outputs become fake tensors
# of the device with the strides it gave (the forward, and
# convolution_backward's gradients). Every other device type gets the
# original. With it, Inductor's layout optimization (Note [Inductor's CPU
# checks]) serves the device as it serves the CPU. Checked as Note
# [Inductor's CPU checks] is (_changed): the source of fake_impls' conv must
# still choose the format through _select_conv_backend and
# _conv_determine_backend_memory_format and make its outputs fake tensors of
# that device, its dispatch must go through op_implementations_dict
# (_CONV_CHECKS), and that table must map the four operators to that conv;
# otherwise nothing is replaced and compiling for the device with its C++
# code generation raises a RuntimeError naming the backend and what changed.
# Limits: the replacement is made when Dynamo or Inductor registers the
# backend (Note [Registering without importing the compiler]), not at
# install, which would read PyTorch's sources at every `import torch`; fake
# tensors of a FakeTensorMode used before that get PyTorch's contiguous
# answer.

_CONV_OPS = ("convolution.default", "_convolution.default", "_convolution.deprecated",
             "convolution_backward.default")
_CONV_WHAT, _CONV_NOTE = ("the device's convolution under torch.compile's fake tensors",
                          "The convolution's strides under fake tensors")
_CONV_CHECKS = {  # (module, qualified name): lines its source must hold
    # fake tensors run the four operators through the table
    ("torch._subclasses.fake_impls", "dispatch_to_op_implementations_dict"):
        "return op_implementations_dict[func](fake_mode, func, *args, **kwargs)",
    # the outputs' memory format is that of the backend ATen selects for the
    # inputs' device, the outputs fake tensors of that device
    ("torch._subclasses.fake_impls", "conv"): (
        "conv_backend = torch._C._select_conv_backend(",
        "mem_fmt = torch._C._conv_determine_backend_memory_format(",
        "return FakeTensor(fake_mode, t, device)"),
}
_conv_error = None  # why the fake convolution was not patched (None: patched, or not yet tried)
_conv_checked = False  # whether _patch_fake_convolution ran


def _patch_fake_convolution():
    """Note [The convolution's strides under fake tensors]."""
    global _conv_error, _conv_checked
    if _conv_checked:
        return
    _conv_checked = True
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils import _pytree as pytree

    name = _backend.name
    table = getattr(fake_impls, "op_implementations_dict", None)
    _conv_error = _changed(_CONV_CHECKS, _CONV_WHAT, _CONV_NOTE)
    origs = {}
    for op in _CONV_OPS:
        packet, overload = op.split(".")
        func = getattr(getattr(torch.ops.aten, packet, None), overload, None)
        orig = table.get(func) if isinstance(table, dict) else None
        if getattr(orig, "_accelkit", False):
            continue  # patched already
        if _conv_error is None and orig is not fake_impls.conv:
            _conv_error = _unchecked(f"torch._subclasses.fake_impls.op_implementations_dict"
                                     f"[aten.{op}]", _CONV_WHAT, _CONV_NOTE)
        origs[func] = orig
    if _conv_error:
        return  # nothing replaced; compiling for the device raises it

    for func, orig in origs.items():
        def conv(fake_mode, func, *args, _orig=orig, **kwargs):
            flat, spec = pytree.tree_flatten((args, kwargs))
            device = next((a.fake_device for a in flat if isinstance(a, FakeTensor)
                           and a.fake_device.type == name), None)
            if device is None:
                return _orig(fake_mode, func, *args, **kwargs)
            with fake_mode:
                twins = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="cpu")
                         if isinstance(a, FakeTensor) and a.fake_device == device else a
                         for a in flat]
                args, kwargs = pytree.tree_unflatten(twins, spec)
                out = _orig(fake_mode, func, *args, **kwargs)
                return pytree.tree_map_only(
                    torch.Tensor, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                                device=device), out)

        conv._accelkit, conv.__wrapped__ = True, orig
        table[func] = conv
