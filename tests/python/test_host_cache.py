"""The pinned host pool as PyTorch's host allocator for the device type (Note [Host
allocator]): torch.accelerator.empty_host_cache() returns the cached pinned blocks to the
driver with device tensors alive, keeps the blocks in use and those a queued copy still
reads, and the host statistics are those PyTorch's registered allocator gives."""
import os
import subprocess
import sys
import threading

import pytest
import torch

from backend import DEV, MOD, OPS, renamed, simdev_only

if not hasattr(torch.accelerator, "empty_host_cache"):
    pytest.skip(f"PyTorch {torch.__version__} has no torch.accelerator.empty_host_cache",
                allow_module_level=True)


def _python(code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with torch_<backend> imported."""
    return subprocess.run([sys.executable, "-c", renamed("import torch, torch_simdev\n" + code)],
                          env=dict(os.environ), capture_output=True, text=True, timeout=120)


def _cached_blocks():
    s = MOD.host_memory_stats()
    return s["allocations.current"] - s["active_requests.current"]


def test_empty_host_cache_with_a_device_tensor_alive_returns_and_the_process_goes_on():
    out = _python(
        "x = torch.ones(4, device='simdev')\n"
        "p = torch.ones(1000).pin_memory()\n"
        "del p\n"
        "torch.accelerator.empty_host_cache()\n"
        "print('alive', x.sum().item(), torch.simdev.host_memory_stats()['allocations.current'])\n")
    assert out.returncode == 0, f"rc {out.returncode}: {out.stderr}"
    assert out.stdout.split() == ["alive", "4.0", "0"]


def test_empty_host_cache_before_initialization_does_nothing_and_initializes_nothing():
    out = _python(
        "torch.accelerator.empty_host_cache()\n"
        "print(torch.simdev.is_initialized(), len(torch.simdev.host_memory_stats()))\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "0"]


def test_graph_enter_path_synchronize_empty_cache_empty_host_cache_runs_with_tensors_alive():
    # torch.accelerator.Graph.__enter__ calls these three before capture_begin.
    x = torch.arange(8.0, device=DEV)
    torch.accelerator.synchronize()
    torch.accelerator.empty_cache()
    torch.accelerator.empty_host_cache()
    assert x.cpu().tolist() == list(range(8))


def test_empty_host_cache_returns_free_blocks_and_keeps_live_ones():
    torch.accelerator.synchronize()
    torch.accelerator.empty_host_cache()
    kept = torch.empty(3000, dtype=torch.uint8).pin_memory()
    freed = torch.empty(70000, dtype=torch.uint8).pin_memory()
    before = MOD.host_memory_stats()
    del freed
    assert _cached_blocks() == 1
    torch.accelerator.empty_host_cache()
    after = MOD.host_memory_stats()
    assert _cached_blocks() == 0
    assert after["allocations.current"] == before["allocations.current"] - 1
    assert after["allocated_bytes.current"] == before["allocated_bytes.current"] - (1 << 17)
    assert after["num_host_free"] == before["num_host_free"] + 1
    assert after["active_requests.current"] == before["active_requests.current"] - 1
    kept.fill_(7)  # still pinned memory of the pool, writable
    assert kept.is_pinned() and int(kept.sum()) == 7 * 3000


def test_host_stats_through_pytorchs_registry_count_pin_memory_and_resets():
    torch.accelerator.synchronize()
    torch.accelerator.empty_host_cache()
    MOD.reset_accumulated_host_memory_stats()
    MOD.reset_peak_host_memory_stats()
    base = MOD.host_memory_stats()
    pinned = [torch.empty(1000, dtype=torch.float32).pin_memory() for _ in range(2)]
    during = MOD.host_memory_stats()
    assert during["active_requests.current"] == base["active_requests.current"] + 2
    assert during["active_requests.allocated"] == 2
    assert during["active_bytes.current"] == base["active_bytes.current"] + 2 * 4096
    assert during["num_host_alloc"] == 2  # the cache was empty: two driver allocations
    del pinned
    after = MOD.host_memory_stats()
    assert after["active_requests.freed"] == 2
    assert after["active_requests.peak"] == base["active_requests.current"] + 2
    assert after["allocations.current"] == base["allocations.current"] + 2  # cached, not freed
    MOD.reset_peak_host_memory_stats()
    assert MOD.host_memory_stats()["active_requests.peak"] == after["active_requests.current"]
    MOD.reset_accumulated_host_memory_stats()
    reset = MOD.host_memory_stats()
    assert reset["active_requests.freed"] == 0 and reset["num_host_alloc"] == 0
    torch.accelerator.empty_host_cache()
    assert MOD.host_memory_stats()["num_host_free"] == 2


@simdev_only
def test_empty_host_cache_waits_for_a_queued_copy_from_a_freed_pinned_block():
    torch.accelerator.synchronize()
    torch.accelerator.empty_host_cache()
    stream = torch.Stream(device=DEV)
    dst = torch.zeros(4096, device=DEV)
    src = torch.arange(4096.0).pin_memory()
    gate = torch.ops.simdev_driver.hold(stream)
    released = threading.Event()
    timer = threading.Timer(0.3, lambda: (released.set(), torch.ops.simdev_driver.release(gate)))
    timer.start()
    try:
        with stream:
            dst.copy_(src, non_blocking=True)
        del src  # the block is pending on the held stream, not reusable
        torch.accelerator.empty_host_cache()  # waits for the copy, then frees the block
        assert released.is_set()
    finally:
        timer.cancel()
        if not released.is_set():
            torch.ops.simdev_driver.release(gate)
    stream.synchronize()
    assert _cached_blocks() == 0
    assert dst[4095].item() == 4095.0


def test_host_empty_cache_op_is_the_registered_allocators():
    p = torch.empty(5000, dtype=torch.uint8).pin_memory()
    del p
    assert _cached_blocks() >= 1
    OPS.host_empty_cache()
    assert _cached_blocks() == 0
