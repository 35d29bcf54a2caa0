"""The vendor collective slot: a backend library's own collectives, which
replace gloo for the ones it implements (Note [The vendor collective
slot])."""
import collections
import os
import secrets
import socket
import warnings

import torch
import torch.distributed as dist

from .threads import _Ordered

# Note [The vendor collective slot]
# Problem: gloo over CPU tensors serves every backend, but a backend whose
# library ships collectives of its own (a shared-memory or fabric transport)
# should run them, while each collective falls back to gloo where the
# library lacks it.
# Decision: the library registers PyTorch operators in the namespace
# `<name>_collectives` (open, unlink, supports, close; then any of
# all_reduce, reduce, broadcast, all_gather, reduce_scatter, all_to_all,
# barrier; optionally abort; schemas in docs/design/distributed.md). When
# the group is made, every rank says through the c10d store whether it has
# the library and which host it is on; only if all have it on one host,
# rank 0 opens a communicator under a fresh name, the others open it, and
# rank 0 unlinks the name once all did; one failure anywhere leaves the
# whole group on gloo (ACCELKIT_NATIVE_COLLECTIVES=0 turns the slot off). A
# collective goes to the library when it registers the operator and
# supports(collective, op, dtype) says so: the answer depends only on values
# the ranks agreed on (_agree), so all ranks take the same path. The library
# gets the CPU tensors gloo would get, contiguous, after the stream's work
# (Note [The start on the group's thread]), on the connection's own thread in
# issue order. `seq`, the collective's number in the group (the same on
# every rank), lets a library tell a failed collective's leftovers from a
# later one's data; abort() fails every rank's collectives once the group
# failed (Note [A failed group]).
# Limits: gather, scatter, the list form of reduce_scatter, send and recv
# always run on gloo; ranks on several hosts always use gloo.


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


class _Native:
    """The vendor's collective library connected for one group (Note [The
    vendor collective slot])."""

    MEMBERS = ("open", "unlink", "supports", "close")
    # The collectives the group routes to the library when it registers them
    # (docs/design/distributed.md has their schemas).
    COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter",
                   "all_to_all", "barrier")

    def __init__(self, ops, comm, timeout_s):
        self.ops, self.comm, self.timeout_s = ops, comm, timeout_s
        self.calls = collections.Counter()  # collectives handed to the library
        self.has = set()
        for c in self.COLLECTIVES:
            try:
                getattr(ops, c)
            except (AttributeError, RuntimeError):
                continue
            self.has.add(c)
        self._answers = {}
        close = ops.close
        self._thread = _Ordered("accelkit-native", on_exit=lambda: close(comm),
                                join_s=2 * timeout_s)

    def close(self):
        """Ends the connection's thread once the queued calls are done (the
        group's shutdown: destroy_process_group), which closes the
        communicator; no thread of the group is left running at exit."""
        self._thread.close()

    @staticmethod
    def library(name):
        """The backend's `<name>_collectives` operators, or None."""
        ns = getattr(torch.ops, f"{name}_collectives")
        try:
            for m in _Native.MEMBERS:
                getattr(ns, m)
        except (AttributeError, RuntimeError):
            return None
        return ns

    @staticmethod
    def _open(ops, name, shm, rank, size, *, create):
        """The library's open(), or None when it fails (any error of the
        library: simdev's when /dev/shm has too little room for the
        segment): the group then runs on gloo, as when the library is
        absent."""
        try:
            return ops.open(shm, rank, size, create)
        except Exception as e:  # noqa: BLE001 (any failure of the library)
            warnings.warn(f"accelkit: {name}: the vendor collective library did not connect, "
                          f"the group's collectives run on gloo: {e}", RuntimeWarning,
                          stacklevel=4)
            return None

    @classmethod
    def connect(cls, name, store, rank, size, timeout):
        ops = cls.library(name)
        enabled = (ops is not None and size > 1
                   and os.environ.get("ACCELKIT_NATIVE_COLLECTIVES", "1") != "0")
        store = dist.PrefixStore("accelkit-native/", store)
        store.set(f"host/{rank}", f"{int(enabled)} {_host_id()}")
        hosts = [store.get(f"host/{r}").decode() for r in range(size)]
        if not all(h.startswith("1 ") for h in hosts) or len(set(hosts)) != 1:
            return None
        comm = None
        try:
            if rank == 0:
                shm = f"/accelkit-{name}-{os.getpid()}-{secrets.token_hex(6)}"
                try:
                    comm = cls._open(ops, name, shm, 0, size, create=True)
                finally:
                    store.set("name", shm if comm is not None else "")
            else:
                shm = store.get("name").decode()
                comm = (cls._open(ops, name, shm, rank, size, create=False) if shm
                        else None)
            store.set(f"open/{rank}", str(int(comm is not None)))
            every = [store.get(f"open/{r}") == b"1" for r in range(size)]
        except BaseException:
            # The store failed (its timeout): the group does not come up.
            if comm is not None:
                try:
                    ops.close(comm)
                except Exception:  # noqa: BLE001  (the store's error is the one to raise)
                    pass
            raise
        finally:
            # Rank 0 unlinks the name once every rank opened it, or when
            # connecting failed: none is left in /dev/shm. Every rank decides
            # below from the same `every`: a failed unlink must not make rank 0
            # leave while the others go on.
            if rank == 0 and comm is not None:
                try:
                    ops.unlink(shm)
                except Exception as e:  # noqa: BLE001 (any failure of the library)
                    warnings.warn(f"accelkit: {name}: could not unlink the shared segment "
                                  f"{shm}: {e}", RuntimeWarning, stacklevel=3)
        if not all(every):
            if comm is not None:
                ops.close(comm)
            return None
        return cls(ops, comm, timeout.total_seconds())

    def supports(self, collective, op, dtype):
        """Whether the library runs `collective` with reduce op `op` ("" for
        the others) on `dtype` (barrier: torch.uint8): it registers the
        operator and its supports() says so. The answer depends only on
        these, which the ranks agreed on: kept."""
        if collective not in self.has:
            return False
        key = (collective, op, dtype)
        if key not in self._answers:
            self._answers[key] = bool(self.ops.supports(collective, op, dtype))
        return self._answers[key]

    def count(self, collective):
        """How many `collective`s the library ran (its own count, where it
        keeps one: simdev's calls(comm, collective)), else handed to it."""
        if hasattr(self.ops, "calls"):
            return int(self.ops.calls(self.comm, collective))
        return self.calls[collective]

    def reductions(self):
        """all_reduce calls the library ran."""
        return self.count("all_reduce")

    def abort(self, reason):
        """Fails the library's running and later collectives on every rank
        (Note [A failed group]), where the library has abort()."""
        try:
            abort = self.ops.abort
        except (AttributeError, RuntimeError):
            return
        abort(self.comm, reason)

    def call(self, collective, outputs, seq, *args, timeout_s=-1):
        """The library's `collective(comm, seq, *args, timeout_s)` as a
        function for the connection's thread (`run`); `seq`: the
        collective's number in the group. The library takes contiguous CPU
        tensors: others among `args` go as contiguous copies, and those in
        `outputs` are copied back."""
        self.calls[collective] += 1
        op = getattr(self.ops, collective)
        comm = self.comm
        timeout_s = timeout_s if timeout_s > 0 else self.timeout_s
        back = []
        given = []
        for a in args:
            if isinstance(a, torch.Tensor) and not a.is_contiguous():
                c = a.contiguous()
                if any(a is o for o in outputs):
                    back.append((a, c))
                a = c
            given.append(a)

        def run():
            op(comm, seq, *given, timeout_s)
            for a, c in back:
                a.copy_(c)
        run.collective = collective
        return run

    def run(self, call, finish, fut, result):
        """Queues `call()` then `finish()` on the connection's thread; `fut`
        completes with `result` after both."""
        def job():
            call()
            finish()
        self._thread.put(job, fut, result)

