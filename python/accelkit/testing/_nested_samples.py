"""The OpInfo comparison's nested samples: the OpInfos of PyTorch's njt_op_db
(torch.testing._internal.opinfo.definitions.nested: op_db's operators with
sample inputs that are nested tensors of the jagged layout), each sample run
as it is and with its nested tensors in the strided layout, on the device
against a CPU copy (Note [Nested tensors] in accelkit/torch/nested.hpp).

names(dtype): the operators (name[.variant]) with nested samples for dtype
on the CPU. forward(op, dtype, backend, count, to_cpu, on_both, compare):
the first `count` samples of each layout compared, through the comparison's
own to_cpu (a sample's CPU copy), on_both (the operator on both, the same
errors and warnings) and compare (outputs, by component for nested ones);
returns how many were compared. Used by _opinfo_child.py's direction
"nested"; a sample whose operator the strided layout does not have raises
on both sides and is not compared.
"""
import torch


def _key(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def ops():
    from torch.testing._internal.opinfo.definitions.nested import njt_op_db
    return {_key(o): o for o in njt_op_db}


def names(dtype):
    """The operators of njt_op_db that the CPU supports for dtype and that make
    nested samples (some OpInfos there raise that they do not)."""
    found = []
    for name, op in ops().items():
        if dtype not in op.supported_dtypes("cpu"):
            continue
        try:
            next(iter(op.sample_inputs("cpu", dtype)))
        except Exception:  # noqa: BLE001: no nested samples for it
            continue
        found.append(name)
    return found


def _deep(x, f):
    if isinstance(x, torch.Tensor):
        return f(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_deep(e, f) for e in x)
    if isinstance(x, dict):
        return {k: _deep(v, f) for k, v in x.items()}
    return x


def _strided(t):
    if not t.is_nested:
        return t
    return torch.nested.nested_tensor([c.detach() for c in t.unbind()], layout=torch.strided,
                                      device=t.device)


def strided_sample(s):
    """The sample with its nested tensors in the strided layout."""
    from torch.testing._internal.opinfo.core import SampleInput
    return SampleInput(_deep(s.input, _strided), args=_deep(s.args, _strided),
                       kwargs=_deep(s.kwargs, _strided))


def components(x):
    """x with each nested tensor replaced by the list of its components."""
    if isinstance(x, torch.Tensor) and x.is_nested:
        return list(x.unbind())
    if isinstance(x, (list, tuple)):
        return [components(e) for e in x]
    if isinstance(x, dict):
        return {k: components(v) for k, v in x.items()}
    return x


def forward(op, dtype, backend, count, to_cpu, on_both, compare):
    compared = 0
    torch.manual_seed(0)  # the same samples every run
    for i, s in enumerate(op.sample_inputs(backend, dtype)):
        if i >= count:
            break
        for layout, sample in (("jagged", s), ("strided", strided_sample(s))):
            cpu = (to_cpu(sample.input), to_cpu(sample.args), to_cpu(sample.kwargs))
            both = on_both(op, sample, cpu)
            if both is None:
                continue
            compare(components(both[1]), components(both[0]), op, dtype, f"{layout} output")
            compared += 1
    return compared
