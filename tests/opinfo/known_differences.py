"""Where a backend's operators knowingly differ from the CPU's in the OpInfo
comparison (test_opinfo.py). Each entry names the operator (OpInfo name and
variant), the dtype (or a tuple of them), the direction and the memory mode it
applies to (None: all), and why. The test fails on any difference not listed here, and on an
entry that no longer differs: this list may only shrink."""

SPARSE = ("sparse layouts are not supported on a generated backend: the operator raises "
          "NotImplementedError naming the backend (Note [Sparse layouts], docs/python.md)")

REDUCED = ("float16", "bfloat16")
LCE = "PyTorch picks the accumulation policy per device type (for cpu and cuda only)"

KNOWN_DIFFERENCES = {
    # (operator, dtype, direction, memory): reason
    ("to_sparse", None, None, None): SPARSE,
    ("sparse.sampled_addmm", None, None, None): SPARSE,
    ("sparse.mm.reduce", None, None, None): SPARSE,
    # PyTorch's own expected failure of test_compare_cpu on every device:
    # as_strided over a view reads the view's whole storage, which the CPU
    # copy of the view (compact) does not have.
    ("as_strided.partial_views", None, None, None):
        "the CPU copy of a partial view has another storage (PyTorch expects this failure)",
    # PyTorch's Python implementation chooses its accumulation policy
    # ("auto") for float16 and bfloat16 per device type, with picks for cpu
    # and cuda only; any other device type gets the generic policy, which
    # accumulates differently (float16 gradients 7.6e-6 off on 0.09).
    ("nn.functional.linear_cross_entropy.chunked", REDUCED, None, None): LCE,
    ("nn.functional.linear_cross_entropy.chunked_none", REDUCED, None, None): LCE,
}


def covers(listed, dtype):
    return listed is None or dtype == listed or (isinstance(listed, tuple) and dtype in listed)


def known(op, dtype, direction, memory):
    """The reason op differs in this case, or None."""
    for (o, d, w, m), reason in KNOWN_DIFFERENCES.items():
        if o == op and covers(d, dtype) and w in (None, direction) and m in (None, memory):
            return reason
    return None
