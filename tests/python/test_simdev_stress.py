"""A bounded concurrency stress through PyTorch: Python threads on
both devices and several streams doing non-blocking pinned copies both ways,
host kernels, fallback operators, record_stream across streams and
empty_cache, every result checked against the CPU. Run in both memory modes
(host kernels and the zero-copy fallback when the host may touch device
memory; the copying paths when not)."""
import os
import random
import threading
import time

import torch

from backend import DEV, ENV, MOD, two_devices, simdev_only

SECONDS = float(os.environ.get("ACCELKIT_STRESS_SECONDS", "6"))


@two_devices
@simdev_only
def test_threads_on_both_devices_and_many_streams_compute_right_results():
    threads, deadline = 6, time.monotonic() + SECONDS
    counts = {"ops": 0, "wrong": 0, "errors": 0, "empty_cache": 0}
    lock = threading.Lock()
    errors = []

    def work(i):
        rng = random.Random(i)
        dev = f"{DEV}:{i % 2}"
        index = i % 2
        side = torch.Stream(device=dev)
        main = torch.accelerator.current_stream(index)
        n_ops = wrong = empties = 0
        try:
            while time.monotonic() < deadline:
                n = rng.choice([1, 17, 1024, 65536, 1 << 20])
                a = torch.randn(n)
                expected = torch.atan2(a * 2 + 1, a.abs() + 1)
                pinned = a.pin_memory()
                # Produced on a side stream, consumed on the main stream.
                side.wait_stream(main)
                with MOD.stream(side):
                    x = pinned.to(dev, non_blocking=True)          # host -> device, in flight
                    y = x * 2 + 1                                  # host kernels
                main.wait_stream(side)
                y.record_stream(main)
                x.record_stream(main)
                with MOD.stream(main):
                    z = torch.atan2(y, x.abs() + 1)                # fallback operator
                    out = torch.empty(n).pin_memory()
                    out.copy_(z, non_blocking=True)                # device -> host, in flight
                del x, y, z                                        # freed in stream order
                if rng.random() < 0.05:
                    MOD.empty_cache()
                    empties += 1
                main.synchronize()
                n_ops += 1
                if not torch.allclose(out, expected, rtol=1e-6, atol=1e-6):
                    wrong += 1
        except Exception as e:  # noqa: BLE001
            errors.append(f"thread {i}: {type(e).__name__}: {e}")
        with lock:
            counts["ops"] += n_ops
            counts["wrong"] += wrong
            counts["empty_cache"] += empties

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    MOD.synchronize(0)
    MOD.synchronize(1)
    mode = "host-visible" if os.environ.get(f"{ENV}HOST_VISIBLE", "1") == "1" else "hidden"
    print(f"\nstress ({mode} memory, {threads} threads, {SECONDS:.0f} s): {counts['ops']} iterations "
          f"of 6 device operations, {counts['empty_cache']} empty_cache, {counts['wrong']} wrong, "
          f"{len(errors)} errors")
    assert errors == []
    assert counts["wrong"] == 0
    assert counts["ops"] > threads
    for d in range(2):
        assert MOD.memory_allocated(d) == 0
    MOD.empty_cache()
    for d in range(2):
        assert MOD.memory_reserved(d) == 0
        assert torch.ops.simdev_driver.bytes_in_use(d) == 0
