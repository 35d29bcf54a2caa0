"""A picture of a backend's device memory drawn by PyTorch's own visualizer.

Records the allocator's history (torch.<name>.memory._record_memory_history) over a few
training steps of a small language model whose batches are copied in on a side stream
(record_stream: their frees wait behind the compute stream), takes the snapshot before the
last step's work has finished, and writes into OUT what torch/cuda/_memory_viz.py makes of it:

  segsum.txt         the segments, one bar per segment (one character per 20 MiB page), the picture
  trace.txt          the recorded events, as `python -m torch.cuda._memory_viz trace` prints them
  memory.txt         the flamegraph input of the memory view (bytes by stack), without flamegraph.pl
  snapshot.pickle    the snapshot (_dump_snapshot's file): open it on pytorch.org/memory_viz
  trace_plot.html    the memory-over-time page, segment_plot.html the allocator-state page
                     (both load MemoryViz.js from the web when opened in a browser)

    SIMDEV_MEMORY_MB=512 PYTHONPATH=build/python python scripts/memory_viz.py build/memory_viz

tests/python/test_memory_viz.py runs it (the test command writes build/memory_viz);
docs/memory.md shows its segsum.txt.
"""
import argparse
import importlib
import os
import pickle
import sys

import torch
from torch.cuda import _memory_viz


def language_model(vocab=16000, width=512, hidden=2048):
    return torch.nn.ModuleDict({
        "embed": torch.nn.Embedding(vocab, width),
        "mlp": torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.GELU(),
                                   torch.nn.Linear(hidden, width)),
        "head": torch.nn.Linear(width, vocab, bias=False),
    })


def train_step(model, optimizer, tokens):
    x = model["embed"](tokens[:, :-1])
    logits = model["head"](x + model["mlp"](x))
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def workload(dev, mod, steps=3, batch=4, length=129, vocab=16000):
    """The steps; returns the snapshot taken before the last step's work is done."""
    torch.manual_seed(0)
    model = language_model(vocab).to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = mod.Stream()
    compute = mod.current_stream()
    for _ in range(steps):
        with mod.stream(loader):  # the next batch comes in on the loader's stream
            tokens = torch.randint(vocab, (batch, length)).pin_memory().to(dev, non_blocking=True)
        compute.wait_stream(loader)
        tokens.record_stream(compute)  # its free waits for the compute stream's use
        train_step(model, optimizer, tokens)
        del tokens
    snapshot = mod.memory._snapshot()
    mod.synchronize()
    return snapshot


def write(snapshot, out):
    os.makedirs(out, exist_ok=True)
    views = {
        "segsum.txt": _memory_viz.segsum(snapshot),
        "trace.txt": _memory_viz.trace(snapshot),
        "memory.txt": _memory_viz.memory(snapshot, format_flamegraph=lambda lines: lines),
        "trace_plot.html": _memory_viz.trace_plot(snapshot),
        "segment_plot.html": _memory_viz.segment_plot(snapshot),
    }
    for name, text in views.items():
        tmp = os.path.join(out, f".{name}.{os.getpid()}")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out, name))  # whole files, if two runs write at once
    tmp = os.path.join(out, f".snapshot.pickle.{os.getpid()}")
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f)
    os.replace(tmp, os.path.join(out, "snapshot.pickle"))
    return views


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="folder to write the views into")
    parser.add_argument("--backend", default="simdev", help="the device type (torch_<backend>)")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    importlib.import_module(f"torch_{args.backend}")
    mod = getattr(torch, args.backend)
    mod.memory._record_memory_history(max_entries=100000, stacks="python")
    snapshot = workload(args.backend, mod, steps=args.steps)
    mod.memory._record_memory_history(None)
    views = write(snapshot, args.out)
    sys.stdout.write(views["segsum.txt"])


if __name__ == "__main__":
    main()
