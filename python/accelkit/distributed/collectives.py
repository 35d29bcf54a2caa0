"""The process group's collectives: each checks its arguments, joins the
ranks' agreement, chooses the vendor's library or gloo, and issues the
collective on the CPU tensors staging gives it (Note [Collectives on gloo],
Note [The vendor collective slot])."""
import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from .agreement import _collective, _op_name
from .staging import _Host
from .work import _all_of


class _Collectives:
    """c10d's collectives of the process group (a mixin of ProcessGroup,
    whose _checked, _agree, _launch and _native_for they call)."""

    @_collective
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        op = opts.reduceOp
        host, gloo_op = self._checked("all_reduce", tensors[0], lambda: (
            _Host(self, tensors, tensors, "all_reduce"), self._reduce_op(op, tensors)), op=op)
        for t in tensors[1:]:
            self._agree("all_reduce", t, op=op)
        cpu = [host.get(t) for t in tensors]
        native = self._native_for("all_reduce", _op_name(op), tensors[0].dtype) \
            if len(tensors) == 1 else None
        if native is not None:
            return self._launch(host, tensors, native=native.call(
                "all_reduce", cpu, self._tls.seq, cpu[0], _op_name(op),
                timeout_s=self._timeout(opts)))
        o = dist.AllreduceOptions()
        o.reduceOp = gloo_op
        o.timeout = opts.timeout
        gloo = self.gloo
        post = self._avg(cpu) if op == ReduceOp.AVG else None
        return self._launch(host, tensors, what="all_reduce",
                            gloo=lambda: gloo.allreduce(cpu, o), post=post)

    def allreduce_coalesced(self, tensors, opts=None):
        works = [self.allreduce([t], _allreduce_opts(opts)) for t in tensors]
        return _all_of(works, tensors)._bind(works[0]._device if works else None,
                                             self._failures, stream_wait=self.stream_wait)

    @_collective
    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        host = self._checked("broadcast", tensors[0], lambda: _Host(
            self, tensors, tensors if opts.rootRank != self._rank else (), "broadcast"),
            root=opts.rootRank)
        for t in tensors[1:]:
            self._agree("broadcast", t, root=opts.rootRank)
        root = opts.rootRank == self._rank
        cpu = [host.get(t, read=root, write=not root) for t in tensors]
        native = self._native_for("broadcast", "", tensors[0].dtype) if len(tensors) == 1 else None
        if native is not None:
            return self._launch(host, tensors, native=native.call(
                "broadcast", cpu, self._tls.seq, cpu[0], opts.rootRank,
                timeout_s=self._timeout(opts)))
        gloo = self.gloo
        return self._launch(host, tensors, what="broadcast", gloo=lambda: gloo.broadcast(cpu, opts))

    @_collective
    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        op = opts.reduceOp
        host, gloo_op = self._checked("reduce", tensors[0], lambda: (
            _Host(self, tensors, tensors if opts.rootRank == self._rank else (), "reduce"),
            self._reduce_op(op, tensors)), op=op, root=opts.rootRank)
        for t in tensors[1:]:
            self._agree("reduce", t, op=op, root=opts.rootRank)
        root = opts.rootRank == self._rank
        cpu = [host.get(t, write=root) for t in tensors]
        native = self._native_for("reduce", _op_name(op), tensors[0].dtype) \
            if len(tensors) == 1 else None
        if native is not None:
            return self._launch(host, tensors, native=native.call(
                "reduce", cpu, self._tls.seq, cpu[0], opts.rootRank, _op_name(op),
                timeout_s=self._timeout(opts)))
        o = dist.ReduceOptions()
        o.reduceOp, o.rootRank, o.rootTensor, o.timeout = gloo_op, opts.rootRank, opts.rootTensor, opts.timeout
        gloo = self.gloo
        post = self._avg(cpu) if op == ReduceOp.AVG and root else None
        return self._launch(host, tensors, what="reduce",
                            gloo=lambda: gloo.reduce(cpu, o), post=post)

    @_collective
    def allgather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()

        def check():
            outs = [t for ts in output_lists for t in ts]
            host = _Host(self, list(inputs) + outs, outs, "all_gather")
            for ts, t in zip(output_lists, inputs):
                if len(ts) != self._size or any(o.numel() != t.numel() or o.dtype != t.dtype
                                                for o in ts):
                    raise ValueError(
                        f"{self.name}: all_gather: the output list has "
                        f"{[(o.dtype, o.numel()) for o in ts]}, expected {self._size} tensors "
                        f"of {t.dtype} x {t.numel()}")
            return host
        host = self._checked("all_gather", inputs[0], check)
        for t in inputs[1:]:
            self._agree("all_gather", t)
        cpu_in = [host.get(t, write=False) for t in inputs]
        cpu_out = [[host.get(t, read=False) for t in ts] for ts in output_lists]
        native = self._native_for("all_gather", "", inputs[0].dtype) if len(inputs) == 1 else None
        if native is not None:
            # The library gathers into one tensor; the list's tensors from it.
            flat = torch.empty(self._size * inputs[0].numel(), dtype=inputs[0].dtype)
            host.cpu.append(flat)
            outs, n = cpu_out[0], inputs[0].numel()

            def split():
                for r, o in enumerate(outs):
                    o.copy_(flat[r * n:(r + 1) * n].view(o.shape))
            return self._launch(host, output_lists, native=native.call(
                "all_gather", [flat], self._tls.seq, flat, cpu_in[0],
                timeout_s=self._timeout(opts)), post=split)
        gloo = self.gloo
        return self._launch(host, output_lists, what="all_gather",
                            gloo=lambda: gloo.allgather(cpu_out, cpu_in, opts))

    @_collective
    def _allgather_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()

        def check():
            host = _Host(self, [output, input], [output], "all_gather_into_tensor")
            if output.numel() != input.numel() * self._size:
                raise ValueError(f"{self.name}: all_gather_into_tensor: the output has "
                                 f"{output.numel()} elements, expected {input.numel()} x "
                                 f"{self._size} ranks")
            if output.dtype != input.dtype:
                raise ValueError(f"{self.name}: all_gather_into_tensor: the output is "
                                 f"{output.dtype}, the input {input.dtype}")
            return host
        host = self._checked("all_gather_into_tensor", input, check)
        cpu_in = host.get(input, write=False)
        cpu_out = host.get(output, read=False)
        native = self._native_for("all_gather", "", input.dtype)
        if native is not None:
            return self._launch(host, [output], native=native.call(
                "all_gather", [cpu_out], self._tls.seq, cpu_out, cpu_in,
                timeout_s=self._timeout(opts)))
        gloo = self.gloo
        return self._launch(host, [output], what="all_gather_into_tensor",
                            gloo=lambda: gloo._allgather_base(cpu_out, cpu_in, opts))

    all_gather_single = _allgather_base

    @_collective
    def reduce_scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = opts.reduceOp
        host, gloo_op = self._checked("reduce_scatter", outputs[0], lambda: (
            _Host(self, list(outputs) + [t for ts in input_lists for t in ts], outputs,
                  "reduce_scatter"),
            self._reduce_op(op, list(outputs))), op=op)
        cpu_out = [host.get(t, read=False) for t in outputs]
        cpu_in = [[host.get(t, write=False) for t in ts] for ts in input_lists]
        o = dist.ReduceScatterOptions()
        o.reduceOp, o.timeout = gloo_op, opts.timeout
        gloo = self.gloo
        post = self._avg(cpu_out) if op == ReduceOp.AVG else None
        return self._launch(host, outputs, what="reduce_scatter",
                            gloo=lambda: gloo.reduce_scatter(cpu_out, cpu_in, o),
                            post=post)

    @_collective
    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        op = opts.reduceOp

        def check():
            host = _Host(self, [output, input], [output], "reduce_scatter_tensor")
            if input.numel() != output.numel() * self._size:
                raise ValueError(f"{self.name}: reduce_scatter_tensor: the input has "
                                 f"{input.numel()} elements, expected {output.numel()} x "
                                 f"{self._size} ranks")
            if output.dtype != input.dtype:
                raise ValueError(f"{self.name}: reduce_scatter_tensor: the output is "
                                 f"{output.dtype}, the input {input.dtype}")
            return host, self._reduce_op(op, [output])
        host, gloo_op = self._checked("reduce_scatter_tensor", input, check, op=op)
        cpu_out = host.get(output, read=False)
        cpu_in = host.get(input, write=False)
        native = self._native_for("reduce_scatter", _op_name(op), input.dtype)
        if native is not None:
            return self._launch(host, [output], native=native.call(
                "reduce_scatter", [cpu_out], self._tls.seq, cpu_out, cpu_in, _op_name(op),
                timeout_s=self._timeout(opts)))
        o = dist.ReduceScatterOptions()
        o.reduceOp, o.timeout = gloo_op, opts.timeout
        gloo = self.gloo
        post = self._avg([cpu_out]) if op == ReduceOp.AVG else None
        return self._launch(host, [output], what="reduce_scatter_tensor",
                            gloo=lambda: gloo._reduce_scatter_base(cpu_out, cpu_in, o),
                            post=post)

    reduce_scatter_single = _reduce_scatter_base

    @_collective
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        outs, ins = list(output_split_sizes), list(input_split_sizes)

        def elements(t, splits, which):
            """c10d's splits (rows of dim 0; even when not given) in
            elements, checked against the tensor."""
            rows = t.size(0) if t.dim() > 0 else 1
            row = t.numel() // rows if rows else 0
            if not splits:
                if rows % self._size:
                    raise ValueError(f"{self.name}: all_to_all_single: the {which}'s {rows} "
                                     f"rows do not split evenly between {self._size} ranks")
                splits = [rows // self._size] * self._size
            if len(splits) != self._size or sum(splits) != rows or min(splits) < 0:
                raise ValueError(f"{self.name}: all_to_all_single: {which} splits {splits} for "
                                 f"{self._size} ranks and {rows} rows")
            return [int(n) * row for n in splits]

        def check():
            host = _Host(self, [output, input], [output], "all_to_all_single")
            return host, elements(output, outs, "output"), elements(input, ins, "input")
        # The dtype (numel 0) and the splits, in elements.
        host, out_elems, in_elems = self._checked("all_to_all_single", input, check, numel=0,
                                                  splits=lambda r: r[1] + r[2])
        cpu_out = host.get(output, read=False)
        cpu_in = host.get(input, write=False)
        native = self._native_for("all_to_all", "", input.dtype)
        if native is not None:
            return self._launch(host, [output], native=native.call(
                "all_to_all", [cpu_out], self._tls.seq, cpu_out, cpu_in, out_elems, in_elems,
                timeout_s=self._timeout(opts)))
        gloo = self.gloo
        return self._launch(host, [output], what="all_to_all_single",
                            gloo=lambda: gloo.alltoall_base(
            cpu_out, cpu_in, outs, ins, opts))

    all_to_all_single = alltoall_base

    @_collective
    def gather(self, output_lists, inputs, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        self._unchecked()
        outs = [t for ts in output_lists for t in ts]
        host = _Host(self, list(inputs) + outs, outs, "gather")
        cpu_in = [host.get(t, write=False) for t in inputs]
        cpu_out = [[host.get(t, read=False) for t in ts] for ts in output_lists]
        gloo = self.gloo
        return self._launch(host, output_lists, what="gather",
                            gloo=lambda: gloo.gather(cpu_out, cpu_in, opts))

    @_collective
    def scatter(self, outputs, input_lists, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        self._unchecked()
        host = _Host(self, list(outputs) + [t for ts in input_lists for t in ts], outputs,
                     "scatter")
        cpu_out = [host.get(t, read=False) for t in outputs]
        cpu_in = [[host.get(t, write=False) for t in ts] for ts in input_lists]
        gloo = self.gloo
        return self._launch(host, outputs, what="scatter",
                            gloo=lambda: gloo.scatter(cpu_out, cpu_in, opts))

    @_collective
    def send(self, tensors, dst: int, tag: int = 0):
        self._unchecked(numbered=False)
        host = _Host(self, tensors)
        cpu = [host.get(t, write=False) for t in tensors]
        gloo = self.gloo
        return self._launch(host, tensors, what="send",
                            gloo=lambda: gloo.send(cpu, dst, tag), p2p=True)

    @_collective
    def recv(self, tensors, src: int, tag: int = 0):
        self._unchecked(numbered=False)
        host = _Host(self, tensors, tensors, "recv")
        cpu = [host.get(t, read=False) for t in tensors]
        gloo = self.gloo
        return self._launch(host, tensors, what="recv",
                            gloo=lambda: gloo.recv(cpu, src, tag), p2p=True,
                            writes=True)

    @_collective
    def recv_anysource(self, tensors, tag: int = 0):
        self._unchecked(numbered=False)
        host = _Host(self, tensors, tensors, "recv")
        cpu = [host.get(t, read=False) for t in tensors]
        gloo = self.gloo
        return self._launch(host, tensors, what="recv",
                            gloo=lambda: gloo.recv_anysource(cpu, tag), p2p=True,
                            writes=True)

    @_collective
    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        self._unchecked()
        host = _Host(self, [])
        native = self._native_for("barrier", "", torch.uint8)
        if native is not None:
            return self._launch(host, [], native=native.call(
                "barrier", [], self._tls.seq, timeout_s=self._timeout(opts)))
        gloo = self.gloo
        return self._launch(host, [], what="barrier", gloo=lambda: gloo.barrier(opts))


def _allreduce_opts(coalesced):
    o = dist.AllreduceOptions()
    if coalesced is not None:
        o.reduceOp, o.timeout = coalesced.reduceOp, coalesced.timeout
    return o
