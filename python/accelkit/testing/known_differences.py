"""Known differences: failures the kit reports apart from the others, which do
not fail a run.

The SDK's own list, KNOWN_DIFFERENCES, says where a backend made by accelkit
knowingly differs from the CPU in PyTorch's OpInfo samples (the kit's group
"opinfo" and tests/opinfo). Each entry names the operator (OpInfo name and
variant), the dtype (or a tuple of them), the direction and the memory mode
("host-visible" or "hidden") it applies to (None: all), and why. tests/opinfo
fails on any difference not listed here, and on an entry that no longer
differs: this list may only shrink.

A vendor's own list is a text file given to the kit with
``--known-differences FILE`` (load), one entry per line:

    # comment
    CHECK: REASON

CHECK is a check as the kit's summary names it, group/name (for the OpInfo
group, "opinfo/<operator> <dtype> <direction>"), with shell-style wildcards
(``*``, ``?``, ``[...]``, as fnmatch); REASON, required, says why. For example

    opinfo/nn.functional.conv2d float16 *: our float16 convolution accumulates in float16
    streams/priorities: the hardware has one queue
"""
import fnmatch

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
    """The reason op differs in this case on the SDK's list, or None."""
    for (o, d, w, m), reason in KNOWN_DIFFERENCES.items():
        if o == op and covers(d, dtype) and w in (None, direction) and m in (None, memory):
            return reason
    return None


class VendorList:
    """A vendor's list (the format above), read by load(). Thread-safe for
    reading; `unused()` names the entries that matched no failure so far."""

    def __init__(self, path, entries):
        self.path = path
        self.entries = entries  # [(line number, pattern, reason)]
        self._used = set()

    def reason(self, group, name):
        """The reason of the first entry that names group/name, or None."""
        check = f"{group}/{name}"
        for line, pattern, reason in self.entries:
            if fnmatch.fnmatchcase(check, pattern):
                self._used.add(line)
                return reason
        return None

    def unused(self):
        return [f"{self.path}:{line}: {pattern}" for line, pattern, _ in self.entries
                if line not in self._used]


def load(path):
    """Reads a vendor's list; ValueError naming the file, the line and what is
    wrong with it (OSError when it cannot be read)."""
    entries = []
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            line = text.strip()
            if not line or line.startswith("#"):
                continue
            pattern, colon, reason = (s.strip() for s in line.partition(":"))
            if not colon or not reason:
                raise ValueError(f"{path}:{number}: {line!r} is not 'CHECK: REASON' (a check, "
                                 "group/name with wildcards, a colon and why it differs)")
            if "/" not in pattern:
                raise ValueError(f"{path}:{number}: {pattern!r} names no check: write "
                                 "group/name, e.g. opinfo/add float16 forward or opinfo/add *")
            entries.append((number, pattern, reason))
    return VendorList(path, entries)
