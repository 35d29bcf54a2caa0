"""torch.<name>.memory: the caching allocator's statistics and controls, as
torch.cuda.memory (the figures come from the SDK's allocator, through
torch.accelerator and the backend's operators)."""
import collections
import contextlib
import ctypes
import functools
import inspect
import json
import os
import pickle
import sys
import warnings

import torch

from .. import _backend

__all__ = ["memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
           "memory_cached", "max_memory_cached", "memory_stats", "memory_stats_as_nested_dict",
           "memory_summary", "memory_snapshot", "reset_peak_memory_stats",
           "reset_accumulated_memory_stats", "reset_max_memory_allocated",
           "reset_max_memory_cached", "empty_cache", "set_per_process_memory_fraction",
           "get_per_process_memory_fraction", "mem_get_info", "device_memory_used",
           "list_gpu_processes", "host_memory_stats", "host_memory_stats_as_nested_dict",
           "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats", "MemPool",
           "use_mem_pool"]
# As torch.cuda.memory's, the history and snapshot functions (_record_memory_history,
# _snapshot, _dump_snapshot, _set_allocator_settings) and _attach_out_of_memory_observer
# are private names of this module: torch.<name>.memory._snapshot(), not torch.<name>._snapshot().


def _index(device) -> int:
    return _backend.index(device, optional=True)


def memory_allocated(device=None) -> int:
    """Bytes of device memory that tensors occupy now."""
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    """The peak of memory_allocated since the start or reset_peak_memory_stats."""
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    """Bytes of device memory the caching allocator holds (in use or cached)."""
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    """The peak of memory_reserved since the start or reset_peak_memory_stats."""
    return torch.accelerator.max_memory_reserved(_index(device))


def memory_cached(device=None) -> int:
    """Deprecated, as torch.cuda.memory_cached: memory_reserved."""
    warnings.warn(f"torch.{_backend.name}.memory_cached is deprecated: use memory_reserved",
                  FutureWarning, stacklevel=2)
    return memory_reserved(device)


def max_memory_cached(device=None) -> int:
    """Deprecated, as torch.cuda.max_memory_cached: max_memory_reserved."""
    warnings.warn(f"torch.{_backend.name}.max_memory_cached is deprecated: use max_memory_reserved",
                  FutureWarning, stacklevel=2)
    return max_memory_reserved(device)


def memory_stats(device=None) -> dict:
    """The allocator's statistics, keyed as torch.cuda.memory_stats
    ("allocated_bytes.all.current", "num_ooms", ...), with the reserved bytes
    of each private pool that holds memory (a graph's or a MemPool's) as
    "reserved_bytes_by_private_pools.<a>_<b>.<all|large_pool|small_pool>.<...>"."""
    index = _index(device)
    stats = json.loads(_backend.ops.memory_stats_json(index))
    flat = _backend.ops.mempool_ids(index)
    for a, b in sorted(zip(flat[0::2], flat[1::2])):
        pool = json.loads(_backend.ops.pool_stats_json(index, [a, b]))
        if not pool.get("reserved_bytes.all.current"):
            continue  # holds no memory
        for key, value in pool.items():
            if key.startswith("reserved_bytes."):
                stats[f"reserved_bytes_by_private_pools.{a}_{b}.{key[len('reserved_bytes.'):]}"] = value
    return stats


def memory_stats_as_nested_dict(device=None) -> dict:
    """memory_stats, nested at each dot of its keys (a private pool's key
    as its id, a pair of ints, as torch.cuda's)."""
    nested = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        if path[:1] == ["reserved_bytes_by_private_pools"] and len(path) > 1:
            path[1] = tuple(int(i) for i in path[1].split("_"))
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def reset_peak_memory_stats(device=None) -> None:
    """Resets the peaks of memory_stats to the current values."""
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device=None) -> None:
    """Resets the counters of memory_stats that only grow (allocated, freed,
    retries, out-of-memory errors)."""
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    """Deprecated, as on CUDA: resets every peak (reset_peak_memory_stats)."""
    warnings.warn(f"torch.{_backend.name}.reset_max_memory_allocated now calls "
                  "reset_peak_memory_stats, which resets all peak statistics",
                  FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device=None) -> None:
    """Deprecated, as on CUDA: resets every peak (reset_peak_memory_stats)."""
    warnings.warn(f"torch.{_backend.name}.reset_max_memory_cached now calls "
                  "reset_peak_memory_stats, which resets all peak statistics",
                  FutureWarning, stacklevel=2)
    reset_peak_memory_stats(device)


def empty_cache() -> None:
    """Returns the cached, unused device memory of every device to the driver."""
    torch.accelerator.empty_cache()


def set_per_process_memory_fraction(fraction, device=None) -> None:
    """Caps the memory the allocator reserves on a device at `fraction` of
    its total (ValueError outside (0, 1])."""
    _backend.ops.set_memory_fraction(float(fraction), _index(device))


def get_per_process_memory_fraction(device=None) -> float:
    """The cap set by set_per_process_memory_fraction (or the allocator
    configuration's per_process_memory_fraction; 1.0 by default)."""
    return _backend.ops.memory_fraction(_index(device))


def host_memory_stats_as_nested_dict() -> dict:
    """The pinned host pool's statistics, as torch.cuda's: "allocations" and
    "allocated_bytes" count the blocks held from the driver (in use or
    cached), "active_requests" and "active_bytes" those in use, each with
    current, peak, allocated and freed; num_host_alloc and num_host_free
    count driver calls. (CUDA's pool also times those calls; this one does
    not.) Empty before the backend is initialized."""
    flat = json.loads(_backend.ops.host_memory_stats_json())
    nested: dict = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = nested
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return nested


def host_memory_stats() -> "collections.OrderedDict":
    """host_memory_stats_as_nested_dict() flattened to "stat.metric" keys,
    sorted, as torch.cuda.host_memory_stats()."""
    return collections.OrderedDict(sorted(json.loads(_backend.ops.host_memory_stats_json()).items()))


def reset_accumulated_host_memory_stats() -> None:
    """Resets the pinned pool's "allocated" and "freed" totals."""
    _backend.ops.host_reset_accumulated_stats()


def reset_peak_host_memory_stats() -> None:
    """Resets the pinned pool's peaks to their current values."""
    _backend.ops.host_reset_peak_stats()


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of a device, as the driver reports them."""
    return torch.accelerator.get_memory_info(_index(device))


def device_memory_used(device=None) -> int:
    """Bytes of a device's memory in use by any process, as the driver
    reports them (total minus free)."""
    free, total = mem_get_info(device)
    return total - free


def memory_snapshot(mempool_id=None, include_traces=True) -> list:
    """The allocator's segments on every device, each with its blocks, in
    torch.cuda.memory_snapshot's form (a list of dicts with "device",
    "address", "total_size", "segment_type", "segment_pool_id", "blocks",
    ...; a block's "frames" are where it was allocated while
    _record_memory_history records them); with `mempool_id` (a graph's
    pool(), a MemPool's id, a graph_pool_handle()), that pool's segments
    only. `include_traces` is accepted as torch.cuda's: the history is in
    _snapshot()'s "device_traces"."""
    wanted = None
    if mempool_id is not None:
        try:
            wanted = tuple(int(i) for i in mempool_id)
        except (TypeError, ValueError):
            wanted = ()
        if len(wanted) != 2:
            raise ValueError(f"{_backend.name}: memory_snapshot: mempool_id is a pair of ints, "
                             f"got mempool_id={mempool_id!r}")
    segments = []
    for i in range(_backend.ops.device_count()):
        segments += [_segment(s) for s in json.loads(_backend.ops.memory_snapshot_json(i))["segments"]]
    if wanted is not None:
        segments = [s for s in segments if s["segment_pool_id"] == wanted]
    return segments


# ------------------------------------------------------- history and snapshots
# torch.cuda.memory's _record_memory_history, _snapshot and _dump_snapshot over
# the backend's operators record_memory_history and memory_snapshot_json (the
# SDK's JSON, turned here into the dicts and tuples CUDA's snapshot holds, so
# that torch/cuda/_memory_viz.py and pytorch.org/memory_viz read it unchanged).

_ENABLED = (None, "state", "all")
_CONTEXTS = (None, "state", "alloc", "all")
_STACKS = ("python", "all")
_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
            "segment_map", "segment_unmap", "oom", "snapshot")


def _choice(function: str, argument: str, value, choices) -> None:
    if (value is not None and not isinstance(value, str)) or value not in choices:
        shown = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{_backend.name}: {function}: {argument} must be one of {shown}, "
                         f"got {argument}={value!r}")


def _entries(function: str, argument: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{_backend.name}: {function}: {argument} must be an int >= 0, "
                         f"got {argument}={value!r}")
    return min(value, sys.maxsize)


def _skips(function: str, skip_actions) -> list:
    if skip_actions is None:
        return []
    if isinstance(skip_actions, str) or not isinstance(skip_actions, (list, tuple, set, frozenset)):
        raise ValueError(f"{_backend.name}: {function}: skip_actions must be a list of action "
                         f"names, got skip_actions={skip_actions!r}")
    for action in skip_actions:
        if not isinstance(action, str) or action not in _ACTIONS:
            raise ValueError(f"{_backend.name}: {function}: skip_actions names an unknown action "
                             f"{action!r} (the actions: {', '.join(_ACTIONS)})")
    return list(skip_actions)


def _cuda_only(function: str, **options) -> None:
    for option, value in options.items():
        if value:
            raise ValueError(f"{_backend.name}: {function}: {option}={value!r} is not supported "
                             "(CUDA's allocator records torch.compile's context and "
                             f"record_function annotations with its history; {_backend.name}'s "
                             "does not)")


def _record_memory_history_legacy(enabled: bool, record_context=True, trace_alloc_max_entries=1,
                                  trace_alloc_record_context=False, device=None,
                                  record_context_cpp=False, clear_history=False,
                                  compile_context=False, global_record_annotations=False,
                                  skip_actions=None) -> None:
    function = "_record_memory_history"
    entries = _entries(function, "trace_alloc_max_entries", trace_alloc_max_entries)
    skips = _skips(function, skip_actions)
    _cuda_only(function, compile_context=compile_context,
               global_record_annotations=global_record_annotations)
    if device is not None:
        _index(device)
    context = "alloc" if trace_alloc_record_context else ("state" if record_context else None)
    _backend.ops.record_memory_history(-1, "all" if enabled else None, context,
                                       "all" if record_context_cpp else "python", entries,
                                       bool(clear_history), skips)


def _record_memory_history_impl(enabled="all", context="all", stacks="all",
                                max_entries=sys.maxsize, device=None, clear_history=False,
                                compile_context=False, global_record_annotations=False,
                                skip_actions=None) -> None:
    function = "_record_memory_history"
    _choice(function, "enabled", enabled, _ENABLED)
    _choice(function, "context", context, _CONTEXTS)
    _choice(function, "stacks", stacks, _STACKS)
    entries = _entries(function, "max_entries", max_entries)
    skips = _skips(function, skip_actions)
    _cuda_only(function, compile_context=compile_context,
               global_record_annotations=global_record_annotations)
    if device is not None:
        _index(device)
    _backend.ops.record_memory_history(-1, enabled, context, stacks, entries,
                                       bool(clear_history), skips)


def _record_memory_history(enabled="all", *args, **kwargs) -> None:
    """Starts (or stops, with enabled=None) recording the allocator's
    history on every device, as torch.cuda.memory._record_memory_history:

    - enabled: None (off), "state" (where each block now allocated was
      allocated) or "all" (also a history of alloc, free_requested,
      free_completed, segment_alloc, segment_free, segment_map,
      segment_unmap, oom and snapshot events; the last `max_entries`);
    - context: None, "state" (frames of the allocated blocks), "alloc"
      (also of alloc events) or "all" (also of frees);
    - stacks: "python" (Python and TorchScript frames) or "all" (also C++);
    - clear_history drops what was recorded; skip_actions names actions
      not to record.

    `device` is checked but, as on CUDA, every device records. The legacy
    form (enabled a bool: record_context, trace_alloc_max_entries,
    trace_alloc_record_context, record_context_cpp, ...) is CUDA's too.
    ValueError names a bad argument; compile_context and
    global_record_annotations (torch.compile's and the profiler's
    annotations, CUDA's) are refused when true."""
    if isinstance(enabled, bool):
        return _record_memory_history_legacy(enabled, *args, **kwargs)
    return _record_memory_history_impl(enabled, *args, **kwargs)


_record_memory_history.__signature__ = inspect.signature(_record_memory_history_impl)


def _frames(raw) -> list:
    return [{"filename": f["filename"], "line": f["line"], "name": f["name"]} for f in raw]


def _segment(raw: dict) -> dict:
    # CUDA's keys: "is_expandable" (the SDK's JSON says "expandable"), the
    # pool id a tuple, "frames" on the segment and on each block.
    return {
        "device": raw["device"], "address": raw["address"], "total_size": raw["total_size"],
        "allocated_size": raw["allocated_size"], "active_size": raw["active_size"],
        "requested_size": raw["requested_size"], "stream": raw["stream"],
        "segment_type": raw["segment_type"],
        "segment_pool_id": tuple(raw.get("segment_pool_id", (0, 0))),
        "is_expandable": bool(raw.get("expandable", False)),
        "frames": _frames(raw.get("frames", [])),
        "blocks": [{"address": b["address"], "size": b["size"],
                    "requested_size": b["requested_size"], "state": b["state"],
                    "frames": _frames(b.get("frames", []))} for b in raw["blocks"]],
    }


def _trace_entry(raw: dict) -> dict:
    # As CUDA's: an oom entry has "device_free" where the others have "addr".
    entry = {"action": raw["action"]}
    if raw["action"] == "oom":
        entry["device_free"] = raw.get("device_free", 0)
    else:
        entry["addr"] = raw["addr"]
    entry.update(size=raw["size"], stream=raw["stream"], time_us=raw.get("time_us", 0),
                 pool_id=tuple(raw.get("pool_id", (0, 0))), frames=_frames(raw.get("frames", [])))
    return entry


def _allocator_settings() -> dict:
    # CUDA's snapshot keeps the settings string last applied under the name
    # of its variable; here c10's, which PYTORCH_ALLOC_CONF and
    # torch._C._accelerator_setAllocatorSettings set, and the backend's own
    # variable as the environment has it.
    env = f"{_backend.name.upper()}_ALLOC_CONF"
    return {"PYTORCH_ALLOC_CONF": torch._C._accelerator_getAllocatorSettings(),
            env: os.environ.get(env, "")}


def _snapshot(device=None, augment_with_fx_traces=False) -> dict:
    """The allocator's state as torch.cuda.memory._snapshot() gives it:
    {"segments": every device's segments (memory_snapshot()),
    "device_traces": [device 0's recorded history, device 1's, ...] (each
    a list of {"action", "addr" (or "device_free" for "oom"), "size",
    "stream", "time_us", "pool_id", "frames"}, oldest first),
    "allocator_settings": {...}}. Frames (innermost first) are recorded
    while _record_memory_history is on. `device` is checked but, as on
    CUDA, every device is in the snapshot. torch/cuda/_memory_viz.py
    renders it (segsum, trace, segments, memory, compare, trace_plot,
    segment_plot); augment_with_fx_traces adds FX nodes to the frames of
    generated code, as on CUDA."""
    if device is not None:
        _index(device)
    segments, traces = [], []
    for i in range(_backend.ops.device_count()):
        raw = json.loads(_backend.ops.memory_snapshot_json(i))
        segments += [_segment(s) for s in raw["segments"]]
        traces.append([_trace_entry(e) for e in raw.get("trace", [])])
    snapshot = {"segments": segments, "device_traces": traces,
                "allocator_settings": _allocator_settings()}
    if augment_with_fx_traces:
        from torch._utils import _augment_memory_snapshot_stack_traces
        snapshot = _augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def _dump_snapshot(filename="dump_snapshot.pickle", augment_with_fx_traces=False) -> None:
    """Pickles _snapshot() into `filename`, which pytorch.org/memory_viz and
    `python -m torch.cuda._memory_viz` open, as torch.cuda.memory's."""
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


def _set_allocator_settings(env: str) -> None:
    """Deprecated, as torch.cuda.memory's: applies the allocator settings
    `env` ("max_split_size_mb:64,...") over the current ones of every
    device, as torch._C._accelerator_setAllocatorSettings(env) does."""
    warnings.warn(f"torch.{_backend.name}.memory._set_allocator_settings is deprecated: use "
                  "torch._C._accelerator_setAllocatorSettings", FutureWarning, stacklevel=2)
    if not isinstance(env, str):
        raise TypeError(f"{_backend.name}: _set_allocator_settings takes a string such as "
                        f"'max_split_size_mb:64', got {env!r}")
    torch._C._accelerator_setAllocatorSettings(env)


# Note [Out-of-memory observers]: an observer is a Python callable the
# allocator calls as CUDA's (torch._C._cuda_attach_out_of_memory_observer):
# observer(device, alloc, device_allocated, device_free) when a request
# fails, before the OutOfMemoryError is raised. The backend's operator takes
# the address of a C function, so each observer is wrapped in a ctypes
# CFUNCTYPE that ctypes enters with the GIL, from whichever thread
# allocates; the allocator holds none of its locks then. The wrappers live
# in _OOM_OBSERVERS for the rest of the process: an observer cannot be
# detached (nor on CUDA). Limits: an exception the observer raises cannot
# cross the C call; ctypes reports it through sys.unraisablehook and the
# OutOfMemoryError is raised as usual.
_OOM_OBSERVER = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int64)
_OOM_OBSERVERS: list = []


def _attach_out_of_memory_observer(observer) -> None:
    """Calls observer(device, alloc, device_allocated, device_free) (ints:
    the device index, the bytes requested, the bytes this process has
    allocated on the device, the device's free bytes) each time an
    allocation on any device of the backend runs out of memory, before the
    OutOfMemoryError is raised (Note [Out-of-memory observers])."""
    if not callable(observer):
        raise TypeError(f"{_backend.name}: _attach_out_of_memory_observer takes a callable, "
                        f"got {observer!r}")
    wrapper = _OOM_OBSERVER(lambda device, alloc, allocated, free:
                            observer(int(device), int(alloc), int(allocated), int(free)))
    _OOM_OBSERVERS.append(wrapper)
    _backend.ops.attach_oom_observer(ctypes.cast(wrapper, ctypes.c_void_p).value)


# Note [torch.accelerator.memory._snapshot]: PyTorch's
# torch.accelerator.memory._snapshot() sends the current accelerator to
# torch.xpu.memory._snapshot when it is XPU and to torch.cuda's otherwise,
# which fails for a PrivateUse1 device (torch._C has no _cuda_memorySnapshot
# in a build without CUDA, and would describe CUDA's allocator in one with
# it). accelkit.install replaces that function in torch.accelerator.memory
# with one that calls this module's _snapshot when the current accelerator
# is this backend's device type and PyTorch's own function otherwise.
# Limits: code that imported the function by name (`from
# torch.accelerator.memory import _snapshot`) before install keeps
# PyTorch's; one backend per process, as PrivateUse1.
def _install_accelerator_snapshot() -> None:
    import torch.accelerator.memory as accelerator_memory
    original = accelerator_memory._snapshot
    if getattr(original, "_accelkit_backend", None) is not None:
        return

    @functools.wraps(original)
    def _accelerator_snapshot(device=None, augment_with_fx_traces: bool = False):
        current = torch.accelerator.current_accelerator()
        if current is not None and current.type == _backend.name:
            return _snapshot(device, augment_with_fx_traces=augment_with_fx_traces)
        return original(device, augment_with_fx_traces=augment_with_fx_traces)

    _accelerator_snapshot._accelkit_backend = _backend.name
    accelerator_memory._snapshot = _accelerator_snapshot


class MemPool:
    """A pool of the caching allocator on the current device, of the user's
    own: what is allocated under use_mem_pool(pool) comes from its
    segments, and its freed blocks serve only it (torch.cuda.MemPool). The
    pool lives while this object, a use_mem_pool block or a graph that
    captured into it uses it; then its free segments go back to the driver,
    and the rest as their tensors are freed. Custom allocators, use_on_oom
    and no_split are CUDA allocator options the SDK's pools do not have."""

    def __init__(self, allocator=None, use_on_oom: bool = False, no_split: bool = False):
        if allocator is not None:
            raise NotImplementedError(f"{_backend.name}: MemPool(allocator=...) takes a CUDA "
                                      "pluggable allocator; a pool here is the backend's "
                                      "caching allocator's")
        if use_on_oom or no_split:
            raise NotImplementedError(f"{_backend.name}: MemPool(use_on_oom=..., no_split=...) "
                                      "are not supported by the SDK's allocator")
        self._device = torch.accelerator.current_device_index()
        self._id = tuple(_backend.ops.new_mempool_id(True))
        _backend.ops.mempool_create(self._device, list(self._id))

    @property
    def id(self) -> tuple:
        """The pool's id, a pair of ints: pass it to use_mem_pool (through
        this object), memory_snapshot or a graph capture (pool=)."""
        return self._id

    @property
    def allocator(self):
        """None: the pool is the caching allocator's."""
        return None

    def use_count(self) -> int:
        """How many hold the pool: this object, each use_mem_pool block and
        each graph capturing or captured into it."""
        return _backend.ops.mempool_use_count(self._device, list(self._id))

    def snapshot(self, include_traces=True) -> list:
        """memory_snapshot(mempool_id=self.id)."""
        return memory_snapshot(self._id, include_traces=include_traces)

    def __del__(self):
        device, pool = getattr(self, "_device", None), getattr(self, "_id", None)
        if pool is None or _backend.ops is None:
            return
        try:
            _backend.ops.mempool_release(device, list(pool))
        except Exception:  # noqa: BLE001 (never raise from a finalizer, at exit included)
            pass


@contextlib.contextmanager
def use_mem_pool(pool, device=None):
    """``with use_mem_pool(pool):`` makes this thread's allocations on
    `device` (the current one by default) come from `pool` (a MemPool);
    other threads' allocations are not affected."""
    if not isinstance(pool, MemPool):
        raise TypeError(f"{_backend.name}: use_mem_pool takes a torch.{_backend.name}.MemPool, "
                        f"got {type(pool).__name__}")
    index, pool_id = _index(device), list(pool.id)
    _backend.ops.begin_allocate_current_thread_to_pool(index, pool_id)
    try:
        yield
    finally:
        _backend.ops.end_allocate_current_thread_to_pool(index, pool_id)
        _backend.ops.mempool_release(index, pool_id)


def list_gpu_processes(device=None) -> str:
    """This process and the device memory it holds. A backend sees its own
    process only (CUDA asks NVML for every process)."""
    index = _index(device)
    mib = memory_reserved(index) / (1024 * 1024)
    return f"{_backend.name}:{index}\nprocess {os.getpid():>10d} uses {mib:>12.3f} MB {_backend.name} memory"


def _size(n: int) -> str:
    for unit in ("B  ", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 10 * 1024 or unit == "TiB":
            return f"{n:6d} {unit}"
        n //= 1024
    return f"{n:6d} TiB"


def _count(n: int) -> str:
    for unit in (" ", "K", "M"):
        if abs(n) < 10 * 1000 or unit == "M":
            return f"{n:7d} {unit} "
        n //= 1000
    return f"{n:7d} M "


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of memory_stats (current, peak, allocated and freed of each
    statistic; by pool unless `abbreviated`), as torch.cuda.memory_summary
    prints it."""
    index = _index(device)
    stats = collections.defaultdict(int, memory_stats(index))
    width = 75
    rows = [
        "=" * width,
        f" PyTorch {_backend.name} memory summary, device ID {index}".ljust(width),
        "-" * width,
        f" {_backend.name} OOMs: {stats['num_ooms']} | allocation retries: "
        f"{stats['num_alloc_retries']}".ljust(width),
        "=" * width,
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ",
    ]
    metrics = [("allocated_bytes", "Allocated memory", _size),
               ("active_bytes", "Active memory", _size),
               ("requested_bytes", "Requested memory", _size),
               ("reserved_bytes", f"{_backend.name} reserved memory", _size),
               ("inactive_split_bytes", "Non-releasable memory", _size),
               ("allocation", "Allocations", _count),
               ("active", "Active allocs", _count),
               ("segment", f"{_backend.name} reserved segments", _count),
               ("inactive_split", "Non-releasable allocs", _count)]
    pools = [("all", None)] if abbreviated else [("all", None), ("large_pool", "      from large pool"),
                                                   ("small_pool", "      from small pool")]
    for key, title, fmt in metrics:
        rows.append("-" * width)
        for pool, label in pools:
            values = [stats[f"{key}.{pool}.{field}"] for field in ("current", "peak", "allocated", "freed")]
            rows.append(f" {(label or title)[:21]:<21} | " + " | ".join(fmt(v) for v in values) + " ")
    for key, title in (("oversize_allocations", "Oversize allocations"),
                       ("oversize_segments", "Oversize segments")):
        rows.append("-" * width)
        values = [stats[f"{key}.{field}"] for field in ("current", "peak", "allocated", "freed")]
        rows.append(f" {title:<21} | " + " | ".join(_count(v) for v in values) + " ")
    rows.append("=" * width)
    return "|" + "|\n|".join(rows) + "|\n"


def _ipc_state() -> dict:
    """What this process holds for sharing device memory with others (a
    test hook, Note [Sharing device memory between processes]): "sent",
    storages sent and not yet released by every receiver, nor freed here;
    "opened", segments of other processes open here; "ref_files", reference
    files open here (this process's own and those of the senders whose
    memory it holds)."""
    sent, opened, ref_files = _backend.ops.ipc_state()
    return {"sent": sent, "opened": opened, "ref_files": ref_files}
