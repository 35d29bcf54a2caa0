"""The picture of simdev's memory that docs/memory.md shows: scripts/memory_viz.py run as the
docs say, drawn by PyTorch's torch/cuda/_memory_viz.py, written into the build tree
(<build>/memory_viz: segsum.txt, trace.txt, memory.txt, snapshot.pickle, trace_plot.html,
segment_plot.html; ACCELKIT_MEMORY_VIZ_DIR elsewhere)."""
import os
import pathlib
import pickle
import re
import subprocess
import sys

from torch.cuda import _memory_viz

from backend import ENV, PACKAGE, simdev_only

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _out_dir(tmp_path):
    if os.environ.get("ACCELKIT_MEMORY_VIZ_DIR"):
        return pathlib.Path(os.environ["ACCELKIT_MEMORY_VIZ_DIR"])
    build = pathlib.Path(PACKAGE.__file__).resolve().parents[2]  # <build>/python/torch_simdev
    if (build / "CMakeCache.txt").exists():
        return build / "memory_viz"
    return tmp_path / "memory_viz"


@simdev_only  # the picture is simdev's, sized for its capacity
def test_the_test_command_draws_simdevs_memory_with_pytorchs_visualizer(tmp_path):
    out = _out_dir(tmp_path)
    env = {**os.environ, f"{ENV}MEMORY_MB": "512", "OMP_NUM_THREADS": "1"}
    for knob in ("VISIBLE_DEVICES", "ALLOC_CONF", "INJECT_FAULT"):
        env.pop(f"{ENV}{knob}", None)
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "memory_viz.py"), str(out)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    segsum = (out / "segsum.txt").read_text()
    assert run.stdout == segsum
    # The picture: one bar per segment of 20 MiB or more (the model's 32 MiB embedding and
    # head, their gradients and momentum), then the totals.
    bars = re.findall(r"^\[([a-z0-9* ]+)\] (\d+\.\dMiB) allocated, .* free", segsum, re.M)
    assert len(bars) >= 6 and ("aa", "32.0MiB") in bars, segsum
    assert re.search(r"^total_reserved: \d+\.\dMiB$", segsum, re.M)
    with open(out / "snapshot.pickle", "rb") as f:
        snapshot = pickle.load(f)
    assert _memory_viz.segsum(snapshot) == segsum
    # The history: the steps' allocations, the loader's batches freed behind the compute
    # stream (requested, then completed), each with the script's frames.
    trace = (out / "trace.txt").read_text()
    assert trace.startswith("Device 0 ----------------")
    assert "del " in trace and "# free completed for " in trace and "cudaMalloc(" in trace
    events = snapshot["device_traces"][0]
    assert any(e["action"] == "free_requested" for e in events)
    memory = (out / "memory.txt").read_text()
    assert re.search(r"memory_viz\.py:\d+:train_step", memory), memory[:2000]
    assert re.search(r"memory_viz\.py:\d+:workload", memory)
    for page in ("trace_plot.html", "segment_plot.html"):
        assert "MemoryViz.js" in (out / page).read_text()
