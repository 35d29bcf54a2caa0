"""The backend's c10d process group: its state, its threads and the issue
of each collective (Note [Collectives on gloo])."""
import collections
import datetime
import itertools
import os
import threading

import torch
import torch.distributed as dist

from .. import _backend
from .agreement import _Agreement
from .collectives import _Collectives
from .failures import _Failures, _Published
from .native import _Native
from .staging import _overlap
from .threads import _gloo_job, _Ordered, _Starter, _wait_ready
from .work import _Work

# Note [Collectives on gloo]
# Problem: torch.distributed needs a process group for the device, and a
# vendor's runtime has no collectives library in general.
# Decision: the group is a Python torch.distributed.ProcessGroup registered
# for the device type (Backend.register_backend(name, ..., devices=[name])),
# and each collective over device tensors runs on an inner gloo group over
# CPU tensors: views of the device memory itself where it is host-visible
# and the tensor contiguous (zero-copy), otherwise blocks of the backend's
# pinned pool filled from the device at the start and copied back when
# gloo is done. CPU tensors go to gloo unchanged, so the group also serves
# `cpu:` alone. Reductions: SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR on gloo,
# AVG as a SUM divided by the group's size (integers truncated, as NCCL).
# Limits: PREMUL_SUM is refused, as are bitwise reductions of floating-point
# tensors; staged copies run on the group's threads, not queued on a stream;
# with async_op=True, device work queued on the tensors between the call
# and wait() races with the collective.

# Note [The start on the group's thread]
# Problem: a collective must start after the work queued on its device's
# current stream, as on CUDA, without blocking the calling thread, and the
# group's gloo calls must come in the same order on every rank.
# Decision: the call records an event on that stream (none when it is idle);
# the start (the event's wait, the staged inputs' copy, the call into gloo
# or the vendor's library) runs on a thread of the group's own (_Starter) in
# issue order, or inline on the calling thread when nothing is queued, the
# stream is idle and nothing needs waiting for or copying. The ranks'
# agreement stays on the calling thread, on a gloo group of its own. A start
# that fails (the stream's error, gloo's refusal) fails the work.
# Limits: the start waits for the stream's work at most the group's timeout
# (_wait_ready): a stream held up forever fails the collective, as a peer
# that never comes does.

# Note [Collectives in issue order]
# Problem: c10d runs a group's collectives in issue order, a later one
# seeing what an earlier one wrote. gloo keeps that order only among its own
# collectives on memory it reads and writes in place: not when results reach
# device memory late (staged, copied back on completion; an AVG divided
# after gloo's sum), when inputs are read outside gloo (staged at the
# start), nor across engines (the vendor's library has its own thread).
# Decision: a collective's start first waits for the one issued before it
# when that one's results come late, or when this one runs on the library
# or stages its inputs. A send or receive waits only for what it must: the
# collective before it (not a send or receive) on that rule, and an earlier
# receive still in flight only where their tensors overlap, so that
# batch_isend_irecv([irecv, isend]) on both ranks does not deadlock. The
# receives in flight are kept (_p2p_writes); the next collective that is
# neither waits for the staged ones. The earlier ones' errors are left to
# their own wait(); the calling thread does not wait.
# Limits: the waits serialize staged collectives on the start thread.

# The last work issued, whether its results reach memory late (staged, the
# vendor's library, an AVG), and whether it is a send or receive (Note
# [Collectives in issue order]).
_Issued = collections.namedtuple("_Issued", "work late p2p")


class ProcessGroup(_Collectives, _Agreement, dist.ProcessGroup):
    """The backend's c10d process group (Note [Collectives on gloo])."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self.name = _backend.name
        self._rank, self._size = rank, size
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("accelkit-gloo/", store), rank, size,
                                          timeout)
        # The ranks' agreement (_agree) on a gloo group of its own: it runs on
        # the calling thread, the collectives on the group's (Note [The start
        # on the group's thread]), and one gloo group's calls must come in the
        # same order on every rank.
        self._check_gloo = dist.ProcessGroupGloo(dist.PrefixStore("accelkit-check/", store), rank,
                                                 size, timeout)
        self._visible = {}
        self.check_agreement = True  # _agree
        self._timeout_s = timeout.total_seconds()
        self._last = _Issued(work=None, late=False, p2p=False)
        # The receives still in flight, with their tensors and whether their
        # results come late (staged): Note [Collectives in issue order].
        self._p2p_writes = []
        self._starter = _Starter(join_s=2 * self._timeout_s)
        self._failures = _Failures(self.name)  # Note [A failed group]
        # Where a failed rank publishes its failure for the others.
        self._published = _Published(store, rank, size)
        self._failures.on_fail(self._published.publish)
        # The collectives' numbers (Note [The vendor collective slot]): one for
        # every collective issued, the same on every rank.
        self._seq = itertools.count(1)
        # Whether the calling thread's collective got past the ranks'
        # agreement (Note [A failed group]: _collective).
        self._tls = threading.local()
        # ACCELKIT_STREAM_WAIT=0 makes wait() block the host (Note [wait() on the stream]).
        self.stream_wait = os.environ.get("ACCELKIT_STREAM_WAIT", "1") != "0"
        # (Note [Completion on a thread of the group's own])
        self._done = _Ordered("accelkit-completion", join_s=2 * self._timeout_s)
        # The vendor's library, or None (Note [The vendor collective slot]).
        self.native = _Native.connect(self.name, store, rank, size, timeout)
        if self.native is not None:
            self._failures.on_fail(self.native.abort)
        self._group_name, self._group_desc = "", ""

    # -- identity
    def getBackendName(self) -> str:
        return self.name

    def _get_backend_name(self) -> str:
        return self.name

    # PyTorch keeps a group's name and description in its registered C++
    # backends, which this group has none of: kept here.
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    # init_process_group(device_id=...) binds the group to the device and
    # asks the backend registered for it whether it splits communicators:
    # this group is its own backend, for the device and for the CPU, and
    # does not split.
    supports_splitting = False

    def _get_backend(self, device):
        device = torch.device(device)
        if device.type in (self.name, "cpu"):
            return self
        return super()._get_backend(device)

    def shutdown(self) -> None:
        """destroy_process_group's call: the group's threads (completion,
        vendor slot) end here, after the jobs queued on them (Note
        [Completion on a thread of the group's own])."""
        native, self.native = self.native, None
        self._starter.close()  # the queued starts first: they hand work to the others
        if native is not None:
            native.close()
        self._done.close()
        self._failures.release()  # the failed signals: their streams recover
        super().shutdown()

    def host_visible(self, index: int) -> bool:
        if index not in self._visible:
            props = torch.get_device_module(self.name).get_device_properties(index)
            self._visible[index] = bool(props.host_visible_memory)
        return self._visible[index]

    # -- issue
    def _avg(self, cpu_tensors):
        """AVG's division of the summed CPU tensors, run before the copy back."""
        size = self._size  # not self: Note [No group in the callbacks]

        def run():
            for t in cpu_tensors:
                if t.is_floating_point() or t.is_complex():
                    t.div_(size)
                else:
                    t.div_(size, rounding_mode="trunc")
        return run

    @staticmethod
    def _chain(*steps):
        def run():
            for s in steps:
                s()
        return run

    def _ready_event(self, host):
        """An event recorded on the current stream of the collective's
        device, or None when the stream is idle (or the tensors are on the
        CPU)."""
        if not host.on_device:
            return None
        stream = torch.accelerator.current_stream(host.device)
        try:
            if stream.query():
                return None
            return stream.record_event()
        except RuntimeError:
            # The stream's error: a collective's failure that completed its
            # signal with an error is the cause to report.
            self._failures.check()
            raise

    def _launch(self, host, result, *, gloo=None, native=None, post=None, p2p=False, what="",
                writes=False):
        """Issues the collective whose start calls `gloo()` (which returns
        gloo's work) or runs `native` (a _Native.call) on the vendor's
        library, with `post()` run on its CPU tensors before the copy back
        (Note [The start on the group's thread]); returns its work. `what`:
        the collective's name, for gloo's errors; `writes`: a receive (into
        `result`)."""
        finish = host.finish if post is None else self._chain(post, host.finish)
        what = what or getattr(native, "collective", "")
        fut = torch.futures.Future()
        work = _Work(fut)._bind(host.device if host.on_device else None, self._failures,
                                stream_wait=self.stream_wait)
        ready = self._ready_event(host)
        # (AVG's division, post, runs on the completion thread: its results
        # come late even on memory gloo reads and writes in place.)
        late = native is not None or bool(host.back) or post is not None
        outside = native is not None or bool(host.fills)
        done = self._done
        connection = self.native if native is not None else None
        published = self._published
        failures = self._failures
        timeout_s = self._timeout_s
        name = self.name
        with self._starter.lock:
            prev, prev_late, prev_p2p = self._last
            self._last = _Issued(work, late, p2p)
            # The works this one's start waits for (Note [Collectives in
            # issue order]).
            pending = [e for e in self._p2p_writes if not e[0]._settled_event.is_set()]
            if p2p:
                waits = [prev] if prev is not None and not prev_p2p and (prev_late or outside) \
                    else []
                waits += [w for w, outs, _ in pending if _overlap(result, outs)]
                if writes:
                    pending.append((work, list(result), late))
            else:
                waits = [prev] if prev is not None and (
                    prev_late or native is not None or outside) else []
                waits += [w for w, _, w_late in pending if w_late and w is not prev]
                pending = [e for e in pending if not e[2]]
            self._p2p_writes = pending

            def start():
                # A collective issued before an earlier one failed here
                # must not reach gloo: its number there would pair it with
                # the peers' earlier collective (Note [A failed group]).
                failures.check()
                if ready is not None:
                    _wait_ready(ready, timeout_s, name, what)
                for w in waits:
                    try:
                        w._wait_host()
                    except Exception:  # noqa: BLE001  (raised by its own wait())
                        pass
                failures.check()  # an earlier collective failed meanwhile
                host.stage()
                if connection is not None:
                    connection.run(native, finish, fut, result)
                    return
                job = _gloo_job(gloo, finish, name, what, published)
                if p2p:
                    # On a thread of its own: a receive waits for its peer,
                    # whose send may come only after collectives of this rank
                    # that must complete first (one thread for both would
                    # deadlock).
                    thread = _Ordered("accelkit-p2p", join_s=2 * timeout_s)
                    thread.put(job, fut, result)
                    thread.end()
                else:
                    done.put(job, fut, result)
            inline = (ready is None and not host.fills
                      and all(w._settled_event.is_set() for w in waits))
            self._starter.start(start, fut, inline=inline)
        return work

    def _native_for(self, collective, op, dtype):
        """The vendor's library when it runs this collective (Note [The
        vendor collective slot]), else None."""
        native = self.native
        if native is not None and native.supports(collective, op, dtype):
            return native
        return None

    @staticmethod
    def _timeout(opts):
        return opts.timeout.total_seconds() if getattr(opts, "timeout", None) is not None else -1



def _create(store, rank, size, timeout):
    return ProcessGroup(store, rank, size, timeout)


def register(name: str) -> None:
    """Registers the process group as torch.distributed's backend `name`
    for the device type `name` (accelkit.install calls it)."""
    if not dist.is_available() or name.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(name, _create, devices=[name])
