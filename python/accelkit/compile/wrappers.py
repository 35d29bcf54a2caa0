"""Inductor's code generators for a device with host-visible memory: the
C++ (CPU) scheduling, whose kernels read and write the device memory in
place, a Python wrapper and a C++ wrapper that make each generated kernel
wait for the device's current stream first, and the device-op overrides
(Note [Compiled kernels on host-visible memory], Note [The C++ wrapper])."""
import functools

import torch

from .. import _backend
from . import kernels

# Note [Compiled kernels on host-visible memory]
# Problem: on host-visible memory Inductor's C++ (CPU) code generator can
# serve the device unchanged: its kernels take data pointers, which are
# host-addressable there, so they read and write the device memory in place
# (no copies). But they are host code, and the device's streams run
# asynchronously: a kernel must not read a buffer before the work queued on
# the current stream has written it, nor write a block that queued work
# still reads (the caching allocator hands a block freed on a stream back to
# that stream at once).
# Decision: the wrapper emits wait_for_stream(<index>) before every
# generated kernel, as the SDK's host kernels and zero-copy fallback order
# themselves (Note [Host kernels]); extern kernels (mm, convolution) are the
# backend's own operators and order themselves, and work queued after a
# kernel follows it, since the kernel is done when the host moves on.
# PyTorch's wrapper names only the device type in allocations of a device
# that is not a GPU and enters no device guard for it; this one names the
# index, so a graph on <name>:1 allocates there whatever the current device.
# Limits: each kernel waits for the whole stream. A device without
# host-visible memory cannot run host code on its memory: the scheduling
# refuses with a RuntimeError naming the backend (a backend compiler
# failure, which suppress_errors turns into eager execution);
# torch.compile(backend="aot_eager") works there, and a vendor's code
# generator replaces this one (Note [The codegen slot]).

# Note [The C++ wrapper]
# Problem: with torch._inductor.config.cpp_wrapper, Inductor writes the host
# code around the kernels in C++, and PyTorch's C++ wrappers know only cpu,
# cuda, xpu and mps by name.
# Decision: the device gets the CPU's C++ wrapper with three changes:
# buffers are allocated on the device (aoti_torch_empty_strided with the
# PrivateUse1 device type; no index means the current device when the graph
# runs, as in the Python wrapper), the CPU's wrapper headers are included,
# and each generated kernel is called after accelkit_wait_for_stream(index),
# which waits for the device's current stream through PyTorch's device guard
# of the backend, for the reason of Note [Compiled kernels on host-visible
# memory].
# Limits: the C++ wrapper calls every ATen operator of the graph (mm, addmm,
# bmm, the convolutions, Inductor's fallbacks) through the AOTInductor C
# shim of the device, functions aoti_torch_<device>_<operator> that PyTorch
# generates for cpu, cuda, xpu and mps only; the CPU's would run the CPU
# kernel past the backend's operator. So a graph that calls an ATen operator
# on the device fails to compile with a RuntimeError saying so; graphs of
# generated kernels, and operators Inductor calls through the dispatcher
# (the device-generic aoti_torch_* shims, custom and unlisted operators),
# compile and run. AOTInductor for the device is refused with a
# RuntimeError. A backend may ship its own wrapper
# (register_codegen(cpp_wrapper=...)).

_CPP_WAIT_FOR_STREAM = """
#include <c10/core/Device.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
// accelkit (Note [The C++ wrapper]): the host waits for the device's current
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
                why = kernels._refusal(sorted(V.graph.device_idxs) or [mod_current()])
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
            self.imports.writeline(f"from {kernels.__name__} import wait_for_stream")

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
                    "torch.compile (Note [The C++ wrapper] in accelkit/compile/wrappers.py)")
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
                "accelkit/compile/wrappers.py)")

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
