"""PyTorch's aliasing rules on device tensors (Note [One host storage per device storage]
in include/accelkit/torch/fallback.hpp): an out= tensor that partly overlaps an input, or
whose own elements overlap (an expanded tensor), is refused on the device exactly as on
the CPU (same exception type, same message), through the fallback and the host kernels;
full overlaps and in-place operators the CPU allows give the CPU's values. The suite runs
in each memory mode of the ctest entries (simdev: SIMDEV_HOST_VISIBLE=1, mapped, 0).
tests/sweep/overlap_sweep.py tries every operator of op_db that takes out=."""
import pytest
import torch

from backend import DEV


def outcome(fn, device):
    """fn(device) -> the tensors it touched; returns ("ok", their values) or
    (exception type, message)."""
    try:
        touched = fn(device)
        return "ok", [t.cpu() for t in touched]
    except Exception as e:  # the outcome is compared, whatever it is
        return type(e), str(e).splitlines()[0]


def same_as_cpu(fn):
    want, got = outcome(fn, "cpu"), outcome(fn, DEV)
    assert got[0] == want[0], f"the CPU: {want}; {DEV}: {got}"
    if want[0] == "ok":
        assert len(got[1]) == len(want[1])
        for g, w in zip(got[1], want[1]):
            torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)
    else:
        assert got[1] == want[1]
    return want


def base(device, n=8):
    return torch.arange(1.0, n + 1, device=device)


# The out= tensor overlaps its input by all but one element.
PARTIAL = {
    "cumsum": lambda x: torch.cumsum(x[:-1], 0, out=x[1:]),
    "cumprod": lambda x: torch.cumprod(x[:-1], 0, out=x[1:]),
    "logcumsumexp": lambda x: torch.logcumsumexp(x[:-1], 0, out=x[1:]),
    "cat": lambda x: torch.cat([x[:2], x[2:4]], out=x[1:5]),
    "index_select": lambda x: torch.index_select(
        x[:6], 0, torch.tensor([0, 1, 2], device=x.device), out=x[1:4]),
    "take": lambda x: torch.take(x[:6], torch.tensor([0, 1, 2], device=x.device), out=x[1:4]),
    # Host kernels where the host reaches the memory (Note [Host kernels]).
    "add": lambda x: torch.add(x[:-1], 1, out=x[1:]),
    "exp": lambda x: torch.exp(x[:-1], out=x[1:]),
}


@pytest.mark.parametrize("op", sorted(PARTIAL))
def test_partly_overlapping_out_is_refused_as_on_the_cpu(op):
    def run(device):
        x = base(device)
        PARTIAL[op](x)
        return [x]

    kind, message = same_as_cpu(run)
    assert kind is RuntimeError and "refer to a single memory location" in message


@pytest.mark.parametrize("op", sorted(PARTIAL))
def test_refused_operator_leaves_the_memory_as_it_was(op):
    x = base(DEV)
    with pytest.raises(RuntimeError, match="single memory location"):
        PARTIAL[op](x)
    torch.testing.assert_close(x.cpu(), base("cpu"), rtol=0, atol=0)


# The out= tensor is expanded (its elements overlap each other).
EXPANDED = {
    "cumsum": lambda x, o: torch.cumsum(x, 0, out=o),
    "cumprod": lambda x, o: torch.cumprod(x, 0, out=o),
    "logcumsumexp": lambda x, o: torch.logcumsumexp(x, 0, out=o),
    "cat": lambda x, o: torch.cat([x[:2], x[2:]], out=o),
    "index_select": lambda x, o: torch.index_select(
        x, 0, torch.tensor([0, 1, 2, 3], device=x.device), out=o),
    "take": lambda x, o: torch.take(x, torch.tensor([0, 1, 2, 3], device=x.device), out=o),
    "add": lambda x, o: torch.add(x, 1, out=o),
    "exp": lambda x, o: torch.exp(x, out=o),
}


@pytest.mark.parametrize("op", sorted(EXPANDED))
def test_expanded_out_is_refused_as_on_the_cpu(op):
    def run(device):
        x = base(device, 4)
        o = torch.zeros(1, device=device).expand(4)
        EXPANDED[op](x, o)
        return [x, o]

    kind, message = same_as_cpu(run)
    assert kind is RuntimeError and "more than one element of the written-to tensor" in message


# What the CPU allows: an out= that is the input itself, in-place operators with an
# operand that is the tensor or a disjoint part of its memory, outs that interleave
# with the input (PyTorch cannot tell them apart from overlaps and lets them through).
ALLOWED = {
    "add out=a": lambda x: [torch.add(x, base(x.device), out=x)],
    "add_ self": lambda x: [x.add_(x)],
    "mul_ self": lambda x: [x.mul_(x)],
    "add_ other half": lambda x: [x[:4].add_(x[4:])],
    "cumsum out=input": lambda x: [torch.cumsum(x, 0, out=x), x],
    "cumsum into the other half": lambda x: [torch.cumsum(x[:4], 0, out=x[4:]), x],
    "cat into the other half": lambda x: [torch.cat([x[:2], x[2:4]], out=x[4:]), x],
    "index_select into the other half": lambda x: [torch.index_select(
        x[:4], 0, torch.tensor([3, 0, 2], device=x.device), out=x[5:]), x],
    "take interleaved": lambda x: [torch.take(
        x[::2], torch.tensor([3, 0, 2, 1], device=x.device), out=x[1::2]), x],
    "cumsum interleaved": lambda x: [torch.cumsum(x[::2], 0, out=x[1::2]), x],
    "exp_": lambda x: [x.exp_()],
    "sub out=other": lambda x: [torch.sub(base(x.device), x, out=x)],
    "mm out over its input (PyTorch does not check)": lambda x: [torch.mm(
        x[:4].view(2, 2), x[4:].view(2, 2), out=x[1:5].view(2, 2)), x],
    "index_copy_ source from another storage": lambda x: [x.index_copy_(
        0, torch.tensor([1, 6], device=x.device), base(x.device, 2))],
}


@pytest.mark.parametrize("case", sorted(ALLOWED))
def test_what_the_cpu_allows_gives_the_cpus_values(case):
    def run(device):
        x = base(device)
        return ALLOWED[case](x) + [x]

    assert same_as_cpu(run)[0] == "ok"


def test_out_resized_within_an_inputs_storage_matches_the_cpu():
    # out= a tensor without elements over the input's memory: the CPU resizes it within
    # the storage, which then holds input and output at once (a full overlap, allowed).
    def run(device):
        x = base(device)
        out = x[:0]
        torch.exp(x[:4], out=out)
        return [out, x]

    same_as_cpu(run)


RESIZED = {
    "cumsum": lambda x, o: torch.cumsum(x[:2], 0, out=o),
    "index_select": lambda x, o: torch.index_select(
        x[:2], 0, torch.tensor([1, 0], device=x.device), out=o),
    "exp": lambda x, o: torch.exp(x[:2], out=o),
}


@pytest.mark.parametrize("op", sorted(RESIZED))
@pytest.mark.filterwarnings("ignore:An output with one or more elements was resized")
def test_out_resized_beyond_a_storage_shared_with_an_input_matches_the_cpu(op):
    # The out= tensor (the last element) grows past the end of the storage: the storage
    # moves to new memory, and the input, a tensor of the same storage, sees it there.
    def run(device):
        x = base(device, 4)
        out = x[3:]
        RESIZED[op](x, out)
        return [out, x, torch.tensor([out.untyped_storage().nbytes(),
                                      x.untyped_storage().nbytes()])]

    same_as_cpu(run)


def test_index_put_with_values_overlapping_the_destination_matches_the_cpu():
    def run(device):
        x = base(device)
        i = torch.tensor([0, 1, 2], device=device)
        x.index_put_((i,), x[1:4])
        return [x]

    same_as_cpu(run)


# Identity through the fallback: the CPU kernels see the device tensors' storages as
# one CPU storage each, so is_set_to, the expanded-destination warning of index_put_
# and the overlap refusals of the shift operators answer as on the CPU.
def test_is_set_to_answers_as_on_the_cpu():
    def run(device):
        t1 = torch.empty(3, 4, 9, 10, device=device)
        t2 = torch.empty(3, 4, 9, 10, device=device)
        t3 = torch.tensor([], device=device).set_(t1)
        t4 = t3.clone().resize_(12, 90)
        b1 = torch.tensor([True, True], device=device)
        b2 = torch.tensor([False], device=device).set_(b1)
        s = torch.empty(0, device=device).set_(t1.untyped_storage(), 0, t1.size(), t1.stride())
        v = torch.empty(2, 3, 4, device=device)
        e = torch.empty(2, 5, 0, device=device)
        answers = [t1.is_set_to(t2), t1.is_set_to(t3), t3.is_set_to(t1), t1.is_set_to(t4),
                   b1.is_set_to(b2), s.is_set_to(t1), v.is_set_to(v.view(4, 3, 2)),
                   e.is_set_to(e.view(0))]
        return [torch.tensor(answers)]

    assert same_as_cpu(run)[1][0].tolist() == [False, True, True, False, True, True, False,
                                               False]


def test_index_put_on_an_expanded_tensor_warns_as_on_the_cpu():
    import warnings

    def run(device):
        x = torch.zeros(1, device=device).expand(6)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x.index_put_((torch.tensor([2, 1, 0], device=device),),
                         torch.tensor([1.0, 2.0, 3.0], device=device))
        return [x, torch.tensor(sum("expanded tensors" in str(w.message) for w in caught))]

    assert same_as_cpu(run)[1][1].item() == 1


@pytest.mark.parametrize("op", ["__ilshift__", "__irshift__"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_in_place_shifts_on_overlapping_memory_are_refused_as_on_the_cpu(op, dtype):
    def run(device):
        x = torch.arange(1, 5, device=device).to(dtype)
        getattr(x[:-1], op)(x[1:])
        return [x]

    assert "single memory location" in same_as_cpu(run)[1]


@pytest.mark.parametrize("numel", [0, 3])
def test_local_scalar_dense_answers_as_the_cpus_kernel(numel):
    # The CPU's kernel refuses an empty tensor in its own words (Tensor.item() checks
    # the numel first, with another message) and reads the first element otherwise.
    def run(device):
        x = torch.arange(5.0, 5.0 + numel, device=device)
        return [torch.tensor(torch.ops.aten._local_scalar_dense(x))]

    want = same_as_cpu(run)
    if numel == 0:
        assert want == (RuntimeError, "_local_scalar_dense: Empty tensor not supported")
    else:
        assert want[1][0].item() == 5.0
