"""simdev through PyTorch: devices, copies in every direction, fallback, errors."""
import json
import os
import subprocess
import sys

import pytest
import torch

from backend import DEV, ENV, MOD, OPS, renamed, simdev_capacity, simdev_only, two_devices


@simdev_only
def test_devices_are_named_and_counted():
    assert MOD.is_available()
    assert MOD.device_count() == 2
    assert torch.accelerator.device_count() == 2
    assert torch.device(f"{DEV}:1").type == DEV
    assert MOD.get_device_name(1) == "SimDev S1"
    props = MOD.get_device_properties(0)
    assert props["total_memory"] == 256 << 20
    MOD.set_device(1)
    assert MOD.current_device() == 1
    assert torch.empty(3, device=DEV).device == torch.device(f"{DEV}:1")


def test_device_index_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match=rf"{DEV}: invalid device index 7: {DEV} has {MOD.device_count()} "):
        MOD.set_device(7)
    with pytest.raises(IndexError, match="invalid device index 5"):
        torch.empty(2, device=f"{DEV}:5")
    assert MOD.current_device() == 0  # unchanged


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int8, torch.bool, torch.complex64])
def test_host_device_round_trip_keeps_values(dtype):
    x = (torch.randn(17, 5) * 10).to(dtype)
    y = x.to(DEV)
    assert y.device.type == DEV and y.dtype == dtype
    assert torch.equal(y.cpu(), x)


@two_devices
def test_large_copies_land_whole_at_every_offset_into_a_page():
    # Pageable memory at several offsets into a page from page-aligned device
    # memory and back. (simdev's copy engine, which copies the largest of
    # these from the end to the start, has tests of its own in
    # tests/test_simdev_copy.cpp: Note [Copy direction and 4K aliasing].)
    n = (8 << 20) + 4096 + 100
    src = torch.randint(0, 256, (n,), dtype=torch.uint8)
    dev = src.to(DEV)
    base = torch.full((n + 8192,), 5, dtype=torch.uint8)
    for offset in (0, 1, 64, 100, 2047, 2048, 4032):
        out = base[offset:offset + n]
        out.copy_(dev)
        assert torch.equal(out, src)
        assert base[:offset].eq(5).all() and base[offset + n:].eq(5).all()  # nothing outside
        base.fill_(5)
        back = torch.zeros(n - 4096, dtype=torch.uint8, device=DEV)
        back.copy_(src[offset:offset + n - 4096])  # host-to-device from the same offsets
        assert torch.equal(back.cpu(), src[offset:offset + n - 4096])
    peer = dev.to(f"{DEV}:1")
    assert torch.equal(peer.cpu(), src)


@two_devices
def test_copies_of_views_with_conversion_across_devices():
    x = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    d0 = x.to(f"{DEV}:0")
    t = d0.t()                                   # non-contiguous view on the device
    assert not t.is_contiguous()
    assert torch.equal(t.cpu(), x.t())
    d1 = t.to(f"{DEV}:1")                        # across devices, non-contiguous
    assert d1.device == torch.device(f"{DEV}:1")
    assert torch.equal(d1.cpu(), x.t())
    half = torch.empty(10, 6, dtype=torch.float16, device=f"{DEV}:1")
    half.copy_(t)                                # dtype conversion, device to device
    assert torch.equal(half.cpu(), x.t().half())
    dst = torch.zeros(10, 12, device=f"{DEV}:0")[:, ::2]   # strided destination
    dst.copy_(x.t())                                        # host to strided device view
    assert torch.equal(dst.cpu(), x.t())
    col = d0[:, 3]
    assert torch.equal(col.cpu(), x[:, 3])
    assert d0[2, 7].item() == 27.0


@pytest.mark.parametrize("contiguous", [True, False])
def test_copies_within_one_tensors_memory_behave_as_on_the_cpu(contiguous):
    # (Note [Copies within one tensor's memory]) The very same elements are
    # left alone, partly overlapping ones refused with PyTorch's own error
    # where the CPU's check can tell (dense ranges), as on the CPU; the
    # memory and the device stay usable.
    step = 1 if contiguous else 2
    for device in ("cpu", f"{DEV}:0"):
        x = torch.arange(24, dtype=torch.float32, device=device)
        x[0:10:step].copy_(x.view(2, 12)[0][0:10:step])           # onto itself
        assert torch.equal(x.cpu(), torch.arange(24, dtype=torch.float32))
        if contiguous:  # strided, the CPU cannot tell (PyTorch: "too hard") and copies
            with pytest.raises(RuntimeError, match="refers? to a single memory location"):
                x[1:11].copy_(x[0:10])                               # partly overlapping
        with pytest.raises(RuntimeError, match="refers? to a single memory location"):
            x[0:4].expand(3, 4).copy_(torch.ones(3, 4, device=device))  # dst overlaps itself
        assert torch.equal(x.cpu(), torch.arange(24, dtype=torch.float32))
        x[12:22:step].copy_(x[0:10:step])                            # disjoint: copied
        assert torch.equal(x[12:22:step].cpu(), torch.arange(0, 10, step, dtype=torch.float32))


@two_devices
def test_tensors_on_two_devices_in_one_op_are_an_error():
    a = torch.ones(3, device=f"{DEV}:0")
    b = torch.ones(3, device=f"{DEV}:1")
    with pytest.raises(RuntimeError, match=f"Expected all tensors to be on the same device.*{DEV}:0.*{DEV}:1"):
        a + b


@two_devices
def test_convolution_checks_devices_and_follows_the_fallback_policy():
    x = torch.randn(1, 2, 5, 5, device=f"{DEV}:0")
    w1 = torch.randn(3, 2, 3, 3, device=f"{DEV}:1")
    with pytest.raises(RuntimeError, match="same device, but found at least two devices, "
                                           f"{DEV}:0 and {DEV}:1"):
        torch.nn.functional.conv2d(x, w1)
    with pytest.raises(RuntimeError):  # PyTorch's own check: input and weight types differ
        torch.nn.functional.conv2d(x, w1.cpu())
    out = torch.nn.functional.conv2d(x, w1.to(f"{DEV}:0"))  # still usable
    torch.testing.assert_close(out.cpu(), torch.nn.functional.conv2d(x.cpu(), w1.cpu()))

    r = _run("""
x = torch.randn(1, 2, 5, 5, device='simdev')
w = torch.randn(3, 2, 3, 3, device='simdev')
try:
    torch.nn.functional.conv2d(x, w)
    print('ran')
except NotImplementedError as e:
    print('refused:', e)
""", SIMDEV_FALLBACK_BLOCKLIST="convolution_overrideable")
    assert "refused: The operator 'aten::convolution_overrideable' is not implemented for " \
           f"{DEV} and its CPU fallback is blocked ({ENV}FALLBACK_BLOCKLIST)" in r.stdout, \
        r.stdout + r.stderr


@two_devices
def test_random_operators_draw_from_the_device_generator():
    MOD.manual_seed(7)
    assert MOD.initial_seed() == 7
    cpu_state = torch.get_rng_state()
    a = torch.randn(64, device=DEV)
    d = torch.nn.functional.dropout(torch.ones(64, device=DEV), 0.5)
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the CPU generator is untouched
    MOD.manual_seed(7)
    assert torch.equal(torch.randn(64, device=DEV).cpu(), a.cpu())
    assert torch.equal(torch.nn.functional.dropout(torch.ones(64, device=DEV), 0.5).cpu(),
                       d.cpu())
    # Each device has its own generator; a state saved is a state restored.
    MOD.manual_seed_all(3)
    state = MOD.get_rng_state(f"{DEV}:1")
    with MOD.device(1):
        b = torch.randn(8, device=DEV)
    c = torch.randn(8, device=f"{DEV}:0")
    assert torch.equal(b.cpu(), c.cpu())  # same seed, separate generators
    MOD.set_rng_state(state, f"{DEV}:1")
    assert torch.equal(torch.randn(8, device=f"{DEV}:1").cpu(), b.cpu())
    torch.manual_seed(11)  # seeds simdev's generators too, as it does CUDA's
    assert MOD.initial_seed(1) == 11
    # An explicit generator is used as given; it must be a simdev one, as on CUDA.
    g1, g2 = torch.Generator(DEV).manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(torch.randn(8, device=DEV, generator=g1).cpu(),
                       torch.randn(8, generator=g2))
    with pytest.raises(RuntimeError, match=f"Expected a '{DEV}' device type for generator"):
        torch.randn(8, device=DEV, generator=g2)
    with pytest.raises(IndexError, match=f"{DEV}: invalid device index 7"):
        MOD.get_rng_state(7)
    with pytest.raises(IndexError, match=f"{DEV}: invalid device index 256"):
        OPS.get_rng_state(256)  # not narrowed to a valid index
    with pytest.raises(TypeError, match=f"{DEV}: the RNG state of {DEV}:0 must be a CPU ByteTensor"):
        MOD.set_rng_state(torch.zeros(4))


@two_devices
def test_device_properties_read_as_attributes_and_bad_indices_are_errors():
    props = MOD.get_device_properties(f"{DEV}:1")
    assert props.total_memory == props["total_memory"] == 256 << 20
    assert props.name == MOD.get_device_name(1)
    mode = os.environ.get(f"{ENV}HOST_VISIBLE", "1")  # the tests run in each mode
    assert props.host_access == {"1": "direct", "0": "none", "mapped": "mapped"}[mode]
    assert props.host_visible_memory is (mode == "1")  # direct access only
    with pytest.raises(AttributeError, match="no 'warp_size'"):
        props.warp_size
    for bad in (2, -1, f"{DEV}:9"):
        with pytest.raises(IndexError, match=f"{DEV}: invalid device index {bad if isinstance(bad, int) else 9}: {DEV} has 2"):
            MOD.get_device_properties(bad)
    with pytest.raises(ValueError, match=f"{DEV}: expected a {DEV} device, got cpu"):
        MOD.get_device_properties("cpu")
    with MOD.device(-1):  # changes nothing, as torch.cuda.device(-1)
        assert MOD.current_device() == 0


def test_availability_and_seeding_create_no_context():
    r = _run("""
torch.manual_seed(0)  # seeds every simdev device's generator too
torch.simdev.manual_seed(1)
print(torch.simdev.is_available(), torch.simdev.device_count(), torch.simdev.is_initialized())
torch.empty(1, device='simdev')
print(torch.simdev.is_initialized())
""")
    assert r.stdout.split() == ["True", str(MOD.device_count()), "False", "True"], \
        r.stdout + r.stderr


@simdev_capacity
def test_peak_statistics_reset_and_the_memory_fraction_caps_allocations():
    MOD.empty_cache()
    x = torch.empty(8 << 20, dtype=torch.uint8, device=DEV)
    del x
    assert MOD.max_memory_allocated(0) >= 8 << 20
    MOD.reset_peak_memory_stats(0)
    assert MOD.max_memory_allocated(0) == MOD.memory_allocated(0)
    MOD.set_per_process_memory_fraction(0.25, 0)  # 64 of 256 MiB
    try:
        with pytest.raises(torch.OutOfMemoryError, match=DEV):
            torch.empty(96 << 20, dtype=torch.uint8, device=DEV)
        y = torch.empty(32 << 20, dtype=torch.uint8, device=DEV)  # within the cap
        del y
    finally:
        MOD.set_per_process_memory_fraction(1.0, 0)
    z = torch.empty(96 << 20, dtype=torch.uint8, device=DEV)  # the cap is lifted
    del z
    with pytest.raises(ValueError, match=DEV):
        MOD.set_per_process_memory_fraction(1.5, 0)


@two_devices
@simdev_only
def test_record_stream_keeps_memory_from_reuse_until_the_stream_passes():
    side = torch.Stream(device=f"{DEV}:0")
    x = torch.empty(1 << 20, dtype=torch.uint8, device=DEV)
    ptr = x.data_ptr()
    with pytest.raises(RuntimeError, match=f"{DEV}: record_stream: the stream is on {DEV}:1 "
                                           f"but the tensor is on {DEV}:0"):
        x.record_stream(torch.Stream(device=f"{DEV}:1"))
    x.record_stream(side)
    with _held(side):
        del x
        y = torch.empty(1 << 20, dtype=torch.uint8, device=DEV)
        assert y.data_ptr() != ptr  # the side stream has not passed the free
    MOD.synchronize()
    del y
    MOD.empty_cache()  # nothing is left pending or lost
    assert MOD.memory_reserved(0) == 0


@simdev_capacity
def test_out_of_memory_raises_and_the_next_allocation_succeeds():
    a = torch.empty(160 << 20, dtype=torch.uint8, device=DEV)
    with pytest.raises(torch.OutOfMemoryError,
                       match=rf"{DEV}: out of memory on {DEV}:0: tried to allocate 160.00 MiB"):
        torch.empty(160 << 20, dtype=torch.uint8, device=DEV)
    with pytest.raises(torch.OutOfMemoryError, match="larger than the device's largest single"):
        torch.empty(1 << 40, dtype=torch.uint8, device=DEV)
    del a
    b = torch.empty(160 << 20, dtype=torch.uint8, device=DEV)  # usable again
    assert b.numel() == 160 << 20
    del b
    MOD.empty_cache()
    assert MOD.memory_reserved(0) == 0


@simdev_capacity
def test_memory_statistics_follow_allocations():
    MOD.empty_cache()
    base = MOD.memory_allocated(0)
    x = torch.empty(1 << 20, dtype=torch.uint8, device=DEV)
    assert MOD.memory_allocated(0) == base + (1 << 20)
    assert MOD.max_memory_allocated(0) >= base + (1 << 20)
    stats = MOD.memory_stats(0)
    assert stats["allocation.all.current"] >= 1
    del x
    assert MOD.memory_allocated(0) == base
    free, total = MOD.mem_get_info(0)
    assert total == 256 << 20 and 0 < free <= total


def _held(stream):
    """Holds `stream` (simdev's test knob) until the context exits."""
    class Held:
        def __enter__(self):
            self.gate = torch.ops.simdev_driver.hold(stream)

        def __exit__(self, *exc):
            torch.ops.simdev_driver.release(self.gate)
    return Held()


@simdev_only
def test_non_blocking_copy_on_a_side_stream_joined_with_an_event():
    src = torch.randn(1 << 16).pin_memory()
    assert src.is_pinned()
    side = torch.Stream(device=f"{DEV}:0")
    main = torch.accelerator.current_stream(0)
    with _held(side):
        torch.accelerator.set_stream(side)
        try:
            dev = src.to(DEV, non_blocking=True)
            done = torch.Event()
            done.record(side)
        finally:
            torch.accelerator.set_stream(main)
        main.wait_event(done)
        assert not side.query() and not done.query()  # the copy is in flight
    out = (dev * 2).cpu()  # on main, after the event
    assert torch.equal(out, src * 2)
    assert done.query()


@simdev_only
def test_pinned_memory_of_a_copy_in_flight_is_not_reused_before_the_copy_lands():
    # With the stream held, the copies stay in flight while their pinned
    # buffers are freed, pinned again (the same size class) and written: the
    # new owner must not see the copy's bytes, nor the copy the new owner's.
    n = 1 << 16
    ones = torch.ones(n, device=DEV)
    for _ in range(3):
        with _held(torch.accelerator.current_stream(0)):
            src = torch.full((n,), 5.0).pin_memory()
            to_device = torch.empty(n, device=DEV)
            to_device.copy_(src, non_blocking=True)       # host -> device, in flight
            to_host = torch.empty(n).pin_memory()
            to_host.copy_(ones, non_blocking=True)        # device -> host, in flight
            del src, to_host
            reused = [torch.empty(n).pin_memory().fill_(2.0) for _ in range(2)]
        MOD.synchronize()
        assert torch.equal(to_device.cpu(), torch.full((n,), 5.0))
        for r in reused:
            assert torch.equal(r, torch.full((n,), 2.0))


def test_events_time_work():
    start = torch.Event(device=DEV, enable_timing=True)
    end = torch.Event(device=DEV, enable_timing=True)
    start.record()
    x = torch.randn(256, 256, device=DEV)
    for _ in range(3):
        x = x @ x
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0.0


def _run(code, **env):
    full = {**os.environ, **{renamed(k): v for k, v in env.items()}}  # SIMDEV_X: <ENV>X
    return subprocess.run([sys.executable, "-c", renamed("import torch, torch_simdev\n" + code)],
                          capture_output=True, text=True, env=full, timeout=120)


@simdev_only
def test_a_driver_refusal_with_memory_free_is_a_runtime_error_not_out_of_memory():
    r = _run("""
try:
    torch.empty(1 << 20, device='simdev')
    print('no error')
except torch.OutOfMemoryError as e:
    print('oom:', e)
except RuntimeError as e:
    print('refused:', str(e).splitlines()[0])
print('after:', torch.ones(4, device='simdev').sum().item())
""", SIMDEV_INJECT_FAULT="malloc:refuse", SIMDEV_MEMORY_MB="256")
    assert "refused: simdev: the driver refused to allocate" in r.stdout, r.stdout + r.stderr
    assert "aligned to 256 B on simdev:0 although" in r.stdout
    assert "after: 4.0" in r.stdout


@simdev_only
def test_tensors_are_aligned_as_the_device_declares_and_work_at_128_bytes():
    r = _run("""
xs = [torch.randn(n, device='simdev') for n in (1, 33, 1000, 1 << 18)]
print('aligned:', all(x.data_ptr() % 128 == 0 for x in xs))
print('only 128:', any(x.data_ptr() % 256 for x in xs))
a = torch.randn(64, 64)
print('mm:', torch.allclose((a.to('simdev') @ a.to('simdev')).cpu(), a @ a, atol=1e-4))
print('declared:', torch.simdev.get_device_properties(0).memory_alignment)
""", SIMDEV_ALIGNMENT="128")
    assert "aligned: True" in r.stdout, r.stdout + r.stderr
    assert "only 128: True" in r.stdout, r.stdout
    assert "mm: True" in r.stdout
    assert "declared: 128" in r.stdout


@simdev_only
def test_a_driver_fault_mid_copy_is_a_clear_error_and_the_next_copy_works():
    r = _run("""
x = torch.arange(4.0)
try:
    x.to('simdev')
    print('no error')
except RuntimeError as e:
    print('error:', e)
print('after:', x.to('simdev').cpu().tolist())
""", SIMDEV_INJECT_FAULT="memcpy_async@1")
    assert f"error: {DEV}: driver error 999 in memcpy_async: injected fault" in r.stdout, r.stderr
    assert "after: [0.0, 1.0, 2.0, 3.0]" in r.stdout


@simdev_only
def test_a_driver_fault_in_the_middle_of_a_copy_leaves_destination_and_memory_as_they_were():
    # On a device the host may not touch, writing into a strided view reads the
    # storage back, changes it on the host, and writes it again: the fault hits
    # the write, after the read.
    r = _run("""
inject = torch.ops.simdev_driver.inject_fault
d = torch.arange(16.0).reshape(4, 4).to('simdev')
before = torch.simdev.memory_allocated()
inject('memcpy_async', 2)
try:
    d[:, ::2].copy_(torch.full((4, 2), -1.0))
    print('no error')
except RuntimeError as e:
    print('error:', str(e).splitlines()[0])
print('unchanged:', torch.equal(d.cpu(), torch.arange(16.0).reshape(4, 4)))
print('leaked:', torch.simdev.memory_allocated() - before)
d[:, ::2].copy_(torch.full((4, 2), -1.0))
print('after:', d.cpu()[0].tolist())
src = torch.ones(1 << 16).pin_memory()
inject('memcpy_async')
try:
    src.to('simdev', non_blocking=True)
except RuntimeError as e:
    print('pinned error:', str(e).splitlines()[0])
print('leaked:', torch.simdev.memory_allocated() - before)
print('pinned after:', src.to('simdev', non_blocking=True)[:2].cpu().tolist())
""", SIMDEV_HOST_VISIBLE="0")
    lines = r.stdout.splitlines()
    fault = f"{DEV}: driver error 999 in memcpy_async: injected fault"
    assert lines == ["error: " + fault, "unchanged: True", "leaked: 0",
                     "after: [-1.0, 1.0, -1.0, 3.0]", "pinned error: " + fault, "leaked: 0",
                     "pinned after: [1.0, 1.0]"], r.stdout + r.stderr


def test_a_malformed_visibility_variable_leaves_zero_devices_and_a_clear_error():
    r = _run("""
print('count', torch.simdev.device_count(), torch.simdev.is_available())
print('why', torch.simdev.init_error())
try:
    torch.empty(1, device='simdev')
except ValueError as e:
    print('ValueError', e)
""", SIMDEV_VISIBLE_DEVICES="0,x")
    assert "count 0 False" in r.stdout, r.stderr
    assert f"{ENV}VISIBLE_DEVICES='0,x': entry 'x'" in r.stdout
    assert f"ValueError {DEV}: {ENV}VISIBLE_DEVICES='0,x'" in r.stdout


def test_report_is_json_with_every_device():
    report = json.loads(OPS.report_json())
    assert report["device_count"] == MOD.device_count() >= 1
    assert [d["index"] for d in report["devices"]] == list(range(MOD.device_count()))


@simdev_only
def test_the_fallback_runs_on_device_memory_when_the_host_may_touch_it():
    # cos_ has no kernel: on host-visible memory the CPU kernel runs in place on
    # the device's memory (no driver copy); otherwise the tensor goes to the CPU
    # and back.
    a = torch.linspace(0, 1, 1000, device=DEV)
    want = torch.linspace(0, 1, 1000).cos()
    MOD.synchronize()
    before = torch.ops.simdev_driver.copies()
    a.cos_()
    copies = torch.ops.simdev_driver.copies() - before
    if MOD.get_device_properties(0).host_access != "none":  # direct, or mapped in place
        assert copies == 0
    else:
        assert copies >= 2
    torch.testing.assert_close(a.cpu(), want)


@simdev_only
def test_a_channels_last_copy_is_one_driver_copy_each_way():
    # Both sides dense with the same strides: one copy of the whole range,
    # not a permuting copy through a contiguous buffer (which took 16x as
    # long for a 4 MiB activation, and the SDK's convolution does it for
    # every output).
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    MOD.synchronize()
    before = torch.ops.simdev_driver.copies()
    d = x.to(DEV)
    assert torch.ops.simdev_driver.copies() - before == 1
    assert d.stride() == x.stride() and d.is_contiguous(memory_format=torch.channels_last)
    before = torch.ops.simdev_driver.copies()
    back = d.cpu()
    assert torch.ops.simdev_driver.copies() - before == 1
    assert back.stride() == x.stride() and torch.equal(back, x)


def test_fallback_policy_error_and_blocklist_and_warn_once_per_operator():
    r = _run("""
a = torch.ones(4, device='simdev')
try:
    a * 2
    print('ran')
except NotImplementedError as e:
    print('refused:', e)
""", SIMDEV_FALLBACK="error")
    assert f"refused: The operator 'aten::mul.Tensor' is not implemented for {DEV} and its CPU " \
           f"fallback is disabled ({ENV}FALLBACK=error)" in r.stdout, r.stdout + r.stderr

    r = _run("""
a = torch.ones(4, 4, device='simdev')
print('add', (a + a).sum().item())
try:
    a @ a
except NotImplementedError as e:
    print('blocked:', 'SIMDEV_FALLBACK_BLOCKLIST' in str(e))
""", SIMDEV_FALLBACK_BLOCKLIST="mm, aten::bmm")
    assert "add 32.0" in r.stdout and "blocked: True" in r.stdout, r.stdout + r.stderr

    r = _run("""
import warnings
warnings.simplefilter('always')
a = torch.ones(4, device='simdev')
with warnings.catch_warnings(record=True) as w:
    for _ in range(3):
        a * 2
        a - 1
print('warnings', sorted({str(x.message).split("'")[1] for x in w}), len(w))
""", SIMDEV_FALLBACK="warn")
    assert "warnings ['aten::mul.Tensor', 'aten::sub.Tensor'] 2" in r.stdout, r.stdout + r.stderr

    r = _run(f"torch.ones(1, device='{DEV}') * 2", SIMDEV_FALLBACK="sometimes")
    assert f"ValueError: {DEV}: {ENV}FALLBACK='sometimes': expected allow, warn or error" \
        in r.stderr, r.stderr


def test_untyped_storage_resizes_both_ways_keeping_the_prefix():
    x = torch.arange(8, dtype=torch.uint8, device=DEV)
    s = x.untyped_storage()
    s.resize_(16)
    assert s.nbytes() == 16
    assert torch.equal(torch.tensor([], dtype=torch.uint8).set_(s.cpu())[:8],
                       torch.arange(8, dtype=torch.uint8))
    s.resize_(4)
    assert s.nbytes() == 4
    assert torch.tensor([], dtype=torch.uint8).set_(s.cpu()).tolist() == [0, 1, 2, 3]


@two_devices
def test_device_and_stream_context_managers_restore_what_was_current():
    with MOD.device(1):
        assert MOD.current_device() == 1
        assert torch.empty(1, device=DEV).device == torch.device(f"{DEV}:1")
    assert MOD.current_device() == 0
    with pytest.raises(IndexError):
        with MOD.device(9):
            pass
    assert MOD.current_device() == 0
    default = MOD.current_stream(0)
    s = MOD.Stream(0, priority=-1)
    with MOD.stream(s):
        assert MOD.current_stream(0) == s
    assert MOD.current_stream(0) == default
    e = MOD.Event(enable_timing=True)
    e.record()
    e.synchronize()
    assert MOD.is_bf16_supported()
    assert "float8_e4m3fn" in MOD.supported_dtypes(0)


def test_complex_views_and_conjugate_copies_on_the_device():
    c = torch.randn(3, 4, dtype=torch.complex64)
    x = c.to(DEV)
    assert torch.equal(torch.view_as_real(x).cpu(), torch.view_as_real(c))
    assert torch.equal(torch.view_as_complex(torch.view_as_real(x)).cpu(), c)
    assert torch.equal(x.real.cpu(), c.real) and torch.equal(x.imag.cpu(), c.imag)
    assert torch.equal(x.conj().cpu(), c.conj())                     # device -> host, conj bit
    y = torch.empty_like(x)
    y.copy_(x.conj())                                                # device -> device
    assert torch.equal(y.cpu(), c.conj())
    z = torch.zeros_like(x).conj()
    z.copy_(x)                                                       # into a conjugated view
    assert torch.equal(z.cpu(), c) and torch.equal(z.resolve_conj().cpu(), c)
    w = torch.zeros(3, 4, dtype=torch.complex64, device=DEV)
    w.conj().copy_(c)                                                # host -> conjugated view
    assert torch.equal(w.cpu(), c.conj())
    r = torch.randn(4, 3)
    assert torch.equal(torch._neg_view(r.to(DEV)).cpu(), -r)    # negative bit
    assert torch.allclose(torch.fft.hfft(x).cpu(), torch.fft.hfft(c), atol=1e-5)  # recursed before
    assert torch.allclose((x.conj() * x).cpu(), c.conj() * c)
    t = torch.arange(10.0)
    assert torch.equal(t.to(DEV).unfold(0, 3, 2).cpu(), t.unfold(0, 3, 2))


def test_zero_size_tensors_keep_their_shapes_through_kernels_and_the_fallback():
    x = torch.zeros(1, 0, 3, device=DEV)
    ops = [torch.logical_not, torch.isfinite, torch.nn.functional.softsign, torch.exp,
           torch.sin, lambda t: t.sum(1), lambda t: t + 1, lambda t: torch.atan2(t, t),
           lambda t: torch.cumsum(t, 2), lambda t: t.cpu()]
    for f in ops:
        got, want = f(x), f(torch.zeros(1, 0, 3))
        assert got.shape == want.shape and got.dtype == want.dtype


def test_sparse_layouts_are_a_clear_error_naming_the_backend():
    x = torch.randn(3, 3, device=DEV)
    attempts = [lambda: x.to_sparse(),
                lambda: torch.randn(3, 3).to_sparse().to(DEV),
                lambda: torch.sparse_coo_tensor(torch.tensor([[0], [1]]), torch.tensor([1.0]),
                                                (2, 2), device=DEV),
                lambda: x.to_sparse_csr() @ x,
                lambda: x.to_sparse_csr(),  # made by the fallback: refused, not half usable
                lambda: x.to_sparse_csc(),
                lambda: x.to_sparse_bsr((1, 1))]
    for f in attempts:
        with pytest.raises(NotImplementedError, match=f"{DEV}: sparse tensors are not supported on {DEV}"):
            f()
    assert torch.equal(x.cpu().to_sparse().to_dense(), x.cpu())     # the CPU's still work


def test_operators_that_take_conjugated_inputs_as_they_are_read_their_bits():
    # dot and vdot receive x.conj() unresolved (the Conjugate key falls
    # through for them); the CPU kernel run on device memory must see the bit.
    a = torch.randn(5, dtype=torch.complex64)
    b = torch.randn(5, dtype=torch.complex64)
    da, db = a.to(DEV), b.to(DEV)
    assert torch.allclose(torch.vdot(da, db).cpu(), torch.vdot(a, b))
    assert torch.allclose(torch.dot(da.conj(), db).cpu(), torch.dot(a.conj(), b))
    assert torch.allclose(torch.dot(da, db.conj()).cpu(), torch.dot(a, b.conj()))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_layer_and_group_norm_compute_with_the_cpus_kernels_bit_for_bit(dtype):
    # Both have a composite kernel beside the CPU's; the composite (through
    # batch_norm) rounded differently in reduced precision (bfloat16
    # layer_norm was 0.125 off). Note [CPU kernels over composites].
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5).to(dtype)
    w, b = torch.randn(6, 5).to(dtype), torch.randn(6, 5).to(dtype)
    got = torch.nn.functional.layer_norm(x.to(DEV), (6, 5), w.to(DEV), b.to(DEV), eps=0.5)
    assert torch.equal(got.cpu(), torch.nn.functional.layer_norm(x, (6, 5), w, b, eps=0.5))
    gw, gb = torch.randn(6).to(dtype), torch.randn(6).to(dtype)
    got = torch.nn.functional.group_norm(x.to(DEV), 3, gw.to(DEV), gb.to(DEV))
    assert torch.equal(got.cpu(), torch.nn.functional.group_norm(x, 3, gw, gb))
    # and their gradients, through the same autograd formulas as the CPU's
    xs, xc = x.to(DEV).requires_grad_(), x.clone().requires_grad_()
    torch.nn.functional.layer_norm(xs, (6, 5)).sum().backward()
    torch.nn.functional.layer_norm(xc, (6, 5)).sum().backward()
    assert torch.equal(xs.grad.cpu(), xc.grad)


@pytest.mark.parametrize("left", [True, False])
def test_a_kernel_that_conjugates_its_output_by_the_bit_is_followed_on_the_device(left):
    # linalg_lu_solve.out with left=False transposes its output in place and
    # sets its conjugate bit: the device tensor must take the same metadata
    # (it came back conjugated in the zero-copy fallback).
    torch.manual_seed(0)
    a = torch.randn(3, 3, dtype=torch.complex64)
    b = torch.randn(3, 4, dtype=torch.complex64) if left else torch.randn(4, 3, dtype=torch.complex64)
    lu, piv = torch.linalg.lu_factor(a)
    want = torch.linalg.lu_solve(lu, piv, b, left=left)
    got = torch.linalg.lu_solve(lu.to(DEV), piv.to(DEV), b.to(DEV), left=left)
    assert torch.allclose(got.cpu(), want, atol=1e-5)
    out = torch.empty(want.shape, dtype=want.dtype, device=DEV)
    torch.linalg.lu_solve(lu.to(DEV), piv.to(DEV), b.to(DEV), left=left, out=out)
    assert torch.allclose(out.cpu(), want, atol=1e-5)


def test_fallen_back_operators_see_and_return_the_cpus_layouts():
    # (Note [Layout-keeping fallback]) linalg_lstsq returns its solution as a
    # slice of a larger buffer, and later BLAS calls round differently on a
    # compacted copy; a conjugate view must reach the CPU kernel as one (the
    # gradient of householder_product was off without host-visible memory,
    # beyond complex64's tolerance). Values are compared at that tolerance,
    # not bit for bit: the CPU's own LAPACK (MKL) rounds lstsq differently
    # from one call to the next, depending on where its buffers fall.
    torch.manual_seed(0)
    a, b = torch.randn(4, 3, dtype=torch.complex64), torch.randn(4, 3, dtype=torch.complex64)
    want = torch.linalg.lstsq(a, b).solution
    got = torch.linalg.lstsq(a.to(DEV), b.to(DEV)).solution
    assert got.stride() == want.stride()
    torch.testing.assert_close(got.cpu(), want)
    x, tau = torch.randn(5, 5, dtype=torch.complex64), torch.randn(5, dtype=torch.complex64)
    go = torch.randn(5, 5, dtype=torch.complex64)
    grads = []
    for device in ("cpu", DEV):
        xs, ts = x.to(device).requires_grad_(), tau.to(device).requires_grad_()
        out = torch.linalg.householder_product(xs, ts)
        grads.append([g.cpu() for g in torch.autograd.grad(out, (xs, ts), go.to(device))])
    for want, got in zip(*grads):
        torch.testing.assert_close(got, want)


@simdev_only
def test_unknown_properties_show_as_none_and_the_derived_uuid_is_stable_across_processes():
    code = """
p = torch.simdev.get_device_properties(1)
print('arch:', p.architecture, 'engines:', p.async_copy_engines, 'derived:', p.uuid_derived)
print('units:', p.compute_units, 'clock:', p.clock_rate_khz)
print('uuid:', p.uuid)
print(torch.simdev.report())
"""
    runs = [_run(code, SIMDEV_UNKNOWN_PROPERTIES="1") for _ in range(2)]
    for r in runs:
        assert "arch: None engines: None derived: True" in r.stdout, r.stdout + r.stderr
        assert "units: None clock: None" in r.stdout, r.stdout + r.stderr
        assert "unknown compute units" in r.stdout and "clock unknown" in r.stdout, r.stdout
    uuids = [line for r in runs for line in r.stdout.splitlines() if line.startswith("uuid:")]
    assert len(uuids) == 2 and uuids[0] == uuids[1], uuids
