"""The ranks' agreement on each collective: every rank checks its own
arguments, then the ranks compare what they are about to run, so that a
mismatch is one clear error on every rank rather than a gloo abort or a
collective paired with another (Note [A failed group])."""
import functools

import torch
from torch.distributed import ReduceOp

from .failures import _on_gloo_failed

_REDUCE_NAMES = {ReduceOp.SUM: "SUM", ReduceOp.PRODUCT: "PRODUCT", ReduceOp.MIN: "MIN",
                 ReduceOp.MAX: "MAX", ReduceOp.BAND: "BAND", ReduceOp.BOR: "BOR",
                 ReduceOp.BXOR: "BXOR", ReduceOp.AVG: "AVG", ReduceOp.PREMUL_SUM: "PREMUL_SUM"}
_BITWISE = (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR)


def _op_name(op) -> str:
    for kind, name in _REDUCE_NAMES.items():
        if op == kind:
            return name
    return repr(op)


_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
           torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def _dtype_code(dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def _collective(method):
    """A collective of the group: an error raised after the ranks' agreement
    (the others went on into the collective) fails the group (Note [A
    failed group])."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        self._tls.agreed = False
        try:
            return method(self, *args, **kwargs)
        except BaseException as e:  # a KeyboardInterrupt after the agreement too
            if getattr(self._tls, "agreed", False):
                self._tls.agreed = False
                self._failures.fail(e if isinstance(e, Exception) else RuntimeError(
                    f"{self.name}: interrupted after the ranks agreed to run the "
                    f"collective ({type(e).__name__})"))
            raise
    return run


class _Agreement:
    """The process group's checks and the ranks' agreement (a mixin of
    ProcessGroup, which holds name, _size, check_agreement, _check_gloo,
    _published, _failures, _seq and _tls)."""

    def _reduce_op(self, op, tensors):
        """The op gloo runs for `op` (AVG: a SUM, divided after), refusing
        the ops and dtypes the group does not support."""
        if op == ReduceOp.PREMUL_SUM:
            raise ValueError(f"{self.name}: ReduceOp.PREMUL_SUM is not supported by this "
                             "process group (it runs on gloo)")
        known = any(op == kind for kind in _REDUCE_NAMES)
        if not known:
            raise ValueError(f"{self.name}: unsupported reduce op {op!r}")
        if any(op == b for b in _BITWISE):
            for t in tensors:
                if t.is_floating_point() or t.is_complex():
                    raise ValueError(f"{self.name}: ReduceOp.{_op_name(op)} needs integer or "
                                     f"bool tensors, got {t.dtype}")
        if op == ReduceOp.AVG:
            opts_op = ReduceOp.SUM
        else:
            opts_op = op
        return opts_op

    # The collectives the agreement tells apart, by their names in errors.
    _KINDS = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
              "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single")
    # A row of the agreement: the collective, its number, the tensor's dtype
    # and element count, this rank's state, the reduce op, the root rank,
    # and whether splits follow (all_to_all_single).
    _ROW = 8
    _OK, _REFUSED = 0, 1

    def _agree(self, what: str, tensor, numel=None, state=0, op=None, root=None,
               splits=None, seq=0):
        """Refuses a collective whose ranks disagree on the collective, its
        number in the group, the tensor's dtype or element count, the reduce
        `op` or the `root` rank (gloo itself aborts the process on a size
        mismatch, and the vendor slot's choice depends on these: Note [The
        vendor collective slot]): a small allgather of each rank's row of
        fixed width first, on a gloo group of its own, so every rank raises
        the same ValueError, naming the collective and the values. A rank
        whose own checks failed (`state` _REFUSED) takes part too, and the
        others raise naming it (it raises its own error). `splits` (all_to_all_single: this rank's
        output and input splits in elements, one per rank each) go in a
        second allgather once every rank agreed that the collective is
        all_to_all_single, and every rank checks that each rank sends each
        peer what that peer expects (gloo aborts the process otherwise).
        Off when `check_agreement` is False."""
        if not self.check_agreement or self._size == 1:
            return
        numel = tensor.numel() if numel is None else numel
        code = -1 if op is None else list(_REDUCE_NAMES.values()).index(_op_name(op)) \
            if _op_name(op) in _REDUCE_NAMES.values() else len(_REDUCE_NAMES)
        kind = self._KINDS.index(what) if what in self._KINDS else len(self._KINDS)
        mine = torch.tensor([kind, seq, _dtype_code(tensor.dtype), numel, state, code,
                             -1 if root is None else root, int(splits is not None)],
                            dtype=torch.int64)
        rows = self._allgather_rows(what, mine)
        if state != self._OK:
            return  # the caller raises this rank's own error
        refused = [i for i, r in enumerate(rows) if r[4] == self._REFUSED]
        if refused:
            raise ValueError(f"{self.name}: {what}: rank(s) {', '.join(map(str, refused))} "
                             "refused the collective (their own error says why)")

        def kind_name(c):
            return self._KINDS[c] if 0 <= c < len(self._KINDS) else "another collective"
        if any(r[0] != rows[0][0] for r in rows):
            raise ValueError(f"{self.name}: {what}: the ranks' collectives disagree: "
                             + ", ".join(f"rank {i} calls {kind_name(r[0])}"
                                         for i, r in enumerate(rows)))
        if any(r[1] != rows[0][1] for r in rows):
            raise ValueError(f"{self.name}: {what}: the ranks disagree on how many collectives "
                             "the group ran before this one (a collective called on some "
                             "ranks only): " + ", ".join(f"rank {i} calls its collective #{r[1]}"
                                                        for i, r in enumerate(rows)))
        if any(r[5] != rows[0][5] for r in rows):
            names = list(_REDUCE_NAMES.values())

            def opname(c):
                return f"ReduceOp.{names[c]}" if 0 <= c < len(names) else "another op"
            raise ValueError(f"{self.name}: {what}: the ranks' reduce ops disagree: "
                             + ", ".join(f"rank {i} has {opname(r[5])}"
                                         for i, r in enumerate(rows)))
        if any(r[6] != rows[0][6] for r in rows):
            raise ValueError(f"{self.name}: {what}: the ranks' root ranks disagree: "
                             + ", ".join(f"rank {i} has root {r[6]}" for i, r in enumerate(rows)))
        if splits is not None:
            self._agree_splits(what, splits)
        pairs = [r[2:4] for r in rows]
        if any(r != pairs[0] for r in pairs):
            def desc(r):
                dt = _DTYPES[r[0]] if r[0] < len(_DTYPES) else "another dtype"
                return f"{dt} x {r[1]}"
            raise ValueError(f"{self.name}: {what}: the ranks' tensors disagree: "
                             + ", ".join(f"rank {i} has {desc(r)}" for i, r in enumerate(pairs)))

    def _allgather_rows(self, what, mine):
        """Every rank's `mine` (one width on every rank), as lists. A failed
        exchange fails the group (Note [A failed group]), quoting a failure
        another rank published if there is one."""
        width = mine.numel()
        every = torch.empty(width * self._size, dtype=torch.int64)
        try:
            self._check_gloo._allgather_base(every, mine).wait()
        except RuntimeError as e:
            error = self._published.quoted(
                self.name, _on_gloo_failed(self.name, f"{what} (the ranks' agreement)", e))
            self._failures.fail(error)
            raise error from e
        return every.view(self._size, width).tolist()

    def _agree_splits(self, what, splits):
        """all_to_all_single's splits, once every rank agreed on the
        collective: each rank sends each peer what that peer expects."""
        n = self._size
        rows = self._allgather_rows(what, torch.tensor([int(x) for x in splits],
                                                       dtype=torch.int64))
        outs = [r[:n] for r in rows]
        ins = [r[n:2 * n] for r in rows]
        bad = [(i, j) for i in range(n) for j in range(n) if ins[i][j] != outs[j][i]]
        if bad:
            i, j = bad[0]
            raise ValueError(
                f"{self.name}: {what}: the ranks' splits disagree (rank {i} sends "
                f"{ins[i][j]} elements to rank {j}, which expects {outs[j][i]}): "
                + ", ".join(f"rank {r} has input splits {ins[r]} and output splits "
                            f"{outs[r]}" for r in range(n)) + " (in elements)")

    def _checked(self, what: str, tensor, check, numel=None, op=None, root=None,
                 splits=None):
        """Runs this rank's own checks (`check()`, which raises on a bad
        argument and returns what the collective needs), then the ranks'
        agreement (_agree), which a rank whose check failed joins too, so
        that no rank is left waiting for it: every rank raises. A failed group raises its failure at once
        (Note [A failed group]). Gives the collective its number in the
        group (Note [The vendor collective slot])."""
        self._failures.check()  # Note [A failed group]
        seq = next(self._seq)
        self._tls.seq = seq
        result, failed = None, None
        try:
            result = check()
        except Exception as e:  # noqa: BLE001  (joins the agreement, then raised)
            failed = e
        state = self._OK if failed is None else self._REFUSED
        self._agree(what, tensor, numel, state=state, op=op, root=root, seq=seq,
                    splits=None if splits is None else splits(result) if state == self._OK
                    else [])
        if failed is not None:
            raise failed
        self._tls.agreed = True
        return result

    def _unchecked(self, *, numbered=True):
        """The start of a collective without an agreement (gather, scatter,
        barrier; send and recv, `numbered` False: one rank's send is
        another's receive): raises the group's failure, and gives the
        collective its number."""
        self._failures.check()  # Note [A failed group]
        if numbered:
            self._tls.seq = next(self._seq)
        self._tls.agreed = True
