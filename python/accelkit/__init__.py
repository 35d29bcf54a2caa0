"""accelkit's Python side: makes a backend library built with
ACCELKIT_REGISTER_BACKEND a PyTorch device.

A backend's package is one call (its __init__.py is generated from
cmake/torch_backend_init.py.in by accelkit_add_torch_backend, and calls the
copy of this package that the backend carries as torch_acme._accelkit)::

    import accelkit
    accelkit.install("acme", "/path/to/torch_acme/_C.so")

(its entry point in PyTorch's ``torch.backends`` group calls
``accelkit.autoload`` instead (Note [Two backends in one environment])),
after which ``torch.device("acme:1")``, ``tensor.to("acme")``,
``tensor.acme()``, ``torch.acme`` (torch.cuda's names: accelkit.device),
``torch.autocast("acme")``, ``torch.Generator(device="acme")`` and
``torch.distributed.init_process_group("cpu:gloo,acme:acme")``
(accelkit.distributed) work.
"""
import os
import sys
import types
import warnings

import torch

from . import _backend

__all__ = ["install", "autoload"]

# Note [Two backends in one environment]
# PyTorch has one PrivateUse1 slot per process, and `import torch` calls
# every entry point of the `torch.backends` group, turning any exception into
# a failure of its own import: with two backends' wheels installed, the
# second one's install() would make `import torch` fail. So a wheel's entry
# point calls autoload(), which installs the backend only where the slot is
# free and ACCELKIT_BACKEND lets it, and otherwise leaves it unloaded and
# warns once (RuntimeWarning) naming the backend that holds the slot and how
# to choose:
# - ACCELKIT_BACKEND unset or empty: the first backend whose entry point runs
#   takes the slot (the order of importlib.metadata.entry_points(): the
#   path, then each directory's listing); a backend whose package is being
#   imported before torch (`import torch_acme` as a script's first line:
#   Note [Importing the package before torch] in torch_backend_init.py.in)
#   goes first, the others stand aside;
# - ACCELKIT_BACKEND=<name>: only that backend autoloads, the others skip
#   without a word; a name no accelkit backend has, or a value that is not a
#   lower-case identifier, gets one warning listing the installed ones and
#   no backend is loaded.
# The accelkit backends are the entry points of the group
# `accelkit.backends` (name = package) that each generated wheel declares
# beside its `torch.backends` one; a warning about the variable itself comes
# from the first of them alone, so it is printed once. Each wheel carries its
# own copy of this package, so nothing is shared through module state: the
# holder is the slot's name (torch._C._get_privateuse1_backend_name(), so a
# slot taken by another kind of backend, one that renames PrivateUse1, is
# treated the same), and a package being imported before torch is marked
# by its module's `_accelkit_requested`. A backend left unloaded loses its
# package's entry in sys.modules (torch's import imported it to reach the
# entry point), so that importing it later runs it again. Limits: an
# explicit import or install() of a second backend still raises
# (RuntimeError naming both); a backend that fails for another reason (its
# library does not load) still fails torch's import, as PyTorch intends,
# with its hint TORCH_DEVICE_BACKEND_AUTOLOAD=0; a wheel whose copy of this
# package has no autoload() installs from its entry point and so raises.
CHOICE = "ACCELKIT_BACKEND"
_warned = set()  # the autoload warnings given in this process, by name


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=4)  # the package's _autoload


def _installed_backends() -> dict:
    """The accelkit backends installed in this environment, {name: package}
    in entry point order (the group `accelkit.backends` of their wheels)."""
    from importlib.metadata import entry_points
    found = {}
    try:
        for ep in entry_points(group="accelkit.backends"):
            found.setdefault(ep.name, ep.value)
    except Exception:  # noqa: BLE001 (a broken distribution's metadata lists nothing)
        pass
    return found


def _being_imported():
    """The backend whose package is being imported before torch (its module
    has `_accelkit_requested`: Note [Two backends in one environment]), or None."""
    for module in list(sys.modules.values()):
        if isinstance(module, types.ModuleType):
            try:
                attrs = module.__dict__
                if attrs.get("_accelkit_requested") is True:
                    backend = attrs.get("_accelkit_backend")
                    if isinstance(backend, str):
                        return backend
            except Exception:  # noqa: BLE001 (a module object with an unusual __dict__)
                continue
    return None


def _how_to_choose(name: str, names) -> str:
    listed = ", ".join(sorted(set(names) | {name}))
    return (f"set {CHOICE}={name} to load {name} instead (accelkit backends installed: {listed}), "
            f"or TORCH_DEVICE_BACKEND_AUTOLOAD=0 and import one backend's package")


def _forget(package) -> None:
    """Removes the package `package` (and its modules) of a backend left
    unloaded from sys.modules, so that importing it later runs it again and
    raises as an explicit import does; not while it is being imported."""
    module = sys.modules.get(package) if package else None
    if module is None or module.__dict__.get("_accelkit_requested") is True \
            or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return
    for key in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
        del sys.modules[key]


def autoload(name: str, library=None, package=None):
    """install(name, library) as a wheel's `torch.backends` entry point calls
    it, inside `import torch` (Note [Two backends in one environment]):
    installs the backend if PyTorch's PrivateUse1 slot is free (or holds
    it already) and ACCELKIT_BACKEND is unset or `name`; otherwise warns once
    (RuntimeWarning) and returns None, never raising for another backend,
    and the backend's `package` (its module name) is not kept in
    sys.modules. Returns torch.<name> where it is installed."""
    module = _autoload(name, library)
    if module is None:
        _forget(package)
    return module


def _autoload(name, library):
    current = torch._C._get_privateuse1_backend_name()
    if current == name:
        return install(name, library)  # installed already (or the slot named so)
    choice = os.environ.get(CHOICE, "").strip()
    if choice and choice != name:
        names = _installed_backends()  # read only where needed: it takes milliseconds
        first = next(iter(names), name) == name  # Warns about the variable.
        listed = ", ".join(sorted(names)) or "none"
        if not choice.isidentifier() or choice != choice.lower():
            if first:
                _warn_once(f"{CHOICE}:malformed",
                           f"{CHOICE}={choice!r} is not a backend's name (a lower-case identifier, "
                           f"as the device type); no accelkit backend was loaded by `import "
                           f"torch` (installed: {listed})")
            return None
        if choice not in names and first:
            _warn_once(f"{CHOICE}:unknown",
                       f"{CHOICE}={choice!r} names no installed accelkit backend; none was "
                       f"loaded by `import torch` (installed: {listed})")
        return None
    if not choice:
        requested = _being_imported()
        if requested not in (None, name):
            _warn_once(name, f"{name}: not loaded by `import torch`: PyTorch's one PrivateUse1 "
                             f"slot goes to {requested!r}, whose package is being imported; "
                             + _how_to_choose(name, _installed_backends()))
            return None
    if current != "privateuseone":
        chosen = f" although {CHOICE}={name}" if choice else ""
        how = ("set TORCH_DEVICE_BACKEND_AUTOLOAD=0 and import the package of the one to use"
               if choice else _how_to_choose(name, _installed_backends()))
        _warn_once(name, f"{name}: not loaded by `import torch`{chosen}: PyTorch's one "
                         f"PrivateUse1 slot is held by {current!r}, loaded first; " + how)
        return None
    return install(name, library)


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
        chosen = f" (chosen by {CHOICE}={current})" if os.environ.get(CHOICE, "").strip() == current else ""
        raise RuntimeError(f"accelkit.install({name!r}): PyTorch's PrivateUse1 slot is held by "
                           f"{current!r} already in this process{chosen}, and it has one such "
                           f"slot; to use {name}, set "
                           f"{CHOICE}={name} (the accelkit backend `import torch` loads), or "
                           f"import {name}'s package before torch, or set "
                           "TORCH_DEVICE_BACKEND_AUTOLOAD=0 and import only its package")
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

    from . import _dlpack, _sharing, device
    torch.utils.rename_privateuse1_backend(name)  # also names the profiler's activity
    torch._register_device_module(name, device)
    for sub in ("amp", "graphs", "random", "memory", "streams"):
        sys.modules[f"torch.{name}.{sub}"] = getattr(device, sub)
    device.memory._install_accelerator_snapshot()  # Note [torch.accelerator.memory._snapshot]
    _dlpack.install()  # Note [DLPack by tensor]
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
