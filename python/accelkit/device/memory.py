"""torch.<name>.memory: the caching allocator's statistics and controls, as
torch.cuda.memory (the figures come from the SDK's allocator, through
torch.accelerator and the backend's operators)."""
import collections
import contextlib
import json
import os
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
    pools = {tuple(s.get("segment_pool_id", (0, 0)))
             for s in json.loads(_backend.ops.memory_snapshot_json(index))["segments"]}
    for a, b in sorted(pools - {(0, 0)}):
        for key, value in json.loads(_backend.ops.pool_stats_json(index, [a, b])).items():
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
    ...); with `mempool_id` (a graph's pool(), a MemPool's id, a
    graph_pool_handle()), that pool's segments only."""
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
        segments += json.loads(_backend.ops.memory_snapshot_json(i))["segments"]
    if wanted is not None:
        segments = [s for s in segments if tuple(s.get("segment_pool_id", (0, 0))) == wanted]
    return segments


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
