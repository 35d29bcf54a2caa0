"""accelkit's Python side: makes a backend library built with
ACCELKIT_REGISTER_BACKEND a PyTorch device.

A backend's package is one call (its __init__.py is generated from
cmake/torch_backend_init.py.in by accelkit_add_torch_backend, and calls the
copy of this package that the backend carries as torch_acme._accelkit)::

    import accelkit
    accelkit.install("acme", "/path/to/torch_acme/_C.so")

after which ``torch.device("acme:1")``, ``tensor.to("acme")``,
``tensor.acme()``, ``torch.acme`` (torch.cuda's names: accelkit.device),
``torch.autocast("acme")``, ``torch.Generator(device="acme")`` and
``torch.distributed.init_process_group("cpu:gloo,acme:acme")``
(accelkit.distributed) work.
"""
import os
import sys

import torch

from . import _backend

__all__ = ["install"]


def install(name: str, library=None):
    """Loads the backend `library` (the path of the library that uses
    ACCELKIT_REGISTER_BACKEND, or None if it is loaded already) and makes
    `name` a PyTorch device: renames PyTorch's PrivateUse1 device type,
    registers torch.<name> (and torch.<name>.amp, .graphs, .random,
    .memory, .streams), the tensor, module and storage methods (``x.<name>()``) and
    the multiprocessing reducers. Returns torch.<name>. A second call with
    the same name returns it again (also from another copy of this package);
    PyTorch has one slot for such a device,
    so another name is a RuntimeError, as is a library that does not
    register `name`."""
    if not isinstance(name, str) or not name.isidentifier() or name != name.lower():
        raise ValueError(f"accelkit.install: the device name must be a lower-case identifier, "
                         f"got {name!r}")
    if _backend.name is not None:
        if _backend.name != name:
            raise RuntimeError(f"accelkit.install({name!r}): this process installed "
                               f"{_backend.name!r} already; PyTorch has one slot for a device "
                               "of this kind (PrivateUse1) per process")
        return getattr(torch, name)
    current = torch._C._get_privateuse1_backend_name()
    installed = sys.modules.get(f"torch.{name}")
    if current == name and installed is not None:
        # By another copy of this package: each backend's wheel carries one
        # (Note [The SDK's Python package in each wheel]).
        return installed
    if current not in ("privateuseone", name):
        raise RuntimeError(f"accelkit.install({name!r}): PyTorch's PrivateUse1 device is named "
                           f"{current!r} already in this process; it has one such slot")
    if library is not None:
        torch.ops.load_library(os.fspath(library))
    ops = getattr(torch.ops, name)
    try:
        ops.device_count
    except (AttributeError, RuntimeError):
        raise RuntimeError(f"accelkit.install({name!r}): {library} does not register the "
                           f"backend {name!r} (ACCELKIT_REGISTER_BACKEND of a runtime whose "
                           f"name is {name!r})") from None
    _backend.name, _backend.ops = name, ops

    from . import _sharing, device
    torch.utils.rename_privateuse1_backend(name)  # also names the profiler's activity
    torch._register_device_module(name, device)
    for sub in ("amp", "graphs", "random", "memory", "streams"):
        sys.modules[f"torch.{name}.{sub}"] = getattr(device, sub)
    device.memory._install_accelerator_snapshot()  # Note [torch.accelerator.memory._snapshot]
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
    _sharing.register()
    from . import distributed
    distributed.register(name)  # torch.distributed's backend `name`
    from . import compile as _compile
    _compile.install()  # torch.compile: Dynamo's device interface, Inductor's code generators
    if os.environ.get(f"{name.upper()}_AUTOCOMPARE"):
        from .testing import autocompare  # <NAME>_AUTOCOMPARE: accelkit/testing/autocompare.py
        autocompare.from_environment(name)
    return device
