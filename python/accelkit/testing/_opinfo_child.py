"""One child of the OpInfo comparison (opinfo.py starts it; it runs as a
script, so that it works from a backend's copy of the SDK as well).

    python _opinfo_child.py BACKEND SAMPLES ITEM...

Each ITEM is "operator|dtype|direction" (direction: forward, backward, out
or nested).
For each it prints "START item" before running it, so that a crash is
charged to that item, and "RESULT {json}" after.

forward, as PyTorch's test_compare_cpu: the first SAMPLES samples are made
on the device, each copied to the CPU, the operator run on both (seeded
alike) and every tensor output compared with torch.testing.assert_close
(PyTorch's own test_compare_cpu tolerances where it sets them, else
assert_close's for the dtype).

backward: the samples are made with requires_grad, the operator run through
its OpInfo gradcheck wrapper on both, and the gradients of every input that
requires one, for the same random output gradients, compared the same way.

out: each sample whose functional form runs on the CPU, again with out=
tensors shaped as that result on both sides, by turns filled with a value
no result has (NaN, the dtype's largest), the same not contiguous, or
empty (the operator resizes it; the first sample also); the outcome must be the same (the CPU's own error: the
same exception type), then the results, the out= tensors' values and
strides, and whether the call returns its out= tensors are compared.

nested: the operators of njt_op_db (op_db's operators with nested samples),
each sample as it is (jagged layout) and with its nested tensors in the
strided layout, forward as above, nested outputs compared by component
(_nested_samples.py).

Every call of the operator in every direction, on each side, records its
warnings (PyTorch's warn-once ones on every call: torch.set_warn_always);
the device must raise the CPU's warnings, each as often (a device name in a
message read as the CPU's), else the item is a mismatch.

Where PyTorch skips or expects test_compare_cpu to fail for every device,
its reason decides: outputs it calls non-deterministic or undefined are
checked for shape, dtype and device only; anything else is compared fully.
An operator that raises on the CPU must raise the same exception type on
the device. A comparison that fails is a mismatch (Mismatch; the message has
assert_close's largest absolute and relative differences); any other
exception is an error.
"""
import json
import os
import re
import sys
import time
import warnings

warnings.simplefilter("ignore")

import torch  # noqa: E402
from torch.testing._internal.common_device_type import toleranceOverride  # noqa: E402
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.opinfo.core import DecorateInfo  # noqa: E402

BACKEND = sys.argv[1]
SAMPLES = int(sys.argv[2])
__import__("torch_" + BACKEND)
# Warnings are compared per call (recorded): PyTorch's warn-once warnings
# raise on every call, so that the side run first does not take them.
torch.set_warn_always(True)
for module in filter(None, os.environ.get("ACCELKIT_TESTING_IMPORT", "").split(",")):
    __import__(module)  # the kit's --import
OPS = {o.name + ("." + o.variant_test_name if o.variant_test_name else ""): o for o in op_db}
import _nested_samples  # noqa: E402 (beside this script: njt_op_db's nested samples)


def overlapping(t):
    """Whether two elements of t may share memory (an expanded tensor)."""
    reach = 0  # the farthest offset the dimensions of smaller strides reach
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        c = x.detach().cpu()
        if x.layout == torch.strided and not x.is_nested and c.stride() != x.stride() \
                and not overlapping(x):
            # A view with gaps (a step, a slice of rows) keeps its strides, as
            # the device's does: kernels warn or take other paths by layout.
            c = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype).copy_(c)
        return c.requires_grad_() if x.requires_grad else c
    if isinstance(x, torch.device) or (isinstance(x, str) and x.startswith(BACKEND)):
        return "cpu"
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(e) for e in x)
    if isinstance(x, dict):
        return {k: to_cpu(v) for k, v in x.items()}
    return x


def tensors(x):
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in tensors(e)]
    if isinstance(x, dict):
        return [t for e in x.values() for t in tensors(e)]
    return []


def compare_cpu_decorators(op, dtype):
    for d in op.decorators:
        if isinstance(d, DecorateInfo) and d.test_name == "test_compare_cpu" \
                and d.device_type in (None, "privateuse1") \
                and (d.dtypes is None or dtype in d.dtypes):
            yield from d.decorators


# PyTorch skips test_compare_cpu for empty_strided without a reason; its
# output is uninitialized memory, as empty's (which says so).
UNINITIALIZED = {"empty_strided"}


def metadata_only(op, dtype):
    """PyTorch's own reason for skipping the comparison says that the values
    cannot agree (random draws, uninitialized memory, undefined overflow)."""
    if op.name in UNINITIALIZED:
        return True
    for d in compare_cpu_decorators(op, dtype):
        if isinstance(d, toleranceOverride):
            continue
        reasons = [c.cell_contents for c in (getattr(d, "__closure__", None) or ())
                   if isinstance(c.cell_contents, str)]
        if any(w in r for r in reasons for w in ("non-deterministic", "undefined")):
            return True
    return False


def tolerance(op, dtype):
    for d in compare_cpu_decorators(op, dtype):
        if isinstance(d, toleranceOverride) and dtype in d.d:
            return {"atol": d.d[dtype].atol, "rtol": d.d[dtype].rtol}
    return {}


def named_device(x):
    """The device type a sample names (factory operators), if any."""
    if isinstance(x, (torch.device, str)) and str(x).split(":")[0] in ("cpu", BACKEND):
        return str(x).split(":")[0]
    for e in (x if isinstance(x, (list, tuple)) else x.values() if isinstance(x, dict) else ()):
        if named_device(e):
            return named_device(e)
    return None


class Mismatch(AssertionError):
    """The device's result differs from the CPU's."""


def compare(want, got, op, dtype, what, on_device=True):
    try:
        _compare(want, got, op, dtype, what, on_device)
    except AssertionError as e:
        raise Mismatch(str(e)) from None


def _compare(want, got, op, dtype, what, on_device=True):
    w, g = tensors(want), tensors(got)
    if len(w) != len(g):
        raise AssertionError(f"{what}: {len(g)} tensors on the device, {len(w)} on the CPU")
    for i, (a, b) in enumerate(zip(w, g)):
        expected = BACKEND if a.device.type == "cpu" and on_device else a.device.type
        if b.device.type != expected:
            raise AssertionError(f"{what} {i} is on {b.device}, expected {expected}")
        if metadata_only(op, dtype):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise AssertionError(f"{what} {i}: {tuple(b.shape)} {b.dtype} on the device, "
                                     f"{tuple(a.shape)} {a.dtype} on the CPU")
            continue
        torch.testing.assert_close(b.detach().cpu(), a.detach(), equal_nan=True,
                                   check_device=False, check_stride=False,
                                   msg=lambda m, i=i: f"{what} {i}: {m}", **tolerance(op, dtype))


def outcome(f):
    """(value, None) or (None, exception)."""
    try:
        return f(), None
    except Exception as e:  # noqa: BLE001
        return None, e


def same_errors(got_error, want_error, what):
    if want_error is None and got_error is None:
        return False
    if want_error is None:
        raise got_error
    if got_error is None:
        raise AssertionError(f"{what} raised {type(want_error).__name__} on the CPU, nothing on the device")
    if type(got_error) is not type(want_error):
        raise AssertionError(f"{what} raised {type(got_error).__name__} on the device, "
                             f"{type(want_error).__name__} on the CPU: {got_error}")
    return True


def samples(op, dtype, requires_grad):
    """The first SAMPLES samples, made on the device, each with a CPU copy."""
    torch.manual_seed(0)  # the same samples every run
    for i, s in enumerate(op.sample_inputs(BACKEND, dtype, requires_grad=requires_grad)):
        if i >= SAMPLES:
            return
        yield s, (to_cpu(s.input), to_cpu(s.args), to_cpu(s.kwargs))


def recorded(f):
    """(value, exception, warnings): outcome(f) and the warnings it raised,
    each as "Category: message" (every one: PyTorch's warn-once warnings
    too, torch.set_warn_always above)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, error = outcome(f)
    return value, error, [f"{w.category.__name__}: {w.message}" for w in caught]


def same_warnings(got, want, what):
    """The device warns as the CPU does: the same warnings, each as often
    (a device name in a message read as the CPU's)."""
    got = sorted(re.sub(rf"\b{BACKEND}(:\d+)?\b", "cpu", w) for w in got)
    if got != sorted(want):
        extra = [w for w in set(got) if got.count(w) > want.count(w)]
        missing = [w for w in set(want) if want.count(w) > got.count(w)]
        raise Mismatch(f"{what} warned {len(got)} time(s) on the device, {len(want)} on the CPU"
                       + (f"; more often on the device: {extra[0][:160]!r}" if extra else "")
                       + (f"; more often on the CPU: {missing[0][:160]!r}" if missing else ""))


def on_both(f, s, cpu, out=None):
    """f(sample) and f(its CPU copy), seeded alike: (got, want), or None when
    both raised the same type of exception; each side warned as the other.
    out: (the device's, the CPU's) out= argument, if any."""
    extra = ({"out": out[0]}, {"out": out[1]}) if out is not None else ({}, {})
    torch.manual_seed(0)
    got, got_error, got_warned = recorded(lambda: f(s.input, *s.args, **s.kwargs, **extra[0]))
    torch.manual_seed(0)
    want, want_error, want_warned = recorded(lambda: f(cpu[0], *cpu[1], **cpu[2], **extra[1]))
    both_raised = same_errors(got_error, want_error, "the operator")
    same_warnings(got_warned, want_warned, "the operator")
    return None if both_raised else (got, want)


def forward(op, dtype):
    compared = 0
    for s, cpu in samples(op, dtype, requires_grad=False):
        both = on_both(op, s, cpu)
        if both is None:
            continue
        # On the device a sample names, else on the device if it has a
        # device tensor (torch.arange(2) is on the default device, the CPU).
        sample = [s.input, s.args, s.kwargs]
        named = named_device(sample)
        on_device = named == BACKEND if named else any(t.device.type == BACKEND for t in tensors(sample))
        compare(both[1], both[0], op, dtype, "output", on_device)
        compared += 1
    return compared


def filled(t):
    """A tensor like t that no result has: NaN, or the dtype's largest value."""
    try:
        return torch.full_like(t, torch.iinfo(t.dtype).max)
    except TypeError:
        return torch.full_like(t, float("nan"))


def strided(t):
    """filled(t) as a view that skips every other element of its storage."""
    if t.dim() == 0:
        return filled(t)
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    return filled(wide)[..., ::2]


# The out= tensors of the out direction, made from the CPU's functional
# result: its shape, dtype and layout with values no result has (filled),
# the same not contiguous (strided), and empty (resized by the operator).
OUT_CASES = {"filled": filled, "strided": strided, "empty": lambda t: t.new_empty(0)}


def out_cases(i):
    """The cases of sample i, in turn (a third of the time of all three for
    each): the first sample is also run with an empty out=."""
    case = list(OUT_CASES)[i % len(OUT_CASES)]
    return [case, "empty"] if i == 0 else [case]


def out_form(op, dtype):
    """Each sample with out= tensors on the device against the same on the
    CPU: the outcome (the CPU's own error), the warnings, what the call
    returns and the out= tensors' values, shapes and strides."""
    compared = 0
    for i, (s, cpu) in enumerate(samples(op, dtype, requires_grad=False)):
        torch.manual_seed(0)
        expected, error = outcome(lambda: op(cpu[0], *cpu[1], **cpu[2]))
        if error is not None:
            continue  # the functional form raises (the forward direction compares that)
        single = isinstance(expected, torch.Tensor)
        results = [expected] if single else list(expected) if isinstance(expected, (tuple, list)) else []
        if not results or not all(isinstance(t, torch.Tensor) for t in results):
            continue  # no tensor result to give as out=
        for case in out_cases(i):
            c_out = [OUT_CASES[case](t) for t in results]
            d_out = [t.to(BACKEND) for t in c_out]
            if case == "strided":  # the same layout on the device
                d_out = [torch.empty_like(t._base if t._base is not None else t, device=BACKEND)
                         .as_strided(t.shape, t.stride(), t.storage_offset()).copy_(t)
                         for t in c_out]
            both = on_both(op, s, cpu, out=(d_out[0], c_out[0]) if single else (tuple(d_out), tuple(c_out)))
            if both is None:
                continue
            got, want = both
            what = f"out= ({case})"
            compare(want, got, op, dtype, f"{what} result")
            compare(c_out, d_out, op, dtype, f"{what} tensor")
            for j, (a, b) in enumerate(zip(c_out, d_out)):
                if a.numel() > 1 and (a.shape, a.stride()) != (b.shape, b.stride()):
                    raise Mismatch(f"{what} tensor {j}: strides {b.stride()} on the device, "
                                   f"{a.stride()} on the CPU")
            returned = lambda r, o: [x.data_ptr() == y.data_ptr() for x, y in zip(tensors(r), o)]  # noqa: E731
            if returned(got, d_out) != returned(want, c_out):
                raise Mismatch(f"{what}: the call returns its out= tensors on the CPU "
                               f"({returned(want, c_out)}), not on the device ({returned(got, d_out)})")
        compared += 1
    return compared


def backward(op, dtype):
    compared = 0
    for s, cpu in samples(op, dtype, requires_grad=True):
        # Gradients of the inputs that require them; not of a view whose base
        # requires one (some samples pass such a window: its gradient goes to
        # the base, which the CPU copy, a plain tensor, does not have).
        pairs = [(t, c) for t, c in zip(tensors([s.input, s.args, s.kwargs]), tensors(list(cpu)))
                 if t.requires_grad and t._base is None]
        leaves, c_leaves = [t for t, _ in pairs], [c for _, c in pairs]
        # As PyTorch's gradient tests: the OpInfo's wrapper around its
        # function, and the sample's output_process_fn_grad (which keeps what
        # is well defined: no eigenvector phases).
        f = op.get_op()
        both = on_both(lambda *a, **k: s.output_process_fn_grad(op.gradcheck_wrapper(f, *a, **k)), s, cpu)
        if both is None:
            continue
        got, want = both
        outs = [t for t in tensors(got) if t.requires_grad]
        c_outs = [t for t in tensors(want) if t.requires_grad]
        if len(outs) != len(c_outs):
            raise Mismatch(f"{len(outs)} differentiable outputs on the device, {len(c_outs)} on the CPU")
        if not outs or not leaves:
            continue
        torch.manual_seed(1)
        c_grads_out = [torch.randn_like(t) for t in c_outs]
        grads_out = [g.to(t.device) for g, t in zip(c_grads_out, outs)]
        grads, got_error = outcome(lambda: torch.autograd.grad(outs, leaves, grads_out, allow_unused=True))
        c_grads, want_error = outcome(lambda: torch.autograd.grad(c_outs, c_leaves, c_grads_out, allow_unused=True))
        if same_errors(got_error, want_error, "the backward"):
            continue
        for j, (a, b) in enumerate(zip(c_grads, grads)):
            if (a is None) != (b is None):
                raise Mismatch(f"gradient {j}: {'none' if b is None else 'one'} on the device, "
                                     f"{'none' if a is None else 'one'} on the CPU")
            if a is not None:
                compare(a, b, op, dtype, f"gradient {j}")
        compared += 1
    return compared


def makes_samples(op, dtype):
    """Whether the OpInfo makes samples on the CPU (njt_op_db's OpInfos of
    operators without nested support raise)."""
    try:
        next(iter(op.sample_inputs("cpu", dtype)))
        return True
    except Exception:  # noqa: BLE001
        return False


def first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"


def largest_error(e):
    """assert_close's greatest differences, as one line."""
    found = re.findall(r"Greatest (absolute|relative) difference: (\S+)", str(e))
    return "; ".join(f"largest {kind} error {value}" for kind, value in found)


for item in sys.argv[3:]:
    name, dtype_name, direction = item.split("|")
    op = (_nested_samples.ops() if direction == "nested" else OPS).get(name)
    dtype = getattr(torch, dtype_name)
    print("START " + item, flush=True)
    t0 = time.monotonic()
    result = {"item": item, "status": "match", "message": ""}
    try:
        if op is None and direction == "nested":
            result.update(status="not applicable", message="njt_op_db has no nested samples of it")
        elif op is None:
            result.update(status="error", message=f"op_db has no OpInfo named {name!r}")
        elif dtype not in op.supported_dtypes("cpu") or direction == "backward" and not (
                op.supports_autograd and dtype in op.supported_backward_dtypes("cpu")):
            # Asked for without a listing (the kit's quick set): nothing to compare with.
            result.update(status="not applicable", message="the CPU does not support it")
        elif name.startswith("jiterator_"):
            result.update(status="not compared", message="a CUDA-only (Jiterator) operator")
        elif direction == "out" and not op.supports_out:
            result.update(status="not applicable", message="the operator takes no out=")
        elif direction == "nested" and not makes_samples(op, dtype):
            result.update(status="not applicable", message="njt_op_db makes no nested samples of it")
        elif direction == "nested":
            if _nested_samples.forward(op, dtype, BACKEND, SAMPLES, to_cpu, on_both, compare) == 0:
                result.update(status="not compared", message="no sample to compare")
        elif {"forward": forward, "backward": backward, "out": out_form}[direction](op, dtype) == 0:
            result.update(status="not compared", message="no sample to compare")
    except Mismatch as e:
        worst = largest_error(e)
        result.update(status="mismatch", message=first_line(e) + (f" ({worst})" if worst else ""))
        if worst:
            result["largest_error"] = worst
    except Exception as e:  # noqa: BLE001
        result.update(status="error", message=first_line(e))
    result["duration_s"] = time.monotonic() - t0
    print("RESULT " + json.dumps(result), flush=True)
