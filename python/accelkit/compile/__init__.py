"""torch.compile for the backend this process installed (accelkit.install
registers it; nothing here imports torch._dynamo or torch._inductor before
PyTorch does: Note [Registering without importing the compiler]).
docs/design/compile.md describes the design.

Two registrations make a PrivateUse1 device a target of torch.compile's
default backend (Inductor), and this package makes both for any backend
built with accelkit:

- Dynamo's device interface (interface): built from torch.<name>, with
  torch.cuda's semantics.
- Inductor's code generators (wrappers): on host-visible device memory,
  Inductor's C++ (CPU) scheduling, whose kernels read and write the device
  memory in place, with a Python wrapper and a C++ wrapper that make each
  generated kernel wait for the device's current stream first (Note
  [Compiled kernels on host-visible memory], Note [The C++ wrapper]). A
  vendor with code generators of its own plugs them in with
  register_codegen (Note [The codegen slot]).

mode="reduce-overhead" captures the compiled graphs into the backend's
graphs through Inductor's graph policy (graphs: Note [Graphs under
torch.compile]).

The other modules: kernels (whether the C++ kernels may run on a device, the
wait before each, the caches' keys: Note [Generated code from the cache]),
cpu_checks (Note [Inductor's CPU checks]), fake_conv (Note [The
convolution's strides under fake tensors]) and registration (both tables,
and the codegen slot).
"""
from .. import _backend  # noqa: F401  (which backend this copy of the package serves)
from .graphs import graph_policy
from .interface import device_interface
from .kernels import host_visible, wait_for_stream
from .registration import install, register_codegen  # noqa: F401  (install: accelkit.install)

__all__ = ["device_interface", "register_codegen", "graph_policy", "host_visible", "HostVisibleScheduling",
           "HostVisibleWrapperCodegen", "HostVisibleCppWrapperCodegen", "wait_for_stream"]

_LAZY = ("HostVisibleScheduling", "HostVisibleWrapperCodegen", "HostVisibleCppWrapperCodegen")


def __getattr__(attr):
    """The code generator classes, built on first use (they need
    torch._inductor)."""
    if attr in _LAZY:
        from .wrappers import _classes
        scheduling, wrapper, cpp_wrapper, _ = _classes()
        globals().update(HostVisibleScheduling=scheduling, HostVisibleWrapperCodegen=wrapper,
                         HostVisibleCppWrapperCodegen=cpp_wrapper)
        return globals()[attr]
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
