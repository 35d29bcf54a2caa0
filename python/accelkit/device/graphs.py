"""torch.<name>.graphs: capture of a stream's work into a graph and its
replay, with torch.cuda.graphs' names and semantics (docs/graphs.md).

The graph object is PyTorch's own (torch._C._acceleratorGraph, over the
GraphImplInterface that the SDK registers for the backend); the queries
and pool handles are the backend's operators. make_graphed_callables is
written here, on top of Graph (Note [Graphed callables]).
"""
import gc
import threading

import torch
import torch.utils._pytree as pytree

from .. import _backend
from .streams import Stream, current_stream, stream as _stream_context

__all__ = ["Graph", "CUDAGraph", "graph", "graph_pool_handle", "is_current_stream_capturing",
           "make_graphed_callables"]

_MODES = ("default", "global", "thread_local", "relaxed")


def _mode(capture_error_mode) -> str:
    if capture_error_mode not in _MODES:
        raise ValueError(f"{_backend.name}: capture_error_mode must be one of "
                         f"{', '.join(map(repr, _MODES))}, got {capture_error_mode!r}")
    return capture_error_mode


def _pool(pool):
    """A pool handle as the graph binding takes it: None or a pair of ints."""
    if pool is None:
        return None
    try:
        first, second = (int(p) for p in pool)
    except (TypeError, ValueError):
        raise ValueError(f"{_backend.name}: a memory pool handle is a pair of ints (from "
                         f"graph_pool_handle(), Graph.pool() or MemPool.id), got {pool!r}") from None
    return (first, second)


def is_current_stream_capturing() -> bool:
    """Whether a capture is underway on the current stream of the current
    device. False, without initializing anything, before the backend is
    initialized."""
    if not _backend.ops.is_initialized():
        return False
    return _backend.ops.is_stream_capturing(torch.accelerator.current_stream())


def graph_pool_handle() -> tuple:
    """A new memory pool handle for graphs: pass it as `pool` to several
    captures so that they share one private pool (docs/graphs.md, Pools)."""
    return tuple(_backend.ops.new_mempool_id(False))


class Graph(torch._C._acceleratorGraph):
    """A graph of the backend: what one stream queued between capture_begin
    and capture_end, replayed with replay() (torch.cuda.CUDAGraph's API;
    torch.<name>.CUDAGraph is this class). The memory the captured work
    allocates comes from the graph's private pool, held until reset() or
    the object's destruction, which first waits for the replays queued.

    `keep_graph`: False instantiates at capture_end; True keeps the
    captured graph and instantiates on instantiate() or the first replay."""

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls, keep_graph)

    def capture_begin(self, pool=None, capture_error_mode: str = "global") -> None:
        """Begins capturing the current stream (not the default stream). The
        allocations of that stream come from `pool` (a handle of
        graph_pool_handle(), another graph's pool() or a MemPool's id:
        shared) or from a new private pool. `capture_error_mode`: "global"
        refuses unsafe calls (synchronous copies, event queries) of every
        thread while the capture lasts, "thread_local" those of this thread,
        "relaxed" none but those that touch the capturing stream."""
        super().capture_begin(pool=_pool(pool), capture_error_mode=_mode(capture_error_mode))

    def capture_end(self) -> None:
        """Ends the capture begun on the current stream. A RuntimeError naming
        the call if the capture was invalidated (the stream is usable after)."""
        super().capture_end()

    def instantiate(self) -> None:
        """Makes the captured graph launchable (capture_end does it unless
        keep_graph)."""
        super().instantiate()

    def replay(self) -> None:
        """Queues the captured work on the current stream; it reads the
        memory it captured at the time it runs."""
        super().replay()

    def reset(self) -> None:
        """Waits for the queued replays, then destroys the graph and gives its
        pool back (the pool lives on while another graph or MemPool uses it)."""
        super().reset()

    def pool(self) -> tuple:
        """The handle of this graph's memory pool, for another capture to share."""
        return tuple(super().pool())

    def enable_debug_mode(self) -> None:
        """Makes the next capture record what debug_dump writes."""
        super().enable_debug_mode()

    def debug_dump(self, debug_path: str) -> None:
        """Writes what the SDK knows of the graph (device, stream, pool, mode,
        captured operators, replays) to `debug_path` as text."""
        super().debug_dump(debug_path)


CUDAGraph = Graph  # the name ported scripts use

_capture_streams = {}  # device index -> the side stream graph() captures on by default
_capture_streams_lock = threading.Lock()


def _default_capture_stream(device: int) -> Stream:
    with _capture_streams_lock:
        s = _capture_streams.get(device)
        if s is None:
            s = _capture_streams[device] = Stream(device)
        return s


class graph:  # noqa: N801 (torch.cuda.graph)
    """``with torch.<name>.graph(g):`` captures the block's work on the
    current device into `g` (a Graph). It synchronizes the device and empties
    the caches first, then captures on `stream` (default: a side stream of
    the device's own, the same for every capture) made current for the
    block. `pool` and `capture_error_mode` as Graph.capture_begin.

    If the block raises, the capture is ended and `g` reset (its pool given
    back), and the block's exception propagates; the stream is usable."""

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode: str = "global",
                 enable_annotations: bool = False, check_input_liveness: bool = False):
        if enable_annotations or check_input_liveness:
            what = "enable_annotations" if enable_annotations else "check_input_liveness"
            raise NotImplementedError(f"{_backend.name}: graph({what}=True) is CUDA's own "
                                      "(kernel annotations and input liveness tracking)")
        if not isinstance(cuda_graph, torch._C._acceleratorGraph):
            raise TypeError(f"{_backend.name}: graph() takes a torch.{_backend.name}.Graph, got "
                            f"{type(cuda_graph).__name__}")
        self.cuda_graph = cuda_graph
        self.pool = _pool(pool)
        self.capture_error_mode = _mode(capture_error_mode)
        self.capture_stream = stream if stream is not None else _default_capture_stream(
            torch.accelerator.current_device_index())
        self.stream_ctx = _stream_context(self.capture_stream)

    def __enter__(self):
        torch.accelerator.synchronize()
        if torch.compiler.config.force_cudagraph_gc:
            gc.collect()
        torch.accelerator.empty_cache()
        _backend.ops.host_empty_cache()
        self.stream_ctx.__enter__()
        try:
            # The binding's own capture_begin, which every graph class has
            # (torch.accelerator.Graph's takes no arguments: its pool, if
            # given at construction, is used where this context has none).
            pool = self.pool if self.pool is not None else _pool(
                getattr(self.cuda_graph, "graph_pool", None))
            torch._C._acceleratorGraph.capture_begin(
                self.cuda_graph, pool=pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise
        return self.cuda_graph

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.cuda_graph.capture_end()
                return False
            try:  # the block's exception is the one to see; the stream must stop capturing
                self.cuda_graph.capture_end()
            except Exception as end_error:  # an invalidated capture
                if hasattr(exc, "add_note"):
                    exc.add_note(f"{_backend.name}: the capture ended with: {end_error}")
            try:
                self.cuda_graph.reset()  # a partial capture is of no use: its pool goes back
            except Exception:
                pass
            return False
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)


# Note [Graphed callables]
# Problem: a training step cannot be one graph when the loss, the optimizer
# or the data pipeline do what a capture refuses; but the forward and
# backward of a module can each be a graph, replayed inside autograd.
# Decision: make_graphed_callables runs each callable (and its backward,
# through torch.autograd.grad) num_warmup_iters times on a side stream, so
# that lazy initialization is not captured; then captures all forwards in
# order and all backwards in reverse order, into one pool (the order they
# will replay in, so that no replay overwrites memory another still
# needs). Each callable becomes an autograd.Function whose forward copies
# new inputs into the captured ones (unless they are the same tensors) and
# replays the forward graph, and whose backward copies the incoming
# gradients likewise and replays the backward graph. The inputs of the
# graph are the callable's tensor arguments and, for a module, its
# parameters, which are read in place (an optimizer that updates them in
# place is seen by the next replay). The outputs and the gradients handed
# back are copies of the graph's (one device copy each), where torch.cuda
# hands out the graph's own tensors: a parameter's .grad would otherwise
# be the graph's memory (so zero_grad(set_to_none=False) followed by a
# replay doubles it), and an output kept across two calls would change
# under the caller.
# Limits: as torch.cuda's: a call's backward must run before the next call
# (the backward graph reads what the forward's replay left in the pool);
# arguments are tensors only, in the layout of the sample; a function's
# tensors that need gradients must be its arguments (a module's parameters
# are taken); no double backward; module hooks present at capture are
# refused; buffers must not require grad; a module whose training flag
# differs from the one at capture runs its original forward; autocast only
# with its cache off.


class _Captured:
    """One callable's forward and backward graphs and the static tensors they
    read and write."""

    def __init__(self, fn, args, index):
        self.fn = fn
        self.args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        self.flat_args = tuple(pytree.arg_tree_leaves(*self.args))
        where = f"make_graphed_callables: callable {index}"
        if not all(isinstance(a, torch.Tensor) for a in self.flat_args):
            raise TypeError(f"{_backend.name}: {where}: sample_args must hold tensors only, got "
                            f"{[type(a).__name__ for a in self.flat_args]}")
        if isinstance(fn, torch.nn.Module):
            if fn._backward_hooks or fn._forward_hooks or fn._forward_pre_hooks:
                raise ValueError(f"{_backend.name}: {where} has module hooks; register them "
                                 "after make_graphed_callables")
            if any(b.requires_grad for b in fn.buffers()):
                raise ValueError(f"{_backend.name}: {where} has a buffer that requires grad; "
                                 "only parameters may be trained through a graph")
            self.params = tuple(fn.parameters())
        else:
            self.params = ()
        self.surface = self.flat_args + self.params  # what the graphs read
        self.fwd, self.bwd = Graph(), Graph()
        self.has_backward = False

    def _wrt(self):
        return tuple(t for t in self.surface if t.requires_grad)

    def warm_up(self, allow_unused):
        outputs = [o for o in pytree.tree_leaves(self.fn(*self.args)) if isinstance(o, torch.Tensor)]
        diff = [o for o in outputs if o.requires_grad]
        if diff and self._wrt():
            torch.autograd.grad(diff, self._wrt(), grad_outputs=[torch.empty_like(o) for o in diff],
                                only_inputs=True, allow_unused=allow_unused)

    def capture_forward(self, pool, capture_stream):
        with graph(self.fwd, pool=pool, stream=capture_stream):
            out = self.fn(*self.args)
        flat, self.out_spec = pytree.tree_flatten(out)
        if not all(isinstance(o, torch.Tensor) for o in flat):
            raise TypeError(f"{_backend.name}: make_graphed_callables: a graphed callable must "
                            f"return tensors only, got {[type(o).__name__ for o in flat]}")
        self.static_outputs = tuple(flat)

    def capture_backward(self, pool, capture_stream, allow_unused):
        self.static_grad_outputs = tuple(torch.empty_like(o) if o.requires_grad else None
                                         for o in self.static_outputs)
        diff = [o for o in self.static_outputs if o.requires_grad]
        grads = iter(())
        if diff and self._wrt():
            with graph(self.bwd, pool=pool, stream=capture_stream):
                grads = iter(torch.autograd.grad(
                    diff, self._wrt(),
                    grad_outputs=[g for g in self.static_grad_outputs if g is not None],
                    only_inputs=True, allow_unused=allow_unused))
            self.has_backward = True
        self.static_grad_inputs = tuple(next(grads) if t.requires_grad and self.has_backward
                                        else None for t in self.surface)
        # The captured autograd graph is of no further use: held, it would keep the
        # parameters' AccumulateGrad nodes of the capture stream alive.
        self.differentiable = tuple(o.requires_grad for o in self.static_outputs)
        self.static_outputs = tuple(o.detach() for o in self.static_outputs)

    def load_inputs(self, inputs):
        for static, new in zip(self.flat_args, inputs):
            if static.data_ptr() != new.data_ptr():
                static.copy_(new)

    def load_grads(self, grads):
        for static, g in zip(self.static_grad_outputs, grads):
            if static is not None and g is not None and static.data_ptr() != g.data_ptr():
                static.copy_(g)

    def function(self):
        captured = self

        def graphed(*user_args):
            flat = tuple(pytree.arg_tree_leaves(*user_args))
            if len(flat) != len(captured.flat_args):
                raise TypeError(f"{_backend.name}: a graphed callable takes its sample_args' "
                                f"layout: {len(captured.flat_args)} tensors, got {len(flat)}")
            out = _Replay.apply(captured, *flat, *captured.params)
            return pytree.tree_unflatten(list(out), captured.out_spec)

        return graphed


class _Replay(torch.autograd.Function):
    """The autograd node of a graphed callable (Note [Graphed callables])."""

    @staticmethod
    def forward(ctx, captured, *inputs):
        ctx.captured = captured
        captured.load_inputs(inputs[:len(captured.flat_args)])
        captured.fwd.replay()
        outputs = tuple(o.clone() for o in captured.static_outputs)
        ctx.mark_non_differentiable(*(o for o, d in zip(outputs, captured.differentiable)
                                      if not d))
        return outputs

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        captured = ctx.captured
        if captured.has_backward:
            captured.load_grads(grads)
            captured.bwd.replay()
        return (None,) + tuple(None if g is None else g.clone()
                               for g in captured.static_grad_inputs)


def _graphed_module(module, graphed):
    training, original = module.training, module.forward

    def forward(*args, **kwargs):
        if module.training != training:
            return original(*args, **kwargs)
        if kwargs:
            raise TypeError(f"{_backend.name}: a graphed module takes its sample_args' "
                            f"positional layout, got keyword arguments {sorted(kwargs)}")
        return graphed(*args)

    module.forward = forward
    return module


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3,
                           allow_unused_input: bool = False, pool=None):
    """Graphed versions of `callables` (a module or function, or a tuple of
    them in the order they run) for use in an autograd training loop: each
    call replays the forward graph, and its backward replays the backward
    graph (Note [Graphed callables]). `sample_args`: a tuple of tensors per
    callable (a tuple of such tuples for a tuple of callables), with the
    requires_grad of the real inputs. All captures share one pool: `pool`,
    or a new one. A module is returned with its forward replaced; a
    function by a new function."""
    name = _backend.name
    if torch.is_autocast_enabled(name) and torch.is_autocast_cache_enabled():
        raise RuntimeError(f"{name}: make_graphed_callables needs autocast's cache off "
                           f"(torch.autocast('{name}', cache_enabled=False))")
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if len(callables) != len(sample_args):
        raise ValueError(f"{name}: make_graphed_callables got {len(callables)} callables and "
                         f"{len(sample_args)} sample_args")
    captured = [_Captured(fn, args, i) for i, (fn, args) in enumerate(zip(callables, sample_args))]
    pool = graph_pool_handle() if pool is None else _pool(pool)
    device = torch.accelerator.current_device_index()

    torch.accelerator.synchronize(device)
    side = Stream(device)
    side.wait_stream(current_stream(device))
    with _stream_context(side):
        for c in captured:
            for _ in range(num_warmup_iters):
                c.warm_up(allow_unused_input)
    torch.accelerator.synchronize(device)

    capture_stream = _default_capture_stream(device)
    for c in captured:
        c.capture_forward(pool, capture_stream)
    for c in reversed(captured):
        c.capture_backward(pool, capture_stream, allow_unused_input)

    graphed = []
    for fn, c in zip(callables, captured):
        f = c.function()
        graphed.append(_graphed_module(fn, f) if isinstance(fn, torch.nn.Module) else f)
    return graphed[0] if single else tuple(graphed)
