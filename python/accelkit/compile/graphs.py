"""torch.compile(mode="reduce-overhead") on the installed backend: the
compiled graphs are captured into the backend's graphs and replayed, through
Inductor's graph policy (Note [Graphs under torch.compile])."""
import threading
import warnings

import torch

from .. import _backend

# Note [Graphs under torch.compile]
# Problem: mode="reduce-overhead" turns on Inductor's CUDA graphs
# (config.triton.cudagraphs), but both of Inductor's implementations
# (cudagraph_trees and compile_fx.cudagraphify_impl) call torch.cuda, and
# the lowering refuses every device but "cuda" ("skipping cudagraphs due to
# multiple devices"). PyTorch 2.13's one device-generic entry is
# torch._inductor.config.cudagraph_policy (a CUDAGraphPolicy): Inductor
# hands every compiled graph to the policy's wrap_output, whatever the
# device and whether its own checks refused graphs.
# Decision: install() sets that policy (unless one is set already, or CUDA
# is available, whose graphs the policy would route differently) to
# GraphPolicy, which leaves other devices' graphs to Inductor and, while
# config.triton.cudagraphs is on, wraps a compiled graph of this backend
# alone: its first call copies the inputs that are not parameters into
# static inputs, runs once on a side stream, captures a run into a Graph
# and replays it; later calls copy the inputs in and replay. Outputs are
# copied out of the graph's pool at each call (one device copy each), so
# that a caller may keep them across calls, as eager outputs. A graph that
# cannot be captured (kernels that run on the host: the default C++ code
# generator on host-visible memory; non-tensor or self-overlapping inputs;
# mutated inputs) runs as compiled, with one warning naming the reason.
# Limits: no trees: each compiled graph (a forward, a backward) has its own
# graph and pool, per thread; the first call of a thread runs the compiled
# code twice (warm-up, then capture), the RNG state restored after.

_SKIP = "skipping {name} graphs: {why}"


class _Captured:
    """One thread's capture of a compiled graph: its static inputs, the graph
    and the outputs the graph writes."""

    def __init__(self, static_inputs, copy, graph, outputs):
        self.static_inputs, self.copy, self.graph, self.outputs = static_inputs, copy, graph, outputs


class _Graphed:
    """A compiled graph's callable, captured at a thread's first call and
    replayed at its next ones (each thread its own capture, as Inductor's
    graphs are per thread)."""

    def __init__(self, model, static_input_idxs, mutated, device):
        self.model, self.static, self.device = model, frozenset(static_input_idxs), device
        self.refusal = (f"it mutates its inputs {sorted(set(mutated) - self.static)}"
                        if set(mutated) - self.static else None)
        self.local = threading.local()

    def _skip(self, why):
        self.refusal = why
        from torch._dynamo.utils import counters
        counters["inductor"]["cudagraph_skips"] += 1
        warnings.warn(_SKIP.format(name=_backend.name, why=why), stacklevel=4)

    def _record(self, inputs):
        mod = getattr(torch, _backend.name)
        for i, x in enumerate(inputs):
            if not isinstance(x, torch.Tensor):
                return self._skip(f"a non-tensor input ({type(x).__name__} at {i})")
            if i not in self.static and torch._debug_has_internal_overlap(x) != 0:
                return self._skip(f"input {i} overlaps itself (an expanded tensor)")
        static = [x if i in self.static else
                  torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device)
                  for i, x in enumerate(inputs)]
        copy = [i for i in range(len(static)) if i not in self.static]
        for i in copy:
            static[i].copy_(inputs[i])
        torch.accelerator.synchronize(self.device)
        side = mod.Stream(self.device)
        side.wait_stream(mod.current_stream(self.device))
        with mod.stream(side):
            self.model(list(static))  # warm-up: lazy initialization is not captured
        torch.accelerator.synchronize(self.device)
        try:
            graph = mod.Graph()
            with mod.graph(graph, stream=side, capture_error_mode="thread_local"):
                outputs = self.model(list(static))
        except (RuntimeError, NotImplementedError) as e:
            return self._skip(f"the compiled code cannot be captured: {e}")
        self.local.captured = _Captured(static, copy, graph, outputs)

    def __call__(self, inputs):
        captured = getattr(self.local, "captured", None)
        if captured is None and self.refusal is None:
            from torch._dynamo.utils import preserve_rng_state
            with preserve_rng_state(), getattr(torch, _backend.name).device(self.device):
                self._record(inputs)
            captured = getattr(self.local, "captured", None)
        if captured is None:
            return self.model(inputs)
        for i in captured.copy:
            if captured.static_inputs[i].data_ptr() != inputs[i].data_ptr():
                captured.static_inputs[i].copy_(inputs[i])
        inputs.clear()  # the boxed convention: the callee owns the list
        captured.graph.replay()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in captured.outputs]


_policy = None


def graph_policy():
    """The Inductor graph policy of the installed backend (Note [Graphs under
    torch.compile]): set it as torch._inductor.config.cudagraph_policy where
    install() did not (a process with CUDA, or another policy set)."""
    global _policy
    if _policy is not None:
        return _policy
    from torch._inductor import config
    from torch._inductor.cudagraph_utils import CUDAGraphPolicy
    from torch._inductor.output_code import CompiledFxGraph

    class GraphPolicy(CUDAGraphPolicy):
        def wrap_output(self, output_code):
            output_code = super().wrap_output(output_code)
            if (not config.triton.cudagraphs or not isinstance(output_code, CompiledFxGraph)
                    or set(output_code.device_types) != {_backend.name}
                    or output_code.current_callable is None
                    or isinstance(output_code.current_callable, _Graphed)):
                return output_code
            kwargs = output_code.fx_kwargs or {}
            output_code.current_callable = _Graphed(
                output_code.current_callable, kwargs.get("static_input_idxs") or (),
                getattr(output_code, "mutated_input_idxs", ()) or (),
                next(iter(output_code.device_idxs), 0))
            return output_code

    GraphPolicy.__name__ = GraphPolicy.__qualname__ = f"{_backend.name.capitalize()}GraphPolicy"
    _policy = GraphPolicy()
    return _policy


def _install():
    """Sets the policy where nothing else claims Inductor's slot (called when
    Inductor is imported: registration)."""
    from torch._inductor import config
    if config.cudagraph_policy is None and not torch.cuda.is_available():
        config.cudagraph_policy = graph_policy()
