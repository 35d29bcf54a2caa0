"""Registering the installed backend with torch.compile: Dynamo's device
interface and Inductor's code generators, each registered right after its
table's module is imported (Note [Registering without importing the
compiler]), and the vendor's own code generators (Note [The codegen
slot])."""
import importlib.abc
import sys
import threading

import torch

from .. import _backend
from . import cpu_checks, fake_conv, graphs, interface, kernels, wrappers

# Note [Registering without importing the compiler]
# Problem: PyTorch's two tables (Dynamo's device interfaces, Inductor's code
# generators) live in torch._dynamo and torch._inductor, which take seconds
# to import, and `import torch` loads neither; a backend must not pay for
# them at import.
# Decision: install() puts a finder on sys.meta_path that registers into
# each table right after its module has been executed (or at once, when it
# has been already), and takes itself off once both are done; the first of
# the two also checks and replaces the fake convolution (Note [The
# convolution's strides under fake tensors]).
# Limits: Dynamo reads the device interface only through
# get_interface_for_device and Inductor the code generators only through
# get_scheduling_for_device and friends, all after those imports; a reader
# of the tables that bypasses them would find the device missing.

# Note [The codegen slot]
# Problem: Inductor picks a device's code generators from one table
# (torch._inductor.codegen.common.register_backend_for_device): a scheduling
# (the kernels; Triton's, the C++ one, or a BaseScheduling subclass) and
# wrapper code generators (the host code calling them: Python, C++ for
# cpp_wrapper, FX). A vendor with a compiler of its own needs its entries
# there in place of the host-visible defaults.
# Decision: the vendor calls register_codegen(scheduling, python_wrapper=...,
# cpp_wrapper=..., device_op_overrides=...) any time after install(); what
# it names replaces the defaults (the Python wrapper defaults to
# HostVisibleWrapperCodegen, whose kernel calls wait for the current stream;
# get_raw_stream gives a vendor's kernels the stream to queue on instead).
# Registered before Inductor is imported, it is applied when it is.
# Limits: the C++ wrapper defaults to HostVisibleCppWrapperCodegen only for
# a CppScheduling (or subclass): for another scheduling without a
# cpp_wrapper of its own, cpp_wrapper=True fails with a RuntimeError naming
# the backend.

_DYNAMO = "torch._dynamo.device_interface"
_INDUCTOR = "torch._inductor.compile_fx"  # imports codegen.common, the scheduler and the IR

_lock = threading.RLock()  # registration may import, and an import may register
_registered = set()   # which of _DYNAMO, _INDUCTOR were registered into
_vendor = None        # register_codegen's arguments, once called


def register_codegen(scheduling, python_wrapper=None, cpp_wrapper=None, fx_wrapper=None,
                     device_op_overrides=None):
    """Registers the backend's own Inductor code generators (Note [The
    codegen slot]): `scheduling` a BaseScheduling subclass (or any callable
    taking the scheduler; None restores the defaults), the wrappers
    PythonWrapperCodegen-like classes (None: the defaults),
    `device_op_overrides` a DeviceOpOverrides instance (None: the default)."""
    global _vendor
    if _backend.name is None:
        raise RuntimeError("accelkit.compile.register_codegen: no backend is installed "
                           "(accelkit.install first)")
    if scheduling is not None and not callable(scheduling):
        raise ValueError(f"{_backend.name}: register_codegen expects a scheduling class, "
                         f"got {scheduling!r}")
    with _lock:
        kernels._allowed.clear()  # Note [Generated code from the cache]
        _vendor = None if scheduling is None else dict(
            scheduling=scheduling, python_wrapper=python_wrapper, cpp_wrapper=cpp_wrapper,
            fx_wrapper=fx_wrapper, device_op_overrides=device_op_overrides)
        if _INDUCTOR in _registered:
            _register_inductor()


def _register_inductor():
    from torch._inductor.codegen import common

    scheduling, wrapper, cpp_wrapper, overrides = wrappers._classes()
    vendor = _vendor or {}
    chosen = vendor.get("scheduling") or scheduling
    if vendor.get("cpp_wrapper"):
        cpp_wrapper = vendor["cpp_wrapper"]
    elif not (isinstance(chosen, type) and issubclass(chosen, _cpp_scheduling())):
        cpp_wrapper = _no_cpp_wrapper(chosen)  # the CPU's C++ host code fits C++ kernels only
    common.register_backend_for_device(
        _backend.name,
        chosen,
        vendor.get("python_wrapper") or wrapper,
        cpp_wrapper,
        vendor.get("fx_wrapper"),
        device_custom_pass=kernels._cache_key_pass())  # Note [Generated code from the cache]
    common.register_device_op_overrides(_backend.name,
                                        vendor.get("device_op_overrides") or overrides())
    cpu_checks._patch_cpu_checks()
    graphs._install()  # mode="reduce-overhead" (Note [Graphs under torch.compile])


def _cpp_scheduling():
    from torch._inductor.codegen.cpp import CppScheduling
    return CppScheduling


def _no_cpp_wrapper(scheduling):
    """The C++ wrapper slot of a vendor scheduling that generates no C++
    kernels and registered no C++ wrapper: refuses cpp_wrapper=True by name."""
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    name = _backend.name

    class NoCppWrapper(CppWrapperCpu):  # Inductor reads class attributes before create
        @classmethod
        def create(cls, *args, **kwargs):
            raise RuntimeError(
                f"{name}: torch._inductor.config.cpp_wrapper=True needs a C++ wrapper for the "
                f"registered scheduling {scheduling.__qualname__}, which is not a CppScheduling "
                "(the default C++ wrapper calls C++ kernels); pass one as "
                "accelkit.compile.register_codegen(..., cpp_wrapper=...) or use the Python "
                "wrapper (Note [The codegen slot] in accelkit/compile/registration.py)")

    return NoCppWrapper


def _register_dynamo():
    from torch._dynamo.device_interface import register_interface_for_device

    register_interface_for_device(_backend.name, interface.device_interface())
    for i in range(getattr(torch, _backend.name).device_count()):
        register_interface_for_device(f"{_backend.name}:{i}", interface.device_interface())


def _done(module: str) -> None:
    with _lock:
        if module in _registered:
            return
        _registered.add(module)
        fake_conv._patch_fake_convolution()  # before either table serves the device
        (_register_dynamo if module == _DYNAMO else _register_inductor)()
        if len(_registered) == 2 and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)


class _Finder(importlib.abc.MetaPathFinder):
    """Note [Registering without importing the compiler]: wraps the loader of
    the two modules so that registration follows their execution."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in (_DYNAMO, _INDUCTOR) or fullname in _registered:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, fullname):
        self.loader, self.fullname = loader, fullname

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _done(self.fullname)


_finder = _Finder()


def install() -> None:
    """Registers the installed backend with torch.compile (called by
    accelkit.install): at once where Dynamo and Inductor are imported
    already, otherwise right after they are (Note [Registering without
    importing the compiler])."""
    if _DYNAMO in sys.modules:
        _done(_DYNAMO)
    if _INDUCTOR in sys.modules:
        _done(_INDUCTOR)
    if len(_registered) < 2 and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
