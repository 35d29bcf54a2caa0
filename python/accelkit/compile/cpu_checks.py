"""Inductor's helpers that ask whether a device runs the CPU's C++ code,
answered as for the CPU for the installed backend's device (Note
[Inductor's CPU checks]), and the check that PyTorch's sources still read as
these replacements assume."""
import torch

from .. import _backend

# Note [Inductor's CPU checks]
# Problem: Inductor asks "does this device run the CPU's C++ code?" by
# comparing the device type with "cpu", in helpers that have no
# registration: torch._inductor.utils.get_current_backend ("cpp" for the
# CPU, "triton" otherwise; the C++ kernels' dtype propagation keys on it),
# scheduler.BaseSchedulerNode.is_cpu (keeps GPU-only scheduler passes, which
# crash on the C++ scheduling's groups, away from C++ kernels), ir.is_cpu
# (the CPU's fusion thresholds) and graph.GraphLowering.decide_layout_opt
# (channels-last convolutions where oneDNN is there).
# Decision: accelkit replaces them, once, with versions that also answer as
# for the CPU for the installed backend's device type while its scheduling
# is a CppScheduling (the default, or a vendor's subclass); every other
# device type gets the original's answer. The SDK's convolution is the
# CPU's (with the CPU's strides under fake tensors too: Note [The
# convolution's strides under fake tensors]), so graphs whose convolutions
# are on the CPU or the device get the CPU's layout answer. At registration
# each helper's source must still hold the line this was written against
# (PyTorch 2.13, _CPU_CHECKS); if PyTorch changed one, none is replaced and
# compiling for the device raises a RuntimeError saying so.
# Limits: Inductor's other "cpu" checks are numerics choices (a division by
# a constant, the two-step variance threshold): the device gets the GPU's
# choice there, so its results may differ from the compiled CPU's in the
# last bits.
# Evidence: bench/compile_torch_bench.py (compiled CNN forward against the CPU's).

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
            "the package accelkit.compile)")


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
