"""Memory history and snapshots in torch.cuda's form (torch.<name>.memory._record_memory_history,
_snapshot, _dump_snapshot, _attach_out_of_memory_observer, torch.accelerator.memory._snapshot;
python/accelkit/device/memory.py, docs/memory.md), rendered by PyTorch's own
torch/cuda/_memory_viz.py in every view."""
import base64
import contextlib
import json
import pickle
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.cuda import _memory_viz

from backend import DEV, MOD, renamed, simdev_capacity, simdev_only

MiB = 1 << 20
THIS_FILE = __file__.rsplit("/", 1)[-1]


@contextlib.contextmanager
def _recording(*args, **kwargs):
    """Records history for the block; then stops and forgets it."""
    MOD.memory._record_memory_history(*args, clear_history=True, **kwargs)
    try:
        yield
    finally:
        MOD.memory._record_memory_history(None, clear_history=True)


def _trace(snapshot, device=0, skip=("snapshot",)):
    return [e for e in snapshot["device_traces"][device] if e["action"] not in skip]


def _block(snapshot, address):
    for seg in snapshot["segments"]:
        for b in seg["blocks"]:
            if b["address"] == address:
                return seg, b
    return None, None


def _names_this_test(frames, function):
    return any(f["name"] == function and f["filename"].endswith(THIS_FILE) for f in frames)


def _viz_payload(html):
    """The snapshot trace_plot/segment_plot embed in their page (base64 of the pickle)."""
    files = json.loads(re.search(r"const local_files = (\[.*\])", html).group(1))
    return pickle.loads(base64.b64decode(files[0]["base64"]))


# ------------------------------------------ a known sequence, every view of _memory_viz

@simdev_only  # holds a stream with simdev's test knob, so that a free waits behind it
def test_a_known_sequence_renders_in_every_view_of_pytorchs_memory_viz():
    MOD.synchronize()
    MOD.empty_cache()
    side = MOD.Stream()
    with _recording(context="all", stacks="python"):
        a = torch.empty(12 * MiB, dtype=torch.uint8, device=DEV)  # default stream
        with MOD.stream(side):
            b = torch.empty(3 * MiB, dtype=torch.uint8, device=DEV)  # the side stream's pool
        small = torch.ones(1000, device=DEV)
        before = MOD.memory._snapshot()
        a_addr, b_addr = a.data_ptr(), b.data_ptr()
        gate = torch.ops.simdev_driver.hold(side)
        try:
            a.record_stream(side)
            with MOD.stream(side):
                b.copy_(a[: 3 * MiB])  # queued behind the held side stream
            del a  # free_requested now; free_completed once the side stream's work is done
            pending = MOD.memory._snapshot()
        finally:
            torch.ops.simdev_driver.release(gate)
        MOD.synchronize()
        del b
        MOD.empty_cache()
        after = MOD.memory._snapshot()
    function = "test_a_known_sequence_renders_in_every_view_of_pytorchs_memory_viz"

    # The snapshot: CUDA's structure, every device's segments, a trace per device.
    assert set(before) >= {"segments", "device_traces", "allocator_settings"}
    assert len(before["device_traces"]) == MOD.device_count()
    seg, block = _block(before, a_addr)
    assert block["state"] == "active_allocated" and block["requested_size"] == 12 * MiB
    assert seg["segment_type"] == "large" and seg["segment_pool_id"] == (0, 0)
    assert _names_this_test(block["frames"], function), block["frames"]
    side_seg, side_block = _block(before, b_addr)
    assert side_block["requested_size"] == 3 * MiB and side_seg["stream"] != seg["stream"]
    assert _block(pending, a_addr)[1]["state"] == "active_pending_free"
    assert _block(after, a_addr) == (None, None)  # empty_cache gave the segment back

    # The trace: the events in order, the free queued behind the side stream completing
    # after it was requested, the segments given back by empty_cache.
    trace = _trace(after)
    events = [(e["action"], e["addr"]) for e in trace]
    assert ("alloc", a_addr) in events and ("alloc", b_addr) in events
    requested = events.index(("free_requested", a_addr))
    completed = events.index(("free_completed", a_addr))
    assert requested < completed
    assert events.index(("free_requested", b_addr)) > requested
    freed = [e for e in trace if e["action"] == "segment_free"]
    assert seg["address"] in {e["addr"] for e in freed}
    alloc_a = trace[events.index(("alloc", a_addr))]
    assert alloc_a["size"] >= 12 * MiB and _names_this_test(alloc_a["frames"], function)
    assert all(isinstance(e["time_us"], int) for e in trace)
    assert [e["time_us"] for e in trace] == sorted(e["time_us"] for e in trace)

    # segsum: the per-segment map and the totals of each snapshot.
    summary = _memory_viz.segsum(before)
    assert f"segments: {len(before['segments'])}" in summary
    assert re.search(r"total_allocated: 1[56]\.\dMiB", summary), summary  # 12 + 3 MiB + 4 KiB
    # trace: the events as PyTorch prints them.
    text = _memory_viz.trace(after)
    assert "Device 0 ----------------" in text
    assert "12.0MiB" in text and "# free completed for" in text and "cudaFree(" in text
    # segments / memory / compare: the flamegraph's input lines (format_flamegraph is given
    # the lines; PyTorch's default runs flamegraph.pl on them).
    lines = _memory_viz.segments(before, format_flamegraph=lambda lines: lines)
    line_a = [ln for ln in lines.splitlines() if ln.endswith(f" {12 * MiB}")]
    assert len(line_a) == 1 and f"seg_{seg['address']};active_allocated;" in line_a[0]
    assert re.search(rf";{re.escape(THIS_FILE)}:\d+:{function}(;|\s)", line_a[0]), line_a[0]
    memory = _memory_viz.memory(before, format_flamegraph=lambda lines: lines)
    assert f"stream_{side_seg['stream']};active_allocated;" in memory and function in memory
    compared = _memory_viz.compare(before["segments"], after["segments"],
                                    format_flamegraph=lambda lines: lines)
    assert f"only_before;stream_{seg['stream']};seg_{seg['address']};active_allocated;" in compared
    # trace_plot / segment_plot: HTML pages embedding the snapshot for MemoryViz.js.
    for html in (_memory_viz.trace_plot(after), _memory_viz.trace_plot(after, plot_segments=True),
                 _memory_viz.segment_plot(after)):
        assert html.startswith("\n<!DOCTYPE html>") and "MemoryViz.js" in html
        embedded = _viz_payload(html)
        assert embedded["device_traces"] == after["device_traces"]
    filtered = _memory_viz.trace_plot(pickle.loads(pickle.dumps(after)), filter_freed=True)
    assert _viz_payload(filtered)["device_traces"][0] != after["device_traces"][0]
    del small


# ------------------------------------------------------------------- recording modes

def test_history_keeps_the_last_max_entries_events():
    MOD.synchronize()
    with _recording(max_entries=6, skip_actions=["snapshot"]):
        for i in range(1, 21):
            x = torch.empty(512 * i, dtype=torch.uint8, device=DEV)
            del x
        trace = MOD.memory._snapshot()["device_traces"][0]
    assert len(trace) == 6
    assert [e["action"] for e in trace] == ["alloc", "free_requested", "free_completed"] * 2
    assert [e["size"] for e in trace] == [512 * 19] * 3 + [512 * 20] * 3


def test_memory_stats_adds_no_snapshot_event_and_still_names_private_pools():
    MOD.synchronize()
    pool = MOD.MemPool()
    with MOD.use_mem_pool(pool):
        held = torch.empty(3 * MiB, dtype=torch.uint8, device=DEV)
    with _recording():
        stats = MOD.memory_stats()
        trace = MOD.memory._snapshot()["device_traces"][0]
    # Only _snapshot's own event: memory_stats took none.
    assert [e["action"] for e in trace] == ["snapshot"]
    a, b = pool.id
    assert stats[f"reserved_bytes_by_private_pools.{a}_{b}.all.current"] >= 3 * MiB
    del held


def test_state_keeps_frames_of_live_blocks_and_all_keeps_the_history():
    MOD.synchronize()
    with _recording("state"):
        kept = torch.empty(MiB + 4096, dtype=torch.uint8, device=DEV)
        for _ in range(5):
            torch.empty(4096, dtype=torch.uint8, device=DEV)
        state = MOD.memory._snapshot()
    with _recording("all"):
        for _ in range(5):
            torch.empty(4096, dtype=torch.uint8, device=DEV)
        every = MOD.memory._snapshot()
    # "state": where each allocated block came from, and no history beyond CUDA's one entry.
    function = "test_state_keeps_frames_of_live_blocks_and_all_keeps_the_history"
    assert _names_this_test(_block(state, kept.data_ptr())[1]["frames"], function)
    assert len(state["device_traces"][0]) <= 1
    assert [e["action"] for e in _trace(every)].count("alloc") == 5
    # Off: nothing new is recorded and live blocks made then have no frames.
    MOD.memory._record_memory_history(None)
    later = torch.empty(MiB + 8192, dtype=torch.uint8, device=DEV)
    off = MOD.memory._snapshot()
    assert _block(off, later.data_ptr())[1]["frames"] == []
    assert _trace(off) == []


def test_context_none_records_the_history_without_frames():
    with _recording(context=None):
        x = torch.empty(MiB + 4096, dtype=torch.uint8, device=DEV)
        snap = MOD.memory._snapshot()
    assert _block(snap, x.data_ptr())[1]["frames"] == []
    allocs = [e for e in _trace(snap) if e["action"] == "alloc" and e["addr"] == x.data_ptr()]
    assert len(allocs) == 1 and allocs[0]["frames"] == []


def test_the_legacy_bool_form_records_as_on_cuda():
    MOD.synchronize()
    MOD.memory._record_memory_history(True, trace_alloc_max_entries=4,
                                      trace_alloc_record_context=True, clear_history=True)
    try:
        x = torch.empty(MiB + 4096, dtype=torch.uint8, device=DEV)
        y = torch.empty(2 * MiB + 4096, dtype=torch.uint8, device=DEV)
        snap = MOD.memory._snapshot()
    finally:
        MOD.memory._record_memory_history(False)
    trace = snap["device_traces"][0]
    assert 0 < len(trace) <= 4
    alloc_y = [e for e in trace if e["action"] == "alloc" and e["addr"] == y.data_ptr()]
    assert alloc_y and _names_this_test(alloc_y[0]["frames"],
                                        "test_the_legacy_bool_form_records_as_on_cuda")
    assert _block(snap, x.data_ptr())[1]["frames"] != []
    # False stops the recording.
    z = torch.empty(MiB + 4096, dtype=torch.uint8, device=DEV)
    assert not [e for e in _trace(MOD.memory._snapshot()) if e.get("addr") == z.data_ptr()
                and e["action"] == "alloc"]
    MOD.memory._record_memory_history(None, clear_history=True)


def _allocate_small():
    return torch.empty(1000, device=DEV)


def test_stacks_all_adds_cpp_frames_innermost_first_and_python_keeps_python_frames():
    with _recording(context="all", stacks="all"):
        x = _allocate_small()
        every = _block(MOD.memory._snapshot(), x.data_ptr())[1]["frames"]
    with _recording(context="all", stacks="python"):
        y = _allocate_small()
        python = _block(MOD.memory._snapshot(), y.data_ptr())[1]["frames"]
    cpp = [i for i, f in enumerate(every) if "empty_memory_format" in f["name"]]
    mine = [i for i, f in enumerate(every)
            if f["name"] == "_allocate_small" and f["filename"].endswith(THIS_FILE)]
    assert cpp and mine and cpp[0] < mine[0], every  # innermost first: C++ under the caller
    assert _names_this_test(python, "_allocate_small")
    assert not any("::" in f["name"] for f in python), python


def test_recording_frames_does_not_deadlock_a_fallback_holding_the_generator():
    # A CPU-fallback random operator holds the device generator's mutex while it copies its
    # result to the device (an allocation, whose frames need the GIL) while another thread
    # holds the GIL and waits for that mutex (Generator.manual_seed).
    code = renamed("""
        import threading, time
        torch.simdev.memory._record_memory_history(stacks="python")
        g = torch.Generator(device="simdev")
        p = torch.rand(1000, device="simdev")
        stop = time.monotonic() + 3
        def sample():
            while time.monotonic() < stop:
                torch.poisson(p, generator=g)
        t = threading.Thread(target=sample, daemon=True)
        t.start()
        n = 0
        while time.monotonic() < stop:
            g.manual_seed(n)
            n += 1
        t.join(10)
        assert not t.is_alive()
        print("ok", n)
    """)
    out = subprocess.run([sys.executable, "-c", renamed("import torch, torch_simdev\n")
                          + textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_every_device_records_and_every_device_is_in_the_snapshot():
    count = MOD.device_count()
    with _recording(device=0):  # as on CUDA, the device argument does not limit recording
        xs = [torch.empty(MiB + 4096, dtype=torch.uint8, device=f"{DEV}:{i}") for i in range(count)]
        snap = MOD.memory._snapshot(device=0)
    assert len(snap["device_traces"]) == count
    for i, x in enumerate(xs):
        seg, _ = _block(snap, x.data_ptr())
        assert seg["device"] == i
        assert ("alloc", x.data_ptr()) in {(e["action"], e["addr"]) for e in _trace(snap, i)}


def test_dump_snapshot_pickles_what_snapshot_gives(tmp_path):
    x = torch.empty(MiB + 4096, dtype=torch.uint8, device=DEV)
    with _recording():
        y = torch.empty(2 * MiB + 4096, dtype=torch.uint8, device=DEV)
        path = tmp_path / "dump_snapshot.pickle"
        MOD.memory._dump_snapshot(str(path))
        segments = MOD.memory.memory_snapshot()
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    assert loaded["segments"] == segments  # nothing allocated in between
    assert _block(loaded, x.data_ptr())[1]["state"] == "active_allocated"
    assert ("alloc", y.data_ptr()) in {(e["action"], e["addr"]) for e in _trace(loaded)}
    assert "total_reserved" in _memory_viz.segsum(loaded)
    # And through _memory_viz's command line, as a user would run it on the file.
    out = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", "stats", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and f"segments: {len(segments)}" in out.stdout, out.stderr


def test_accelerator_snapshot_reaches_the_backend():
    assert torch.accelerator.current_accelerator().type == DEV
    x = torch.empty(MiB + 4096, dtype=torch.uint8, device=DEV)
    with _recording():
        y = torch.empty(2 * MiB + 4096, dtype=torch.uint8, device=DEV)
        snap = torch.accelerator.memory._snapshot()
    assert _block(snap, x.data_ptr())[1] is not None
    assert ("alloc", y.data_ptr()) in {(e["action"], e["addr"]) for e in _trace(snap)}
    assert torch.accelerator.memory._snapshot.__name__ == "_snapshot"


def test_snapshot_keys_are_cudas():
    x = torch.empty(MiB + 4096, dtype=torch.uint8, device=DEV)
    with _recording():
        del x
        snap = MOD.memory._snapshot()
    seg = snap["segments"][0]
    assert set(seg) >= {"device", "address", "total_size", "allocated_size", "active_size",
                        "requested_size", "stream", "segment_type", "segment_pool_id",
                        "is_expandable", "frames", "blocks"}
    assert isinstance(seg["segment_pool_id"], tuple)
    assert set(seg["blocks"][0]) >= {"address", "size", "requested_size", "state", "frames"}
    entry = _trace(snap)[0]
    assert set(entry) >= {"action", "addr", "size", "stream", "time_us", "frames"}
    assert "allocator_settings" in snap and isinstance(snap["allocator_settings"], dict)


# ------------------------------------------------------------------ out of memory

@simdev_capacity  # fills the device
def test_the_out_of_memory_observer_sees_the_figures_and_the_error_says_how_to_record():
    seen = []
    MOD.memory._attach_out_of_memory_observer(lambda *args: seen.append(args))
    MOD.synchronize()
    MOD.empty_cache()
    free, total = MOD.mem_get_info(0)
    held = torch.empty(free // 2, dtype=torch.uint8, device=DEV)
    request = free * 3 // 4
    with _recording():
        with pytest.raises(torch.OutOfMemoryError) as error:
            torch.empty(request, dtype=torch.uint8, device=DEV)
        snap = MOD.memory._snapshot()
    message = str(error.value)
    assert DEV in message and f"torch.{DEV}.memory._record_memory_history" in message
    assert len(seen) == 1, seen
    device, alloc, device_allocated, device_free = seen[0]
    assert device == 0 and alloc == request  # the bytes asked for
    assert device_free < alloc and device_free <= MOD.mem_get_info(0)[0] + MiB
    assert device_allocated >= free // 2  # this process's allocated bytes, `held` among them
    ooms = [e for e in snap["device_traces"][0] if e["action"] == "oom"]
    assert len(ooms) == 1 and request <= ooms[0]["size"] < request + 2 * MiB  # rounded, as CUDA's
    assert ooms[0]["device_free"] == device_free and "addr" not in ooms[0]
    assert "raise OutOfMemoryError" in _memory_viz.trace(snap)
    del held


@simdev_capacity
def test_an_observer_that_raises_does_not_lose_the_out_of_memory_error(monkeypatch):
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda args: reported.append(args.exc_value))

    armed = [True]  # observers stay attached: later tests' out-of-memory errors pass quietly

    def observer(*args):
        if armed[0]:
            raise RuntimeError("observer failed")

    MOD.memory._attach_out_of_memory_observer(observer)
    MOD.synchronize()
    MOD.empty_cache()  # the driver's free memory is then all there is
    free, _ = MOD.mem_get_info(0)
    held = torch.empty(free // 2, dtype=torch.uint8, device=DEV)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(free * 3 // 4, dtype=torch.uint8, device=DEV)
    finally:
        armed[0] = False
    assert any(str(e) == "observer failed" for e in reported)
    del held
    x = torch.ones(1000, device=DEV)  # still usable
    assert x.sum().item() == 1000


# ---------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize("kwargs, named", [
    (dict(enabled="sometimes"), "enabled='sometimes'"),
    (dict(context="frames"), "context='frames'"),
    (dict(stacks="cpp"), "stacks='cpp'"),
    (dict(max_entries=-1), "max_entries=-1"),
    (dict(max_entries="10"), "max_entries='10'"),
    (dict(skip_actions=["allocate"]), "'allocate'"),
    (dict(skip_actions="alloc"), "skip_actions='alloc'"),
    (dict(compile_context=True), "compile_context=True"),
])
def test_bad_arguments_are_value_errors_naming_them(kwargs, named):
    with pytest.raises(ValueError, match=re.escape(named)) as error:
        MOD.memory._record_memory_history(**kwargs)
    assert str(error.value).startswith(f"{DEV}: _record_memory_history")
    with pytest.raises(ValueError):  # the legacy form checks its arguments too
        MOD.memory._record_memory_history(True, trace_alloc_max_entries=-5)
    x = torch.empty(MiB + 4096, dtype=torch.uint8, device=DEV)  # nothing recorded
    assert _block(MOD.memory._snapshot(), x.data_ptr())[1]["frames"] == []


def test_bad_devices_and_observers_are_refused():
    with pytest.raises(IndexError, match=DEV):
        MOD.memory._record_memory_history(device=MOD.device_count() + 3)
    with pytest.raises(ValueError, match="cpu"):
        MOD.memory._snapshot(device="cpu")
    with pytest.raises(TypeError, match=f"{DEV}: _attach_out_of_memory_observer"):
        MOD.memory._attach_out_of_memory_observer(5)
    with pytest.warns(FutureWarning), pytest.raises(TypeError, match=DEV):
        MOD.memory._set_allocator_settings(64)


def test_set_allocator_settings_applies_as_pytorchs_function():
    code = renamed("""
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.simdev.memory._set_allocator_settings("garbage_collection_threshold:0.8")
        assert any(issubclass(w.category, FutureWarning) for w in caught)
        assert torch._C._accelerator_getAllocatorSettings() == "garbage_collection_threshold:0.8"
        settings = torch.simdev.memory._snapshot()["allocator_settings"]
        assert settings["PYTORCH_ALLOC_CONF"] == "garbage_collection_threshold:0.8", settings
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", renamed("import torch, torch_simdev\n")
                          + textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr
