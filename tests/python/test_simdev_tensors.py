"""simdev through PyTorch: devices, copies in every direction, fallback, errors."""
import json
import os
import subprocess
import sys

import pytest
import torch


def test_devices_are_named_and_counted():
    assert torch.simdev.is_available()
    assert torch.simdev.device_count() == 2
    assert torch.accelerator.device_count() == 2
    assert torch.device("simdev:1").type == "simdev"
    assert torch.simdev.get_device_name(1) == "SimDev S1"
    props = torch.simdev.get_device_properties(0)
    assert props["total_memory"] == 256 << 20
    torch.simdev.set_device(1)
    assert torch.simdev.current_device() == 1
    assert torch.empty(3, device="simdev").device == torch.device("simdev:1")


def test_device_index_out_of_range_is_an_index_error():
    with pytest.raises(IndexError, match=r"simdev: invalid device index 7: simdev has 2"):
        torch.simdev.set_device(7)
    with pytest.raises(IndexError, match="invalid device index 5"):
        torch.empty(2, device="simdev:5")
    assert torch.simdev.current_device() == 0  # unchanged


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                   torch.int64, torch.int8, torch.bool, torch.complex64])
def test_host_device_round_trip_keeps_values(dtype):
    x = (torch.randn(17, 5) * 10).to(dtype)
    y = x.to("simdev")
    assert y.device.type == "simdev" and y.dtype == dtype
    assert torch.equal(y.cpu(), x)


def test_copies_of_views_with_conversion_across_devices():
    x = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    d0 = x.to("simdev:0")
    t = d0.t()                                   # non-contiguous view on the device
    assert not t.is_contiguous()
    assert torch.equal(t.cpu(), x.t())
    d1 = t.to("simdev:1")                        # across devices, non-contiguous
    assert d1.device == torch.device("simdev:1")
    assert torch.equal(d1.cpu(), x.t())
    half = torch.empty(10, 6, dtype=torch.float16, device="simdev:1")
    half.copy_(t)                                # dtype conversion, device to device
    assert torch.equal(half.cpu(), x.t().half())
    dst = torch.zeros(10, 12, device="simdev:0")[:, ::2]   # strided destination
    dst.copy_(x.t())                                        # host to strided device view
    assert torch.equal(dst.cpu(), x.t())
    col = d0[:, 3]
    assert torch.equal(col.cpu(), x[:, 3])
    assert d0[2, 7].item() == 27.0


def test_views_resize_and_set_work_natively():
    x = torch.arange(12.0, device="simdev")
    v = x.view(3, 4)
    assert v.data_ptr() == x.data_ptr()
    v[1].fill_(-1)
    assert x.cpu()[4:8].tolist() == [-1.0] * 4
    y = torch.empty(0, device="simdev")
    y.resize_(100)
    assert y.numel() == 100
    y.zero_()
    assert y.sum().item() == 0.0
    z = torch.empty(0, device="simdev").set_(x)
    assert z.data_ptr() == x.data_ptr()


def test_operators_without_kernels_fall_back_to_the_cpu_and_are_reported():
    torch.simdev.reset_fallback_report()
    a = torch.randn(8, 8)
    b = torch.randn(8, 8)
    got = (a.to("simdev") @ b.to("simdev")).relu().cpu()
    assert torch.allclose(got, (a @ b).relu())
    ops = {op for op, _, _ in torch.simdev.fallback_report()}
    assert any(op.startswith("aten::mm") for op in ops)
    assert all(count > 0 for _, count, _ in torch.simdev.fallback_report())


def test_tensors_on_two_devices_in_one_op_are_an_error():
    a = torch.ones(3, device="simdev:0")
    b = torch.ones(3, device="simdev:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*simdev:0.*simdev:1"):
        a + b


def test_out_of_memory_raises_and_the_next_allocation_succeeds():
    a = torch.empty(160 << 20, dtype=torch.uint8, device="simdev")
    with pytest.raises(torch.OutOfMemoryError,
                       match=r"simdev: out of memory on simdev:0: tried to allocate 160.00 MiB"):
        torch.empty(160 << 20, dtype=torch.uint8, device="simdev")
    with pytest.raises(torch.OutOfMemoryError, match="larger than the device's largest single"):
        torch.empty(1 << 40, dtype=torch.uint8, device="simdev")
    del a
    b = torch.empty(160 << 20, dtype=torch.uint8, device="simdev")  # usable again
    assert b.numel() == 160 << 20
    del b
    torch.simdev.empty_cache()
    assert torch.simdev.memory_reserved(0) == 0


def test_memory_statistics_follow_allocations():
    torch.simdev.empty_cache()
    base = torch.simdev.memory_allocated(0)
    x = torch.empty(1 << 20, dtype=torch.uint8, device="simdev")
    assert torch.simdev.memory_allocated(0) == base + (1 << 20)
    assert torch.simdev.max_memory_allocated(0) >= base + (1 << 20)
    stats = torch.simdev.memory_stats(0)
    assert stats["allocation.all.current"] >= 1
    del x
    assert torch.simdev.memory_allocated(0) == base
    free, total = torch.simdev.mem_get_info(0)
    assert total == 256 << 20 and 0 < free <= total


def test_non_blocking_copy_on_a_side_stream_joined_with_an_event():
    src = torch.randn(1 << 16).pin_memory()
    assert src.is_pinned()
    side = torch.Stream(device="simdev:0")
    main = torch.accelerator.current_stream(0)
    torch.accelerator.set_stream(side)
    dev = src.to("simdev", non_blocking=True)
    done = torch.Event()
    done.record(side)
    torch.accelerator.set_stream(main)
    main.wait_event(done)
    out = (dev * 2).cpu()
    assert torch.equal(out, src * 2)
    assert done.query()


def test_events_time_work():
    start = torch.Event(device="simdev", enable_timing=True)
    end = torch.Event(device="simdev", enable_timing=True)
    start.record()
    x = torch.randn(256, 256, device="simdev")
    for _ in range(3):
        x = x @ x
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0.0


def _run(code, **env):
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", "import torch, torch_simdev\n" + code],
                          capture_output=True, text=True, env=full, timeout=120)


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
    assert "error: simdev: simdev driver error 999 in memcpy_async: injected fault" in r.stdout, r.stderr
    assert "after: [0.0, 1.0, 2.0, 3.0]" in r.stdout


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
    assert "SIMDEV_VISIBLE_DEVICES='0,x': entry 'x'" in r.stdout
    assert "ValueError simdev: SIMDEV_VISIBLE_DEVICES='0,x'" in r.stdout


def test_report_is_json_with_every_device():
    report = json.loads(torch.ops.simdev.report_json())
    assert report["device_count"] == 2
    assert [d["index"] for d in report["devices"]] == [0, 1]


def test_fallback_policy_error_and_blocklist_and_warn_once_per_operator():
    r = _run("""
a = torch.ones(4, device='simdev')
try:
    a * 2
    print('ran')
except NotImplementedError as e:
    print('refused:', e)
""", SIMDEV_FALLBACK="error")
    assert "refused: The operator 'aten::mul.Tensor' is not implemented for simdev and its CPU " \
           "fallback is disabled (SIMDEV_FALLBACK=error)" in r.stdout, r.stdout + r.stderr

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

    r = _run("torch.ones(1, device='simdev') * 2", SIMDEV_FALLBACK="sometimes")
    assert "ValueError: simdev: SIMDEV_FALLBACK='sometimes': expected allow, warn or error" \
        in r.stderr, r.stderr


def test_untyped_storage_resizes_both_ways_keeping_the_prefix():
    x = torch.arange(8, dtype=torch.uint8, device="simdev")
    s = x.untyped_storage()
    s.resize_(16)
    assert s.nbytes() == 16
    assert torch.equal(torch.tensor([], dtype=torch.uint8).set_(s.cpu())[:8],
                       torch.arange(8, dtype=torch.uint8))
    s.resize_(4)
    assert s.nbytes() == 4
    assert torch.tensor([], dtype=torch.uint8).set_(s.cpu()).tolist() == [0, 1, 2, 3]


def test_device_and_stream_context_managers_restore_what_was_current():
    with torch.simdev.device(1):
        assert torch.simdev.current_device() == 1
        assert torch.empty(1, device="simdev").device == torch.device("simdev:1")
    assert torch.simdev.current_device() == 0
    with pytest.raises(IndexError):
        with torch.simdev.device(9):
            pass
    assert torch.simdev.current_device() == 0
    default = torch.simdev.current_stream(0)
    s = torch.simdev.Stream(0, priority=-1)
    with torch.simdev.stream(s):
        assert torch.simdev.current_stream(0) == s
    assert torch.simdev.current_stream(0) == default
    e = torch.simdev.Event(enable_timing=True)
    e.record()
    e.synchronize()
    assert torch.simdev.is_bf16_supported()
    assert "float8_e4m3fn" in torch.simdev.supported_dtypes(0)
