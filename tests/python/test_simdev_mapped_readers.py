"""Readers on different paths never refuse each other in the mapped mode
(SIMDEV_HOST_VISIBLE=mapped): one thread reads a tensor through host
kernels (a host map of its memory), another through device-to-device copies
queued on a stream of its own. The SDK waits for the device's streams, then
maps; a copy the other thread queues in between is one the map coexists
with (the contract's host_map), never a refusal nor a wait."""
import os
import threading

import pytest
import torch

from backend import DEV as NAME, MOD

pytestmark = pytest.mark.skipif(
    NAME != "simdev" or os.environ.get("SIMDEV_HOST_VISIBLE") != "mapped",
    reason="simdev's mapped mode")


def test_host_kernel_and_stream_copy_read_one_tensor_at_once():
    dev = torch.device(NAME, 0)
    x = torch.arange(1 << 18, dtype=torch.float32, device=dev)
    want_sum = float(torch.arange(1 << 18, dtype=torch.float32).sum())
    want = torch.arange(1 << 18, dtype=torch.float32)
    errors, reads = [], [0, 0]
    maps_before = torch.ops.simdev_driver.host_maps()

    def host_reader():
        try:
            for _ in range(500):
                assert float(x.sum()) == want_sum  # a host kernel over mapped memory
                reads[0] += 1
        except Exception as e:  # noqa: BLE001  reported below
            errors.append(f"host kernel: {type(e).__name__}: {e}")

    def stream_reader():
        try:
            with MOD.stream(MOD.Stream(dev)):
                for i in range(500):
                    y = x.clone()  # a device copy queued on its stream
                    if i % 50 == 49:
                        assert torch.equal(y.cpu(), want)
                    reads[1] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(f"stream copy: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=host_reader), threading.Thread(target=stream_reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert reads == [500, 500]
    assert torch.ops.simdev_driver.host_maps() > maps_before  # the host path mapped
