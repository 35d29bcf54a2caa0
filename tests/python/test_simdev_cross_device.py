"""A stream waits for an event of another device, as on
CUDA (Note [Cross-device waits]).

Device 0's work is held back by simdev's gate. It copies a device-0 tensor
into a pinned host buffer; device 1's work, queued after the wait, copies
that buffer into a device-1 tensor. Device 1 sees device 0's result only if
it waited: a wait released early leaves the buffer's old values there."""
import time

import pytest
import torch

from backend import DEV, MOD, simdev_only, two_devices

N = 1 << 16


def _wait_stream(s1, s0):
    s1.wait_stream(s0)


def _wait_event(s1, s0):
    s1.wait_event(s0.record_event())


def _event_wait(s1, s0):
    e = torch.Event()
    e.record(s0)
    e.wait(s1)


@pytest.mark.parametrize("wait", [_wait_stream, _wait_event, _event_wait],
                         ids=["Stream.wait_stream", "Stream.wait_event", "Event.wait"])
@simdev_only
@two_devices
@simdev_only
def test_a_stream_of_device_1_waits_for_device_0s_queued_work(wait):
    s0 = torch.Stream(device=f"{DEV}:0")
    s1 = torch.Stream(device=f"{DEV}:1")
    x0 = torch.arange(N, dtype=torch.float32, device=f"{DEV}:0")
    staging = torch.full((N,), -1.0).pin_memory()
    y1 = torch.zeros(N, device=f"{DEV}:1")
    torch.accelerator.synchronize(0)
    torch.accelerator.synchronize(1)
    gate = torch.ops.simdev_driver.hold(s0)
    try:
        with MOD.stream(s0):
            staging.copy_(x0, non_blocking=True)       # device 0, behind the gate
        wait(s1, s0)                                   # returns: simdev waits on the device
        with MOD.stream(s1):
            y1.copy_(staging, non_blocking=True)       # device 1, after the wait
        time.sleep(0.005)
        assert not s1.query()                          # held by device 0's gate
    finally:
        torch.ops.simdev_driver.release(gate)
    s1.synchronize()
    assert torch.equal(y1.cpu(), torch.arange(N, dtype=torch.float32))


@simdev_only
@two_devices
@simdev_only
def test_an_event_recorded_again_after_the_wait_does_not_release_it():
    s0 = torch.Stream(device=f"{DEV}:0")
    idle = torch.Stream(device=f"{DEV}:0")
    s1 = torch.Stream(device=f"{DEV}:1")
    x0 = torch.arange(N, dtype=torch.float32, device=f"{DEV}:0")
    staging = torch.full((N,), -1.0).pin_memory()
    y1 = torch.zeros(N, device=f"{DEV}:1")
    torch.accelerator.synchronize(0)
    gate = torch.ops.simdev_driver.hold(s0)
    try:
        with MOD.stream(s0):
            staging.copy_(x0, non_blocking=True)
        e = torch.Event()
        e.record(s0)
        s1.wait_event(e)
        e.record(idle)                                 # completes at once
        assert e.query()
        with MOD.stream(s1):
            y1.copy_(staging, non_blocking=True)
        time.sleep(0.005)
        assert not s1.query()
    finally:
        torch.ops.simdev_driver.release(gate)
    s1.synchronize()
    assert torch.equal(y1.cpu(), torch.arange(N, dtype=torch.float32))


@two_devices
def test_recording_an_event_of_device_0_on_device_1_is_still_a_clear_error():
    e = torch.Event()
    e.record(torch.Stream(device=f"{DEV}:0"))
    with pytest.raises(RuntimeError, match=DEV):
        e.record(torch.Stream(device=f"{DEV}:1"))
