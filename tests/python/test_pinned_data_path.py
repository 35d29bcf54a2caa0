"""Pinned memory in the data path: `tensor.pin_memory()`
and a DataLoader with `pin_memory=True` give page-locked memory of the
backend's pinned pool, whose `non_blocking` copies to the device are left in
flight on the current stream, in order, and land with the right values."""
import threading
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from backend import DEV, MOD, simdev_only, two_devices

N = 8      # batches
B = 4096   # floats per batch


def _dataset():
    return TensorDataset(torch.arange(N * B, dtype=torch.float32).reshape(N, B))


class _held:
    """Holds `stream` (simdev's test knob) until the block ends, or at the
    latest after 60 s (so that a copy that wrongly waits for the stream
    cannot hang the test: it then finds the stream idle and fails)."""

    def __init__(self, stream):
        self.stream = stream
        self.lock = threading.Lock()
        self.open = False

    def release(self):
        with self.lock:
            if not self.open:
                self.open = True
                torch.ops.simdev_driver.release(self.gate)

    def __enter__(self):
        self.gate = torch.ops.simdev_driver.hold(self.stream)
        self.timer = threading.Timer(60, self.release)
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()
        self.release()


@simdev_only
def test_pin_memory_takes_a_block_of_the_backends_pinned_pool():
    MOD.synchronize()
    x = torch.randn(1000)
    p = x.pin_memory()
    assert not x.is_pinned() and p.is_pinned()
    assert p.device.type == "cpu" and torch.equal(p, x)
    # The pinned pool's memory (the driver's host_malloc), not pageable memory.
    assert torch.ops.simdev_driver.pinned_blocks() >= 1
    assert p.pin_memory().data_ptr() == p.data_ptr()  # already pinned: itself


def test_pin_memory_with_the_device_named():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # PyTorch's, for `device`
        p = torch.ones(10).pin_memory(DEV)
        assert p.is_pinned(DEV)
    assert p.is_pinned() and torch.equal(p, torch.ones(10))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pinning_dataloader_feeds_non_blocking_copies(workers):
    loader = DataLoader(_dataset(), batch_size=1, pin_memory=True, num_workers=workers)
    total = torch.zeros(B, device=DEV)
    for i, (batch,) in enumerate(loader):
        assert batch.is_pinned()
        x = batch.to(DEV, non_blocking=True)
        total += x[0]
    expected = torch.arange(N * B, dtype=torch.float32).reshape(N, B).sum(0)
    assert torch.equal(total.cpu(), expected)


def test_pin_memory_device_names_the_backend():
    # PyTorch 2.13 deprecates pin_memory_device (it warns and pins for the
    # current accelerator, simdev here): the batches are pinned all the same.
    loader = DataLoader(_dataset(), batch_size=2, pin_memory=True, pin_memory_device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        batches = [b for (b,) in loader]
    assert len(batches) == N // 2 and all(b.is_pinned() for b in batches)
    assert torch.equal(torch.cat(batches), _dataset().tensors[0])


@simdev_only
def test_copies_of_pinned_batches_are_in_flight_on_the_held_stream_and_land_in_order():
    stream = torch.accelerator.current_stream(0)
    loader = DataLoader(_dataset(), batch_size=1, pin_memory=True)
    out = torch.empty(N, B, device=DEV)
    back = torch.zeros(N, B).pin_memory()
    MOD.synchronize()
    with _held(stream) as held:
        for i, (batch,) in enumerate(loader):
            out[i].copy_(batch[0], non_blocking=True)   # host -> device, queued
        back.copy_(out, non_blocking=True)              # device -> host, after them
        del batch
        # Nothing has run: every copy is queued behind the held point.
        assert not stream.query()
        assert torch.count_nonzero(back) == 0
        assert not held.open
    MOD.synchronize()
    assert torch.equal(back, _dataset().tensors[0])


@two_devices
def test_memory_pinned_while_device_1_is_current_serves_non_blocking_copies_of_both_devices():
    # pin_memory() allocates in the current device's context and the block
    # goes back through it (Note [Pinned memory per device]); copies of every
    # device use it as pinned memory, left in flight (simdev frees through
    # the wrong device, or a claim on memory not from host_malloc, loudly).
    MOD.set_device(1)
    try:
        p = torch.arange(float(B)).pin_memory()
    finally:
        MOD.set_device(0)
    assert p.is_pinned()
    d0 = torch.empty(B, device=f"{DEV}:0")
    d1 = torch.empty(B, device=f"{DEV}:1")
    MOD.synchronize(0)
    MOD.synchronize(1)
    s0, s1 = MOD.current_stream(0), MOD.current_stream(1)
    with _held(s0) as h0, _held(s1) as h1:
        d0.copy_(p, non_blocking=True)
        d1.copy_(p, non_blocking=True)
        assert not s0.query() and not s1.query()  # both queued behind the held points
        assert not h0.open and not h1.open
    MOD.synchronize(0)
    MOD.synchronize(1)
    assert torch.equal(d0.cpu(), torch.arange(float(B)))
    assert torch.equal(d1.cpu(), torch.arange(float(B)))
    del p  # back to device 1's pool, freed through device 1 at empty_cache
    MOD.empty_cache()
