"""Nested tensors on the device (Note [Nested tensors] in include/accelkit/torch/nested.hpp):
the strided layout's operators through the NestedTensor fallback give the CPU's values,
errors and aliasing, the jagged layout's through the dense operators; a small transformer
block on nested inputs of both layouts, and TransformerEncoderLayer's fast path
(_transformer_encoder_layer_fwd on nested tensors), match the CPU."""
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F

from backend import DEV, ENV, MOD, renamed, two_devices

pytestmark = pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")


def components(seed=0, sizes=((2, 4), (3, 4), (1, 4))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in sizes]


def nested(device, layout=torch.strided, seed=0, **kw):
    return torch.nested.nested_tensor(components(seed), layout=layout, device=device, **kw)


def flat(x):
    """The tensors of a result, nested ones by component, on the CPU."""
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in flat(e)]
    if isinstance(x, torch.Tensor):
        return [t.cpu() for t in x.unbind()] if x.is_nested else [x.cpu()]
    return [torch.tensor(x)]


def outcome(fn, device):
    try:
        with torch.no_grad():
            return "ok", fn(device)
    except Exception as e:  # the outcome is compared, whatever it is
        return type(e), str(e).splitlines()[0]


def same_as_cpu(fn, exact=True):
    """fn(device) on the CPU and on the device: the same values (bit for bit where `exact`:
    the same CPU kernel on the same data) or the same exception and message."""
    want, got = outcome(fn, "cpu"), outcome(fn, DEV)
    assert got[0] == want[0], f"the CPU: {want}; {DEV}: {got}"
    if want[0] != "ok":
        assert got[1] == want[1]
        return None
    for r in (got[1] if isinstance(got[1], (list, tuple)) else [got[1]]):
        if isinstance(r, torch.Tensor) and r.device.type != "cpu":
            assert r.device.type == DEV
    w, g = flat(want[1]), flat(got[1])
    assert len(g) == len(w)
    for a, b in zip(g, w):
        if exact:
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(a, b)
    return got[1]


def weight(device, *shape):
    return torch.linspace(-1, 1, steps=torch.Size(shape).numel(), device=device).view(shape)


# Operators on a strided nested tensor x of three (n_i, 4) components.
OPS = {
    "add": lambda x: x + x,
    "mul_scalar": lambda x: x * 3,
    "sub": lambda x: x - x * 0.5,
    "softmax": lambda x: x.softmax(-1),
    "relu": F.relu,
    "gelu": F.gelu,
    "tanh": torch.tanh,
    "abs": torch.abs,
    "dropout_eval": lambda x: F.dropout(x, 0.5, training=False),
    "bmm": lambda x: torch.bmm(x, x.transpose(1, 2)),
    "matmul": lambda x: torch.matmul(x, x.transpose(1, 2)),
    "linear": lambda x: F.linear(x, weight(x.device, 3, 4), weight(x.device, 3)),
    "layer_norm": lambda x: F.layer_norm(x, (4,), weight(x.device, 4), weight(x.device, 4)),
    "to_padded_tensor": lambda x: x.to_padded_tensor(0.0),
    "to_padded_tensor_size": lambda x: x.to_padded_tensor(-1.0, (3, 4, 5)),
    "transpose_contiguous": lambda x: x.transpose(1, 2).contiguous(),
    "clone": lambda x: x.clone(),
    "unbind": lambda x: x.unbind(),
    "select": lambda x: x[1],
    "chunk": lambda x: x.chunk(2, -1),
    "narrow": lambda x: x.narrow(-1, 1, 2),
    "reshape": lambda x: x.reshape(3, -1, 2, 2),
    "view": lambda x: x.view(3, -1, 2, 2),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "ones_like": torch.ones_like,
    "zeros_like": torch.zeros_like,
    "to_float64": lambda x: x.to(torch.float64),
    "add_": lambda x: x.clone().add_(1),
    "mul_": lambda x: x.clone().mul_(x),
    "fill_": lambda x: x.clone().fill_(2),
    "nested_size": lambda x: x._nested_tensor_size(),
    "nested_strides": lambda x: x.transpose(1, 2)._nested_tensor_strides(),
    # The CPU's errors: the same exception and message on the device.
    "sum_without_keepdim": lambda x: x.sum(-1),
    "mean": lambda x: x.mean(-1),
    "layer_norm_without_weight": lambda x: F.layer_norm(x, (4,)),
    "add_mismatched": lambda x: x + torch.nested.nested_tensor(components()[:2], device=x.device),
}


@pytest.mark.parametrize("op", sorted(OPS))
def test_strided_nested_operator_matches_the_cpu(op):
    same_as_cpu(lambda d: OPS[op](nested(d)))


def test_nested_tensors_of_both_layouts_move_to_the_device_and_back():
    for layout in (torch.strided, torch.jagged):
        c = nested("cpu", layout)
        d = c.to(DEV)
        assert d.is_nested and d.device.type == DEV and d.layout == layout
        for a, b in zip(d.cpu().unbind(), c.unbind()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        made = nested(DEV, layout)
        assert made.device.type == DEV
        for a, b in zip(made.unbind(), c.unbind()):
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)
        # From device tensors.
        same = torch.nested.as_nested_tensor([t.to(DEV) for t in components(1)], layout=layout)
        assert same.device.type == DEV
        for a, b in zip(same.unbind(), components(1)):
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)
    # A copy from a CPU nested tensor into a device one.
    target = torch.empty_like(nested(DEV))
    assert target.copy_(nested("cpu", seed=1)) is target
    for a, b in zip(target.unbind(), components(1)):
        torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)


def test_strided_nested_metadata_stays_on_the_cpu_as_on_the_cpu():
    d = nested(DEV)
    assert d._nested_tensor_size().device.type == "cpu"
    assert d._nested_tensor_size().tolist() == [[2, 4], [3, 4], [1, 4]]
    assert d.size(0) == 3 and d.size(2) == 4 and d.dim() == 3


def test_strided_nested_views_alias_the_device_storage():
    d = nested(DEV).clone()
    first, row, t = d.unbind()[0], d[1], d.transpose(1, 2)
    d.add_(10)
    want = [c + 10 for c in components()]
    torch.testing.assert_close(first.cpu(), want[0], rtol=0, atol=0)
    torch.testing.assert_close(row.cpu(), want[1], rtol=0, atol=0)
    torch.testing.assert_close(t.unbind()[2].cpu(), want[2].t(), rtol=0, atol=0)
    # An in-place operator returns its own tensor, and writes through a component's view.
    assert d.mul_(2) is d
    torch.testing.assert_close(first.cpu(), want[0] * 2, rtol=0, atol=0)
    first.zero_()
    torch.testing.assert_close(d.unbind()[0].cpu(), torch.zeros(2, 4), rtol=0, atol=0)


def test_strided_nested_in_place_over_itself_matches_the_cpu():
    def run(device):
        x = nested(device).clone()
        x.add_(x)
        x.mul_(x.transpose(1, 2).transpose(1, 2))
        return x
    same_as_cpu(run)


def test_a_cpu_nested_tensor_beside_a_device_one_is_refused():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        nested(DEV) + nested("cpu")


@two_devices
def test_nested_tensors_of_two_devices_are_refused():
    with pytest.raises(RuntimeError, match=f"same device, but found at least two devices, {DEV}:0 "
                                           f"and {DEV}:1"):
        nested(f"{DEV}:0") + nested(f"{DEV}:1")
    on_one = nested(f"{DEV}:1")
    assert (on_one * 2).device == torch.device(f"{DEV}:1")
    assert on_one.softmax(-1).device == torch.device(f"{DEV}:1")


def test_a_view_of_a_device_buffer_as_a_nested_tensor_aliases_it():
    def run(device):
        buffer = torch.arange(12.0, device=device)
        sizes = torch.tensor([[2, 2], [2, 4]])
        strides = torch.tensor([[2, 1], [4, 1]])
        offsets = torch.tensor([0, 4])
        view = torch._nested_view_from_buffer(buffer, sizes, strides, offsets)
        buffer.mul_(10)
        return view
    assert same_as_cpu(run).is_nested


def test_strided_nested_operators_follow_the_fallback_policy():
    code = """
import warnings
warnings.simplefilter("ignore")
x = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], device='simdev')
print('to', (x * 2).unbind()[1].sum().item())
try:
    x.softmax(-1)
    print('ran')
except NotImplementedError as e:
    print('refused:', e)
"""
    env = {**os.environ, f"{ENV}FALLBACK_BLOCKLIST": "_softmax"}
    r = subprocess.run([sys.executable, "-c", renamed("import torch, torch_simdev\n" + code)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert "to 6.0" in r.stdout, r.stdout + r.stderr
    assert "refused: The operator 'aten::_softmax' is not implemented for " \
           f"{DEV} and its CPU fallback is blocked ({ENV}FALLBACK_BLOCKLIST)" in r.stdout, \
        r.stdout + r.stderr


def test_strided_nested_operators_count_in_the_fallback_report():
    d = nested(DEV)
    MOD.reset_fallback_report()
    d.softmax(-1)
    torch.bmm(d, d.transpose(1, 2))
    report = {op: n for op, n, _ in MOD.fallback_report()}
    assert report.get("aten::_softmax") == 1
    assert report.get("aten::bmm") == 1


def test_strided_nested_operators_warn_as_on_the_cpu():
    """Each call warns as on the CPU, PyTorch's warn-once warnings counted per call (the
    fallback's own nested tensors do not warn that the API is a prototype)."""
    def warned(device, f):
        x = nested(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f(x)
        return sorted(str(w.message) for w in caught)
    previous = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        calls = (lambda x: x + x, lambda x: x.softmax(-1), lambda x: x.to_padded_tensor(0.0),
                 lambda x: torch.bmm(x, x.transpose(1, 2)), lambda x: x.clone().add_(1))
        want = [warned("cpu", f) for f in calls]
        assert [warned(DEV, f) for f in calls] == want and all(want[:2])
    finally:
        torch.set_warn_always(previous)


def test_strided_nested_gradients_match_the_cpu():
    def run(device):
        x = nested(device, requires_grad=True)
        w = weight(device, 4, 4).requires_grad_()
        y = F.linear(x, w).softmax(-1)
        y = torch.bmm(y, x.transpose(1, 2)).to_padded_tensor(0.0)
        (y * weight(device, *y.shape)).sum().backward()
        return [g for g in x.grad.unbind()] + [w.grad]
    want = run("cpu")
    got = run(DEV)
    for a, b in zip(got, want):
        assert a.device.type == DEV
        torch.testing.assert_close(a.cpu(), b)


def test_strided_nested_operators_from_threads_match_the_cpu():
    want = [[t.clone() for t in (nested("cpu", seed=s).softmax(-1) * 2).unbind()]
            for s in range(4)]
    got, errors = [None] * 4, []

    def work(i):
        try:
            MOD.set_device(0)
            for _ in range(5):
                r = (nested(DEV, seed=i).softmax(-1) * 2).unbind()
            got[i] = [t.cpu() for t in r]
        except Exception as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for g, w in zip(got, want):
        for a, b in zip(g, w):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def encoder_layer(device):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0,
                                             batch_first=True)
    return layer.eval().to(device)


def sequences(device, layout=torch.strided, seed=3):
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randn(n, 8, generator=g) for n in (3, 5, 2)]
    return torch.nested.nested_tensor(parts, layout=layout, device=device)


def test_transformer_encoder_layer_fast_path_on_a_nested_input_matches_the_cpu():
    """Eval mode, no grad: TransformerEncoderLayer's fast path calls
    _transformer_encoder_layer_fwd on the nested tensor itself."""
    MOD.reset_fallback_report()
    got = same_as_cpu(lambda d: encoder_layer(d)(sequences(d)), exact=False)
    assert got.is_nested
    report = {op: n for op, n, _ in MOD.fallback_report()}
    assert report.get("aten::_transformer_encoder_layer_fwd") == 1


def test_transformer_encoder_fast_path_with_a_padding_mask_matches_the_cpu():
    """TransformerEncoder turns a padded batch and its key padding mask into a nested
    tensor (_nested_tensor_from_mask) and runs each layer's fast path on it."""
    mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    src = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(4))

    def run(device):
        enc = torch.nn.TransformerEncoder(encoder_layer(device), 2, enable_nested_tensor=True)
        return enc.eval()(src.to(device), src_key_padding_mask=mask.to(device))
    MOD.reset_fallback_report()
    same_as_cpu(run, exact=False)
    report = {op: n for op, n, _ in MOD.fallback_report()}
    assert report.get("aten::_nested_tensor_from_mask") == 1
    assert report.get("aten::_transformer_encoder_layer_fwd") == 2


def test_multihead_attention_on_a_nested_input_matches_the_cpu():
    def run(device):
        torch.manual_seed(0)
        mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval().to(device)
        x = sequences(device)
        return mha(x, x, x, need_weights=False)[0]
    assert same_as_cpu(run, exact=False).is_nested


class Block(torch.nn.Module):
    """A small pre-norm transformer block written with operators that both layouts have:
    layer_norm, linear, scaled_dot_product_attention, gelu."""

    def __init__(self, dim=8, heads=2):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.q, self.k, self.v = (torch.nn.Linear(dim, dim) for _ in range(3))
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.ff = torch.nn.Sequential(torch.nn.Linear(dim, 16), torch.nn.GELU(),
                                      torch.nn.Linear(16, dim))

    def forward(self, x):  # x: (batch, ragged sequence, dim)
        h, d = self.norm1(x), x.size(-1)
        heads = [f(h).unflatten(-1, (self.heads, d // self.heads)).transpose(1, 2)
                 for f in (self.q, self.k, self.v)]
        a = F.scaled_dot_product_attention(*heads).transpose(1, 2).flatten(-2)
        x = x + self.proj(a)
        return x + self.ff(self.norm2(x))


def test_transformer_block_on_jagged_nested_inputs_matches_the_cpu_with_gradients():
    def run(device):
        torch.manual_seed(0)
        block = Block().to(device)
        x = sequences(device, torch.jagged).requires_grad_()
        y = block(x)
        y.values().sum().backward()
        return [y, x.grad, block.q.weight.grad, block.v.bias.grad, block.ff[0].weight.grad]
    want, got = run("cpu"), run(DEV)
    assert got[0].is_nested and got[0].device.type == DEV
    for a, b in zip(flat(got), flat(want)):
        torch.testing.assert_close(a, b)


def test_transformer_block_on_strided_nested_inputs_matches_the_cpu():
    """The strided layout has no nested scaled_dot_product_attention on the CPU; the block
    runs with nn.MultiheadAttention's nested path and the same feed-forward."""
    def run(device):
        torch.manual_seed(0)
        block = Block().eval().to(device)
        mha = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval().to(device)
        x = sequences(device)
        h = block.norm1(x)
        x = x + mha(h, h, h, need_weights=False)[0]
        return x + block.ff(block.norm2(x))
    assert same_as_cpu(run, exact=False).is_nested


NESTED_OPINFO = ["abs", "add", "mul", "matmul", "bmm", "nn.functional.linear", "nn.functional.relu",
                 "clone", "select", "unsqueeze", "narrow", "to", "sum", "mean", "where"]


def test_nested_opinfo_samples_of_both_layouts_match_the_cpu():
    """The OpInfo comparison's nested samples (accelkit.testing._nested_samples: njt_op_db's,
    jagged and strided) for a few operators, with a comparison of this file's."""
    from accelkit.testing import _nested_samples as ns

    def to_cpu(x):
        if isinstance(x, torch.Tensor):
            return x.detach().cpu()
        if isinstance(x, (list, tuple)):
            return type(x)(to_cpu(e) for e in x)
        if isinstance(x, dict):
            return {k: to_cpu(v) for k, v in x.items()}
        return "cpu" if isinstance(x, (str, torch.device)) and str(x).startswith(DEV) else x

    def on_both(op, s, cpu):
        got = outcome(lambda d: op(s.input, *s.args, **s.kwargs), DEV)
        want = outcome(lambda d: op(cpu[0], *cpu[1], **cpu[2]), "cpu")
        assert got[0] == want[0], f"{op.name}: the CPU {want}; {DEV}: {got}"
        return None if want[0] != "ok" else (got[1], want[1])

    layouts = []

    def compare(want, got, op, dtype, what):
        layouts.append(what.split()[0])
        w, g = flat_all(want), flat_all(got)
        assert len(g) == len(w), what
        for a, b in zip(g, w):
            assert a.device.type in (DEV, "cpu")
            torch.testing.assert_close(a.cpu(), b, msg=lambda m: f"{op.name} {what}: {m}")

    def flat_all(x):
        if isinstance(x, (list, tuple)):
            return [t for e in x for t in flat_all(e)]
        return [x] if isinstance(x, torch.Tensor) else []

    ops = ns.ops()
    compared = 0
    for name in NESTED_OPINFO:
        compared += ns.forward(ops[name], torch.float32, DEV, 2, to_cpu, on_both, compare)
    assert compared >= len(NESTED_OPINFO) and {"jagged", "strided"} <= set(layouts)
