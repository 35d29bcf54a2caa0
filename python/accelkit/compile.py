"""torch.compile for the backend this process installed (accelkit.install
registers it; nothing here is imported by PyTorch before it is needed).

Two registrations make a PrivateUse1 device a target of torch.compile's
default backend (Inductor), and this module makes both for any backend built
with accelkit:

- Dynamo's device interface (``torch._dynamo.device_interface``):
  :func:`device_interface` builds it from torch.<name> (current device and
  stream, streams and events, synchronize, device count, availability, the
  capability schema as properties, memory), with torch.cuda's semantics.
- Inductor's code generators (``torch._inductor.codegen.common``): on
  host-visible device memory, Inductor's C++ (CPU) scheduling, whose kernels
  read and write the device memory in place, and a Python wrapper that makes
  each generated kernel wait for the device's current stream first (Note
  [Compiled kernels on host-visible memory]), and the C++ wrapper for
  cpp_wrapper=True (Note [The C++ wrapper]). A vendor with code generators
  of its own plugs them in with :func:`register_codegen` (Note [The codegen
  slot]).

Besides, the fake tensors torch.compile traces with are told the strides of
the SDK's convolution on the device (Note [The convolution's strides under
fake tensors]).

Note [Registering without importing the compiler]
PyTorch's two tables live in torch._dynamo and torch._inductor, which take
seconds to import, and ``import torch`` loads neither; a backend must not
pay for them at import. So install() only puts a finder on sys.meta_path
that registers into each table right after its module has been executed
(or at once, when it has been already), and takes itself off once both are
done; the first of the two also checks and replaces the fake convolution
(Note [The convolution's strides under fake tensors]). Dynamo reads the device interface only through
``get_interface_for_device`` and Inductor the code generators only through
``get_scheduling_for_device`` and friends, all after those imports.
"""
import functools
import importlib.abc
import os
import sys
import threading

import torch

from . import _backend

__all__ = ["device_interface", "register_codegen", "host_visible", "HostVisibleScheduling",
           "HostVisibleWrapperCodegen", "HostVisibleCppWrapperCodegen", "wait_for_stream"]

_DYNAMO = "torch._dynamo.device_interface"
_INDUCTOR = "torch._inductor.compile_fx"  # imports codegen.common, the scheduler and the IR

_lock = threading.RLock()  # registration may import, and an import may register
_registered = set()   # which of _DYNAMO, _INDUCTOR were registered into
_vendor = None        # register_codegen's arguments, once called
_interface = None     # the device interface class, once built


# ------------------------------------------------------------ device interface

def _properties(device=None):
    """torch.<name>.get_device_properties, with the names Inductor reads of
    CUDA's properties (multi_processor_count, warp_size, major) filled in
    from the capability schema where it has them."""
    mod = getattr(torch, _backend.name)
    props = mod.get_device_properties(device)
    if "multi_processor_count" not in props:
        units = props.get("compute_units") or props.get("multi_processor_count")
        if not units or props.get("host_visible_memory"):
            # Inductor's C++ kernels run on the host's cores on host-visible
            # memory: its reduction splits should see those.
            units = units or os.cpu_count() or 1
        props["multi_processor_count"] = int(units)
    return props


def _compute_capability(device=None):
    """CUDA's interface answers major * 10 + minor; the capability schema has
    no such numbers. A backend whose schema reports `compute_capability` (or
    `major`/`minor`) gets it; otherwise the empty string, as the CPU's and
    MPS's interfaces answer."""
    props = getattr(torch, _backend.name).get_device_properties(device)
    if "compute_capability" in props:
        return props["compute_capability"]
    if "major" in props:
        return int(props["major"]) * 10 + int(props.get("minor", 0))
    return ""


def device_interface():
    """The Dynamo device interface of the installed backend (built once;
    torch._dynamo.device_interface must be importable, which importing it
    here does)."""
    global _interface
    if _interface is not None:
        return _interface
    from torch._dynamo.device_interface import DeviceInterface

    name = _backend.name
    mod = getattr(torch, name)

    def exchange(device: int) -> int:
        # torch.cuda._exchange_device: a negative index changes nothing and
        # answers -1; otherwise makes it current and answers the previous one.
        if device < 0:
            return -1
        prev = mod.current_device()
        if prev != device:
            mod.set_device(device)
        return prev

    class Worker:
        """Properties and the current device for Inductor's compile workers."""
        set_device = staticmethod(mod.set_device)
        current_device = staticmethod(mod.current_device)
        get_device_properties = staticmethod(_properties)

    class Interface(DeviceInterface):
        device = mod.device
        Event = mod.Event
        Stream = mod.Stream

        current_device = staticmethod(mod.current_device)
        set_device = staticmethod(mod.set_device)
        exchange_device = staticmethod(exchange)
        maybe_exchange_device = staticmethod(exchange)
        device_count = staticmethod(mod.device_count)
        is_available = staticmethod(mod.is_available)
        stream = staticmethod(mod.stream)
        current_stream = staticmethod(mod.current_stream)
        set_stream = staticmethod(mod.set_stream)
        synchronize = staticmethod(mod.synchronize)
        get_compute_capability = staticmethod(_compute_capability)
        is_bf16_supported = staticmethod(mod.is_bf16_supported)
        memory_allocated = staticmethod(mod.memory_allocated)

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            torch.accelerator.set_stream(torch.Stream(
                stream_id=stream_id, device_index=device_index, device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            # The current stream's id (c10's; CUDA answers its cudaStream_t):
            # what generated code hands a vendor's kernels.
            return torch.accelerator.current_stream(device_idx).stream_id

        @classmethod
        def get_device_properties(cls, device=None):
            return _properties(device)

        @classmethod
        def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
            return str(dtype).split(".")[1] in mod.get_device_properties()["dtypes"]

        @staticmethod
        def is_triton_capable(device=None) -> bool:
            return False

    Interface.Worker = Worker
    Interface.__name__ = Interface.__qualname__ = f"{name.capitalize()}Interface"
    _interface = Interface
    return Interface


# ------------------------------------------------------------ code generation

def host_visible(index: int) -> bool:
    """Whether device `index`'s memory is host-visible (capability schema)."""
    return bool(getattr(torch, _backend.name).get_device_properties(index)
                .get("host_visible_memory"))


def _refusal(devices, at_compile=True):
    """Why Inductor's C++ kernels may not run on `devices` (indices), or None.
    `at_compile`: asked while compiling (where suppress_errors falls back to
    eager), not by a graph already compiled."""
    if _patch_error or _conv_error:
        return _patch_error or _conv_error
    refused = [i for i in devices if not host_visible(i)]
    if refused:
        name = _backend.name
        eager = (" (or set torch._dynamo.config.suppress_errors=True to run such graphs "
                 "eagerly)") if at_compile else ""
        return (f"{name}: Inductor's C++ code generator runs kernels on the host and needs "
                f"host-visible device memory, which {name}:{refused[0]} does not have; use "
                f"torch.compile(backend='aot_eager'){eager}, or "
                "register a code generator of the backend's own "
                "(accelkit.compile.register_codegen)")
    return None


def _qualified(obj) -> str:
    if not isinstance(obj, type) and not hasattr(obj, "__qualname__"):
        obj = type(obj)
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', '?')}"


def _cache_conditions():
    """What the generated code of a graph for the device depends on beyond
    what Inductor's cache keys hold (Note [Generated code from the cache])."""
    mod = getattr(torch, _backend.name)
    scheduling = (_vendor or {}).get("scheduling") or _classes()[0]
    return (f"accelkit:{_backend.name}", _qualified(scheduling),
            tuple(host_visible(i) for i in range(mod.device_count())),
            _patch_error, _conv_error)


def _cache_key_pass():
    """The device's custom pass (register_backend_for_device): it changes no
    graph; its uuid puts _cache_conditions into the caches' keys."""
    from torch._inductor.custom_graph_pass import CustomGraphModulePass

    class CacheConditions(CustomGraphModulePass):
        def __call__(self, gm) -> None:
            pass

        def uuid(self):
            return repr(_cache_conditions())

    return CacheConditions()


_allowed = set()  # device indices whose generated kernels passed _refusal in this process


def _host_kernels() -> bool:
    """Whether the registered scheduling is the C++ one (HostVisibleScheduling
    or a vendor's subclass of it), whose kernels run on the host."""
    chosen = (_vendor or {}).get("scheduling")
    return chosen is None or (isinstance(chosen, type) and issubclass(chosen, _classes()[0]))


def wait_for_stream(index) -> None:
    """Blocks the host until the work queued so far on device `index`'s
    (None: the current device's) current stream is done: what each compiled
    kernel calls first. The first call for a device also checks that its
    kernels may run here (Note [Generated code from the cache])."""
    if index not in _allowed:
        mod = getattr(torch, _backend.name)
        device = mod.current_device() if index is None else index
        if device not in _allowed:
            why = _refusal([device], at_compile=False) if _host_kernels() else None
            if why:
                raise RuntimeError(
                    f"{why}. This graph's kernels were not generated for this configuration: "
                    "they came back from Inductor's cache (TORCHINDUCTOR_CACHE_DIR), whose "
                    "keys should have told the configurations apart; set "
                    "torch._inductor.config.fx_graph_cache = False and "
                    "torch._functorch.config.enable_autograd_cache = False, or use a cache "
                    "directory of this configuration's own (Note [Generated code from the "
                    "cache] in accelkit/compile.py)")
            _allowed.add(device)
        if index is not None:
            _allowed.add(index)
        elif _allowed.issuperset(range(mod.device_count())):
            _allowed.add(None)  # whichever device is current, it was checked
    torch.accelerator.current_stream(index).synchronize()


# Note [Generated code from the cache]
# The scheduling refuses to generate C++ kernels for a device whose memory
# is not host-visible, or where the checks of Notes [Inductor's CPU checks]
# and [The convolution's strides under fake tensors] failed. But Inductor's
# FX graph cache and AOT autograd's cache hand back a graph's generated code
# without generating it again, and by themselves their keys hold neither
# the device's host visibility, nor those checks, nor which scheduling
# generated the code (a graph compiled with SIMDEV_HOST_VISIBLE=1 came back,
# and ran its host kernels, in a process with SIMDEV_HOST_VISIBLE=0). So
# these go into the keys: the device is registered with a custom pass
# (register_backend_for_device's device_custom_pass) that changes no graph
# and whose uuid() is _cache_conditions (the backend, the registered
# scheduling's qualified name, every device's host visibility, the two
# checks' errors); FxGraphHashDetails hashes every device's custom pass and
# AOTAutogradCacheDetails is one, so both caches, the C++ wrapper's graphs
# included, miss when any of them differs, and the scheduling refuses at
# compile time, where torch.compile reports a BackendCompilerFailed and
# suppress_errors runs the graph eagerly. A backstop stays for code that
# comes back anyway (a cache written by another build of the SDK under the
# same conditions' text, say): the first wait_for_stream of each device in
# a process asks the same question (_refusal, of the scheduling registered
# now) and raises a RuntimeError naming the backend and the device before
# any kernel touches its memory; later calls cost a set lookup (None, the
# current device, once every device was checked). Only while the registered
# scheduling is the C++ one (or a subclass): a vendor's own scheduling may
# call its kernels through this wrapper on any memory (register_codegen
# starts the checks afresh). At run time Dynamo's fallback is past, so the
# backstop's error does not offer suppress_errors. The C++ wrapper's waits
# (Note [The C++ wrapper]) do not check.


# Note [Compiled kernels on host-visible memory]
# On host-visible memory Inductor's C++ (CPU) code generator serves the
# device unchanged: its kernels take data pointers, and a device tensor's
# data pointer is host-addressable there, so they read and write the device
# memory in place (no copies). They are host code, though, and the device's
# streams run asynchronously: a kernel must not read a buffer before the work
# queued on the current stream has written it (an asynchronous copy into an
# input, a fill of a freshly allocated output), nor write a block that queued
# work still reads (the caching allocator hands a block freed on the stream
# back to the same stream at once). So the wrapper emits
# `wait_for_stream(<index>)` before every generated kernel, as the SDK's host
# kernels and zero-copy fallback order themselves (Note [Host kernels]);
# extern kernels (mm, convolution) are the backend's own operators and order
# themselves. Work queued after a kernel follows it, since the kernel is
# done when the host moves on. PyTorch's wrapper enters no device guard for
# a device that is not a GPU and names only the device type in allocations
# of such a device; this wrapper names the index, so a graph on <name>:1
# allocates there whatever the current device.
# A backend without host-visible memory cannot run host code on its memory:
# its scheduling refuses with a RuntimeError naming the backend, which
# torch.compile reports as a backend compiler failure (and
# torch._dynamo.config.suppress_errors turns into a warning and eager
# execution, as PyTorch documents); torch.compile(backend="aot_eager") works
# there, and a vendor's code generator replaces this one (Note [The codegen
# slot]).

# Note [The C++ wrapper]
# With torch._inductor.config.cpp_wrapper, Inductor writes the host code
# around the kernels in C++ instead of Python. The device gets the CPU's
# C++ wrapper with three changes: buffers are allocated on the device
# (aoti_torch_empty_strided with PyTorch's PrivateUse1 device type: the
# wrapper knows only cpu, cuda, xpu and mps by name), the CPU's wrapper
# headers are included, and each generated kernel is called after
# accelkit_wait_for_stream(<index>), which waits for the device's current
# stream through PyTorch's device guard of the backend (what
# torch.Stream.synchronize does), for the reason of Note [Compiled kernels
# on host-visible memory]. What stops the rest: the C++ wrapper calls every
# ATen operator of the graph (the extern kernels mm, addmm, bmm, the
# convolutions, and Inductor's fallbacks) through the AOTInductor C shim of
# the device, a function aoti_torch_<device>_<operator> per operator that
# PyTorch generates for cpu, cuda, xpu and mps only and has no registration
# for; the CPU's shim calls the CPU kernel directly (at::cpu::...), past the
# backend's operator, its stream order and its own kernels, and its
# functional forms allocate CPU tensors. So a graph that calls an ATen
# operator on the device fails to compile with a RuntimeError saying so
# (torch.compile reports it as InductorError); graphs of generated kernels
# only (elementwise, reductions) compile and run, and so do operators
# Inductor calls through the dispatcher (the device-generic aoti_torch_*
# shims such as aoti_torch_copy_, and its runtime lookup of custom and
# unlisted operators). AOTInductor for the device is not done either (the
# same shim, and an AOT wrapper of its own): it fails with a RuntimeError.
# A device without an index means the current device when the graph runs,
# as in the Python wrapper.
# A backend may ship its own wrapper (register_codegen(cpp_wrapper=...)).

_CPP_WAIT_FOR_STREAM = """
#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
// Note [The C++ wrapper] (accelkit): the host waits for the device's current
// stream before each generated kernel reads or writes its memory.
static inline int accelkit_current_device() {
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index();
}
static inline void accelkit_wait_for_stream(int index) {
  const c10::impl::DeviceGuardImplInterface* impl =
      c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1);
  impl->synchronizeStream(impl->getStream(c10::Device(c10::DeviceType::PrivateUse1,
                                                      static_cast<c10::DeviceIndex>(index))));
}
"""


@functools.cache
def _classes():
    """The C++ scheduling, wrapper and device-op overrides for the installed
    backend (built on first use; they need torch._inductor)."""
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.virtualized import V

    name = _backend.name

    class HostVisibleScheduling(CppScheduling):
        """Inductor's C++ scheduling for a device with host-visible memory."""

        def __init__(self, scheduler):
            if scheduler is not None:  # None: a query of the backend's features
                why = _refusal(sorted(V.graph.device_idxs) or [mod_current()])
                if why:
                    raise RuntimeError(why)
            super().__init__(scheduler)

    class HostVisibleWrapperCodegen(PythonWrapperCodegen):
        """Python wrapper: generated (non-Triton) kernels of the device are
        called as the CPU's are, each after waiting for the current stream."""

        @classmethod
        def create(cls, is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                from torch._inductor.codegen.wrapper import SubgraphPythonWrapperCodegen
                return SubgraphPythonWrapperCodegen(subgraph_name, parent_wrapper,
                                                    partition_signatures)
            return cls()

        def write_header(self) -> None:
            super().write_header()
            self.imports.writeline(f"from {__name__} import wait_for_stream")

        def make_allocation(self, buf, device, dtype, shape, stride, allocation_shape=None,
                            is_pinned=False):
            # PyTorch's wrapper names only the device type for a device
            # other than cpu/cuda/xpu/mtia, so buffers would go to the
            # current device; and it enters no device guard for a device
            # that is not a GPU. A graph on <name>:1 allocates there.
            if device.type != name or device.index is None:
                return super().make_allocation(buf, device, dtype, shape, stride,
                                               allocation_shape, is_pinned)
            size = self.codegen_python_shape_tuple(
                shape if allocation_shape is None else allocation_shape)
            strides = self.codegen_python_shape_tuple(stride)
            out = (f"{buf} = empty_strided({size}, {strides}, device='{device}', "
                   f"dtype={dtype})")
            if allocation_shape is not None and list(allocation_shape) != list(shape):
                out += f".as_strided({self.codegen_python_shape_tuple(shape)}, {strides})"
            return out

        def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None,
                                         triton=True, **kwargs):
            device = device or V.graph.get_current_device_or_throw()
            if not triton and device.type == name:
                self.writeline(f"wait_for_stream({device.index})")
                self.writeline(self.wrap_kernel_call(kernel_name, call_args))
                return
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device,
                                                        triton=triton, **kwargs)

    class HostVisibleCppWrapperCodegen(CppWrapperCpu):
        """Inductor's C++ wrapper (cpp_wrapper=True) for the device: the
        CPU's, allocating on the device and calling each generated kernel
        after waiting for the current stream; ATen operators are refused
        (Note [The C++ wrapper])."""

        @staticmethod
        def get_device_include_path_jit(device: str) -> str:
            return CppWrapperCpu.get_device_include_path_jit("cpu" if device == name else device)

        @staticmethod
        def get_device_include_path_aot(device: str) -> str:
            return CppWrapperCpu.get_device_include_path_aot("cpu" if device == name else device)

        @classmethod
        def create(cls, is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if V.graph.aot_mode:
                raise RuntimeError(
                    f"{name}: AOTInductor (torch._inductor.aoti_compile_and_package, "
                    "torch._export.aot_compile) is not supported for the device; use "
                    "torch.compile (Note [The C++ wrapper] in accelkit/compile.py)")
            return cls()  # as CppWrapperCpu.create: subgraphs are not lifted

        @staticmethod
        def get_c_shim_func_name(kernel: str, device: str) -> str:
            # Only the name (also asked for comments and provenance, and for
            # operators called through the dispatcher at run time): emitting a
            # device-specific shim call is refused in
            # generate_c_shim_extern_kernel_call and _generate_scatter_fallback.
            return CppWrapperCpu.get_c_shim_func_name(kernel, device)

        @staticmethod
        def _refuse_device_shim(kernel: str, device: str) -> None:
            # aoti_torch_* names (aoti_torch_copy_, aoti_torch_index_put_out) are
            # device-generic shims that call the operator through the dispatcher.
            # Names come resolved (ExternKernel.get_kernel_name) or not.
            shim = CppWrapperCpu.get_c_shim_func_name(kernel, device)
            if device != name or not shim.startswith(f"aoti_torch_{name}_"):
                return
            raise RuntimeError(
                f"{name}: Inductor's C++ wrapper (torch._inductor.config.cpp_wrapper) would "
                f"call the ATen operator {kernel} through {shim}, a function of the "
                f"AOTInductor C shim, which PyTorch generates for cpu, cuda, xpu and mps "
                "only (the CPU's would run the CPU kernel past the backend's operator: its "
                "stream order, its own kernels). Graphs of generated kernels, and operators "
                "Inductor calls through the dispatcher, compile with it; use the Python "
                "wrapper (cpp_wrapper=False) otherwise (Note [The C++ wrapper] in "
                "accelkit/compile.py)")

        def generate_c_shim_extern_kernel_call(self, kernel, args, device, **kwargs):
            self._refuse_device_shim(kernel, device)
            return super().generate_c_shim_extern_kernel_call(kernel, args, device, **kwargs)

        def _generate_scatter_fallback(self, output, inputs, cpp_kernel_name, *args):
            self._refuse_device_shim(cpp_kernel_name, args[-1])  # args[-1]: the device
            return super()._generate_scatter_fallback(output, inputs, cpp_kernel_name, *args)

        def codegen_device(self, device):
            if device.type != name:
                return super().codegen_device(device)
            self.used_cached_devices.add("privateuse1")  # aoti_torch_device_type_privateuse1()
            # No index: the current device when the graph runs, as in the Python wrapper.
            index = "accelkit_current_device()" if device.index is None else device.index
            return f"cached_torch_device_type_privateuse1, {index}"

        def write_header(self) -> None:
            super().write_header()
            self.header.splice(_CPP_WAIT_FOR_STREAM)

        def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None,
                                         triton=True, **kwargs):
            device = device or V.graph.get_current_device_or_throw()
            if not triton and device.type == name:
                index = "accelkit_current_device()" if device.index is None else device.index
                self.writeline(f"accelkit_wait_for_stream({index});")
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device,
                                                        triton=triton, **kwargs)

    class DeviceOpOverrides(CpuDeviceOpOverrides):
        """The CPU's, with the backend's device guard and synchronize."""

        def set_device(self, device_idx: int) -> str:
            return "pass"  # the guard sets it

        def synchronize(self) -> str:
            return f"torch.{name}.synchronize()"

        def device_guard(self, device_idx: int) -> str:
            return f"torch.{name}.device({device_idx})"

    def mod_current():
        return getattr(torch, name).current_device()

    return (HostVisibleScheduling, HostVisibleWrapperCodegen, HostVisibleCppWrapperCodegen,
            DeviceOpOverrides)


# Note [Inductor's CPU checks]
# Inductor asks "does this device run the CPU's C++ code?" by comparing the
# device type with "cpu", in helpers that have no registration:
# - torch._inductor.utils.get_current_backend (bound by name also in
#   codegen.common and scheduler): "cpp" for the CPU, config.cuda_backend
#   ("triton") for any other device type; the dtype propagation of the C++
#   kernels' values keys on it (an index expression of a vectorized loop
#   fails an assertion without it);
# - torch._inductor.scheduler.BaseSchedulerNode.is_cpu: keeps GPU-only
#   scheduler passes (loop reordering and reindexing for Triton's
#   (numel, rnumel) groups, which crash on the C++ scheduling's groups: a
#   training step fails with a TypeError in _try_reindex_pointwise_for_reduction)
#   away from C++ kernels;
# - torch._inductor.ir.is_cpu: the CPU's fusion thresholds;
# - torch._inductor.graph.GraphLowering.decide_layout_opt: whether a graph's
#   convolutions get channels-last inputs, always on the CPU when oneDNN
#   (mkldnn) is there ("cpu" in SUPPORTED_MKLDNN_DEVICES). The SDK's
#   convolution is the CPU's (with the CPU's strides under fake tensors too:
#   Note [The convolution's strides under fake tensors]), so graphs whose
#   convolutions are on the CPU or the device get the CPU's answer (the
#   benchmark's compiled CNN forward went from 2.78x the CPU's to 1.13x).
# accelkit replaces them, once, with versions that also answer as for the
# CPU for the installed backend's device type while its scheduling is a
# CppScheduling (the default, or a vendor's subclass of it). Contained:
# every other device type gets the original's answer. Checked: at
# registration each helper's source must still hold the line this was
# written against (PyTorch 2.13, _CPU_CHECKS below); if PyTorch changed one,
# none is replaced and compiling for the device raises a RuntimeError saying
# so, rather than generating code on unchecked assumptions. Inductor's other
# "cpu" checks are numerics choices (a division by a constant kept as a
# division on the CPU, the two-step variance threshold): the device gets the
# GPU's choice there, so its results may differ from the compiled CPU's in
# the last bits (the tests compare with a tolerance).

_CPU_CHECKS = {  # (module, qualified name): a line its source must hold
    ("torch._inductor.utils", "get_current_backend"): "return config.cuda_backend",
    ("torch._inductor.scheduler", "BaseSchedulerNode.is_cpu"):
        'return device is not None and device.type == "cpu"',
    ("torch._inductor.ir", "is_cpu"): 'return get_device_type(x) == "cpu"',
    ("torch._inductor.graph", "GraphLowering.decide_layout_opt"):
        'n.args[idx].meta["val"].device.type in SUPPORTED_MKLDNN_DEVICES',
}
_patch_error = None  # why the helpers were not replaced (None: replaced, or not yet tried)


def _cpp_like(device_type) -> bool:
    if device_type != _backend.name:
        return False
    from torch._inductor.codegen.common import get_scheduling_for_device
    from torch._inductor.codegen.cpp import CppScheduling
    scheduling = get_scheduling_for_device(device_type)
    return isinstance(scheduling, type) and issubclass(scheduling, CppScheduling)


def _changed(checks, what="torch.compile's C++ code generation", note="Inductor's CPU checks"):
    """Why `checks` ({(module, qualified name): a line of its source, or a
    tuple of lines}) do not hold in this PyTorch, or None (Note [Inductor's
    CPU checks]); `what` was checked, as its Note `note` says."""
    import importlib
    import inspect

    for (module, qualname), lines in checks.items():
        try:
            obj = importlib.import_module(module)
            for part in qualname.split("."):
                obj = getattr(obj, part)
            source = inspect.getsource(obj)  # unwraps a replaced helper
        except (ImportError, AttributeError, OSError, TypeError):
            source = ""
        if not all(line in source for line in ((lines,) if isinstance(lines, str) else lines)):
            return _unchecked(f"{module}.{qualname}", what, note)
    return None


def _unchecked(where, what, note):
    return (f"{_backend.name}: {what} was checked against PyTorch 2.13's {where}, which this "
            f"PyTorch ({torch.__version__}) changed or lacks (Note [{note}] in "
            "accelkit/compile.py)")


def _patch_cpu_checks():
    """Note [Inductor's CPU checks]."""
    global _patch_error
    from torch._inductor import graph, ir, scheduler, utils
    from torch._inductor.codegen import common
    from torch._inductor.virtualized import V

    if getattr(utils.get_current_backend, "_accelkit", False):
        return
    _patch_error = _changed(_CPU_CHECKS)
    if _patch_error:
        return

    orig_backend, orig_node, orig_ir = (utils.get_current_backend,
                                        scheduler.BaseSchedulerNode.is_cpu, ir.is_cpu)
    orig_layout = graph.GraphLowering.decide_layout_opt

    def decide_layout_opt(gm, *, is_inference):
        from torch._inductor import config
        if config.layout_optimization and not config.force_layout_optimization:
            devices = {n.args[i].meta["val"].device.type for n in gm.graph.nodes
                       if n.target is torch.ops.aten.convolution.default for i in (0, 1)}
            if (any(_cpp_like(d) for d in devices) and all(d == "cpu" or _cpp_like(d) for d in devices)
                    and torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()):
                return True  # the CPU's answer: the device's convolution is the CPU's
        return orig_layout(gm, is_inference=is_inference)

    def get_current_backend(device_type=None) -> str:
        if _cpp_like(device_type or V.graph.get_current_device_or_throw().type):
            return "cpp"
        return orig_backend(device_type)

    def node_is_cpu(self) -> bool:
        device = self.get_device()
        return device is not None and (device.type == "cpu" or _cpp_like(device.type))

    def is_cpu(x) -> bool:
        return orig_ir(x) or _cpp_like(ir.get_device_type(x))

    for new, orig in ((get_current_backend, orig_backend), (node_is_cpu, orig_node),
                      (is_cpu, orig_ir), (decide_layout_opt, orig_layout)):
        new._accelkit, new.__wrapped__ = True, orig
    graph.GraphLowering.decide_layout_opt = staticmethod(decide_layout_opt)
    for module in (utils, common, scheduler):
        if getattr(module, "get_current_backend", None) is orig_backend:
            module.get_current_backend = get_current_backend
    scheduler.BaseSchedulerNode.is_cpu = node_is_cpu
    ir.is_cpu = is_cpu


# Note [The convolution's strides under fake tensors]
# torch.compile traces with fake tensors, whose convolution
# (torch._subclasses.fake_impls.conv) gives the output the memory format
# ATen's _conv_determine_backend_memory_format picks for the backend that
# _select_conv_backend chooses on the fake tensors' device: on a PrivateUse1
# device, Overrideable, whose format is always contiguous. The SDK's
# convolution (convolution.hpp) runs the CPU's convolution on the same
# sizes and strides and hands its result over with those strides kept, so
# on every accelkit backend a convolution returns what the CPU's returns:
# channels-last for a channels-last input (as CUDA's does), not the fake's
# contiguous. A graph with such a convolution then failed Inductor's stride
# check of the convolution's output, and ran on wrong strides under
# backend="aot_eager". So the fake convolution of the installed backend's
# device type is answered as the CPU's: the original implementation runs on
# CPU fake tensors of the same sizes and strides, and its outputs are made
# fake tensors of the device with the strides it gave (the forward, and
# convolution_backward's gradients). Every other device type gets the
# original. That the two agree is tested eagerly against compiled
# (tests/python/test_compile.py, channels-last inputs); with it, Inductor's
# layout optimization (channels-last convolutions, Note [Inductor's CPU
# checks]) serves the device as it serves the CPU.
# Checked, as Note [Inductor's CPU checks] (the same _changed), when Dynamo
# or Inductor registers the backend (Note [Registering without importing the
# compiler]; not at install, where reading the sources cost 2-4 ms of every
# `import torch` that autoloads the backend; torch.compile and
# torch.export import torch._dynamo before they trace, while fake tensors of
# a FakeTensorMode used before that get PyTorch's contiguous answer): the
# source of fake_impls' conv must still choose the memory format through
# _select_conv_backend and _conv_determine_backend_memory_format on the
# inputs' device and make its outputs fake tensors of that device, its
# dispatch must still go through op_implementations_dict (_CONV_CHECKS), and
# that table must hold that conv for each of the four operators; if not,
# nothing is replaced and compiling for the device with its C++ code
# generation (HostVisibleScheduling, a vendor's subclass of it) raises a
# RuntimeError naming the backend and what changed, rather than trace the
# device's convolutions on unchecked assumptions (and give the layout
# optimization above fake strides that disagree with the SDK's).

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


def __getattr__(attr):
    if attr in ("HostVisibleScheduling", "HostVisibleWrapperCodegen",
                "HostVisibleCppWrapperCodegen"):
        scheduling, wrapper, cpp_wrapper, _ = _classes()
        globals().update(HostVisibleScheduling=scheduling, HostVisibleWrapperCodegen=wrapper,
                         HostVisibleCppWrapperCodegen=cpp_wrapper)
        return globals()[attr]
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


# Note [The codegen slot]
# Inductor picks a device's code generators from one table
# (torch._inductor.codegen.common.register_backend_for_device): a
# scheduling (the kernels: their fusion and source; Triton's, the C++ one,
# or a vendor's BaseScheduling subclass) and wrapper code generators (the
# host code calling them: Python, C++ for cpp_wrapper, FX). A vendor calls
# register_codegen(scheduling, python_wrapper=..., cpp_wrapper=...,
# device_op_overrides=...) any time after install(); what it names replaces
# the host-visible defaults (the Python wrapper defaults to
# HostVisibleWrapperCodegen, whose kernel calls wait for the current stream;
# get_raw_stream gives a vendor's kernels the stream to queue on instead).
# The C++ wrapper defaults to HostVisibleCppWrapperCodegen only for a
# CppScheduling (or subclass): for another scheduling without a cpp_wrapper
# of its own, cpp_wrapper=True fails with a RuntimeError naming the backend.
# Registered before Inductor is imported, it is applied when it is.

def register_codegen(scheduling, python_wrapper=None, cpp_wrapper=None, fx_wrapper=None,
                     device_op_overrides=None):
    """Registers the backend's own Inductor code generators (Note [The
    codegen slot]): `scheduling` a BaseScheduling subclass (or any callable
    taking the scheduler; None restores the defaults), the wrappers PythonWrapperCodegen-like classes
    (None: the defaults), `device_op_overrides` a DeviceOpOverrides instance
    (None: the default)."""
    global _vendor
    if _backend.name is None:
        raise RuntimeError("accelkit.compile.register_codegen: no backend is installed "
                           "(accelkit.install first)")
    if scheduling is not None and not callable(scheduling):
        raise ValueError(f"{_backend.name}: register_codegen expects a scheduling class, "
                         f"got {scheduling!r}")
    with _lock:
        _allowed.clear()  # Note [Generated code from the cache]
        _vendor = None if scheduling is None else dict(
            scheduling=scheduling, python_wrapper=python_wrapper, cpp_wrapper=cpp_wrapper,
            fx_wrapper=fx_wrapper, device_op_overrides=device_op_overrides)
        if _INDUCTOR in _registered:
            _register_inductor()


def _register_inductor():
    from torch._inductor.codegen import common

    scheduling, wrapper, cpp_wrapper, overrides = _classes()
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
        device_custom_pass=_cache_key_pass())  # Note [Generated code from the cache]
    common.register_device_op_overrides(_backend.name,
                                        vendor.get("device_op_overrides") or overrides())
    _patch_cpu_checks()


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
                "wrapper (Note [The codegen slot] in accelkit/compile.py)")

    return NoCppWrapper


def _register_dynamo():
    from torch._dynamo.device_interface import register_interface_for_device

    register_interface_for_device(_backend.name, device_interface())
    for i in range(getattr(torch, _backend.name).device_count()):
        register_interface_for_device(f"{_backend.name}:{i}", device_interface())


def _done(module: str) -> None:
    with _lock:
        if module in _registered:
            return
        _registered.add(module)
        _patch_fake_convolution()  # before either table serves the device
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
