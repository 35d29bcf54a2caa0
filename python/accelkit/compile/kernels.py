"""Whether Inductor's C++ kernels may run on a device, the wait before each
of them, and what the compiled code's caches must key on (Note [Generated
code from the cache])."""
import torch

from .. import _backend
from . import cpu_checks, fake_conv

# Note [Generated code from the cache]
# Problem: the C++ scheduling refuses a device whose memory is not
# host-visible, or where the checks of Note [Inductor's CPU checks] or Note
# [The convolution's strides under fake tensors] failed. But Inductor's FX
# graph cache and AOT autograd's cache hand back generated code without
# generating it again, and their keys hold neither the devices' host
# visibility, nor those checks, nor which scheduling generated the code: a
# graph compiled where the memory is host-visible would run its host kernels
# where it is not.
# Decision: the device is registered with a custom pass
# (register_backend_for_device's device_custom_pass) that changes no graph
# and whose uuid() is _cache_conditions: the backend, the registered
# scheduling's qualified name, every device's host visibility and the
# checks' errors. Both caches hash it (the C++ wrapper's graphs included),
# so they miss when any of these differs, and the scheduling refuses at
# compile time, where suppress_errors can still run the graph eagerly. A
# backstop for code that comes back anyway (a cache written by another
# build of the SDK under the same conditions' text): the first
# wait_for_stream of each device in a process asks _refusal and raises a
# RuntimeError naming the backend and the device before any kernel touches
# its memory; later calls cost a set lookup.
# Limits: the backstop checks only while the registered scheduling is the
# C++ one or a subclass (a vendor's own may run kernels through the wrapper
# on any memory; register_codegen starts the checks afresh); its error
# cannot offer suppress_errors (Dynamo's fallback is past); the C++
# wrapper's waits (Note [The C++ wrapper]) do not check.


def _vendor_scheduling():
    """The scheduling register_codegen registered, or None (Note [The codegen
    slot])."""
    from . import registration  # imports this module: looked up when asked
    return (registration._vendor or {}).get("scheduling")


def _default_scheduling():
    """HostVisibleScheduling (built on first use: it needs torch._inductor)."""
    from .wrappers import _classes  # imports this module: looked up when asked
    return _classes()[0]


def host_visible(index: int) -> bool:
    """Whether device `index`'s memory is host-visible (capability schema)."""
    return bool(getattr(torch, _backend.name).get_device_properties(index)
                .get("host_visible_memory"))


def _refusal(devices, *, at_compile=True):
    """Why Inductor's C++ kernels may not run on `devices` (indices), or None.
    `at_compile`: asked while compiling (where suppress_errors falls back to
    eager), not by a graph already compiled."""
    checks = cpu_checks._patch_error or fake_conv._conv_error
    if checks:
        return checks
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
    scheduling = _vendor_scheduling() or _default_scheduling()
    return (f"accelkit:{_backend.name}", _qualified(scheduling),
            tuple(host_visible(i) for i in range(mod.device_count())),
            cpu_checks._patch_error, fake_conv._conv_error)


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
    chosen = _vendor_scheduling()
    return chosen is None or (isinstance(chosen, type)
                              and issubclass(chosen, _default_scheduling()))


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
                    "cache] in accelkit/compile/kernels.py)")
            _allowed.add(device)
        if index is not None:
            _allowed.add(index)
        elif _allowed.issuperset(range(mod.device_count())):
            _allowed.add(None)  # whichever device is current, it was checked
    torch.accelerator.current_stream(index).synchronize()
