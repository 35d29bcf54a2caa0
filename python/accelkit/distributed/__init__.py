"""torch.distributed for the installed backend: a c10d process group named
after the device (``init_process_group("cpu:gloo,simdev:simdev")``, or
``init_process_group()`` on a machine whose accelerator is the device) that
runs every collective on an inner gloo group (Note [Collectives on gloo]),
or on the backend library's own collectives (Note [The vendor collective
slot]). docs/design/distributed.md describes the design.

The modules, one concern each:

- group: ProcessGroup, its state and threads, and the issue of each
  collective after the stream's work (Note [The start on the group's
  thread], Note [Collectives in issue order]); register.
- collectives: c10d's collectives on the group.
- agreement: each rank's checks and the ranks' agreement on a collective.
- staging: the CPU tensors gloo gets for device tensors.
- work: the work a collective returns (Note [wait() on the stream]).
- failures: the group's failure (Note [A failed group]).
- threads: the group's own threads (Note [Completion on a thread of the
  group's own]).
- native: the vendor collective slot.
- signals: the backend's host signals as the group uses them.
"""
from .failures import _Failures  # noqa: F401  (private names tests use)
from .group import ProcessGroup, register
from .native import _Native  # noqa: F401
from .work import _Work  # noqa: F401

__all__ = ["ProcessGroup", "register"]
