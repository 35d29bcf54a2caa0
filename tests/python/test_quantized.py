"""Quantized tensors on the device (docs/tensor-kinds.md, Note [Quantized tensors] in
include/accelkit/torch/quantized.hpp): creation per tensor and per channel, copies, int_repr,
dequantize and the views that alias natively; every other operator through PyTorch's QuantizedCPU
kernels under the fallback's rules; torch.ao's eager quantization and a PT2E model (torchao's
prepare_pt2e/convert_pt2e) giving the CPU's results."""
import copy
import io
import os
import subprocess
import sys
import warnings

import pytest
import torch

from backend import DEV, ENV, MOD, OPS, renamed, two_devices

# The quantized dtypes' creation functions warn of their deprecation in every call.
pytestmark = pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")

QDTYPES = [torch.quint8, torch.qint8, torch.qint32]


def _same(dev, cpu):
    """A device quantized tensor equal to a CPU one: dtype, scheme, parameters, integers."""
    assert dev.device.type == DEV and dev.is_quantized
    assert dev.dtype == cpu.dtype and dev.shape == cpu.shape and dev.qscheme() == cpu.qscheme()
    if cpu.qscheme() == torch.per_tensor_affine:
        assert (dev.q_scale(), dev.q_zero_point()) == (cpu.q_scale(), cpu.q_zero_point())
    else:
        assert dev.q_per_channel_axis() == cpu.q_per_channel_axis()
        assert torch.equal(dev.q_per_channel_scales().cpu(), cpu.q_per_channel_scales())
        assert torch.equal(dev.q_per_channel_zero_points().cpu(), cpu.q_per_channel_zero_points())
    assert torch.equal(dev.int_repr().cpu(), cpu.int_repr())


@pytest.mark.parametrize("dtype", QDTYPES)
def test_quantize_per_tensor_on_the_device_matches_the_cpu_and_round_trips(dtype):
    x = torch.randn(5, 7) * 3
    cpu = torch.quantize_per_tensor(x, 0.05, 2, dtype)
    dev = torch.quantize_per_tensor(x.to(DEV), 0.05, 2, dtype)
    _same(dev, cpu)
    assert dev.int_repr().device.type == DEV and dev.int_repr().dtype == cpu.int_repr().dtype
    deq = dev.dequantize()
    assert deq.device.type == DEV and torch.equal(deq.cpu(), cpu.dequantize())
    _same(cpu.to(DEV), cpu)                               # CPU -> device
    back = dev.cpu()                                      # device -> CPU
    assert back.device.type == "cpu" and torch.equal(back.int_repr(), cpu.int_repr())
    assert back.q_scale() == 0.05 and back.q_zero_point() == 2


@pytest.mark.parametrize("dtype", [torch.quint8, torch.qint8])
def test_quantize_per_channel_on_the_device_matches_the_cpu(dtype):
    torch.manual_seed(1)
    x = torch.randn(4, 6, 3)
    scales = torch.rand(6, dtype=torch.float64) * 0.1 + 0.01
    zps = torch.randint(-3, 4, (6,)) + (3 if dtype == torch.quint8 else 0)
    cpu = torch.quantize_per_channel(x, scales, zps, 1, dtype)
    dev = torch.quantize_per_channel(x.to(DEV), scales.to(DEV), zps.to(DEV), 1, dtype)
    _same(dev, cpu)
    assert dev.q_per_channel_scales().device.type == DEV
    assert torch.equal(dev.dequantize().cpu(), cpu.dequantize())
    _same(cpu.to(DEV), cpu)
    assert torch.equal(dev.cpu().dequantize(), cpu.dequantize())
    # Float zero points: the per_channel_affine_float_qparams scheme.
    fzps = torch.rand(6) * 2
    cpu_f = torch.quantize_per_channel(x, scales.float(), fzps, 1, torch.quint8)
    dev_f = cpu_f.to(DEV)
    assert dev_f.qscheme() == torch.per_channel_affine_float_qparams
    assert torch.equal(dev_f.dequantize().cpu(), cpu_f.dequantize())


def test_empty_quantized_tensors_are_made_in_device_memory():
    a = torch._empty_affine_quantized([2, 3], scale=0.5, zero_point=4, dtype=torch.qint8,
                                      device=DEV)
    assert a.device.type == DEV and a.dtype == torch.qint8 and a.q_scale() == 0.5
    assert a.q_zero_point() == 4 and a.shape == (2, 3)
    b = torch._empty_per_channel_affine_quantized(
        [3, 2], scales=torch.tensor([0.1, 0.2, 0.3]), zero_points=torch.tensor([0, 1, 2]), axis=0,
        dtype=torch.quint8, device=DEV)
    assert b.device.type == DEV and b.qscheme() == torch.per_channel_affine
    assert b.q_per_channel_zero_points().tolist() == [0, 1, 2]
    c = torch.empty_like(a)
    assert c.device == a.device and c.is_quantized and c.q_scale() == 0.5
    # A float copied into a quantized tensor is quantized with its parameters, as on the CPU.
    x = torch.randn(2, 3)
    ref = torch._empty_affine_quantized([2, 3], scale=0.5, zero_point=4, dtype=torch.qint8)
    a.copy_(x.to(DEV))
    ref.copy_(x)
    assert torch.equal(a.int_repr().cpu(), ref.int_repr())


def test_quantized_tensors_survive_save_load_and_deepcopy_on_the_device():
    cpu = [torch.quantize_per_tensor(torch.randn(3, 4), 0.1, 3, torch.quint8),
           torch.quantize_per_channel(torch.randn(3, 4), torch.tensor([0.1, 0.2, 0.3]),
                                      torch.tensor([1, 2, 3]), 0, torch.qint8)]
    for t in cpu:
        dev = t.to(DEV)
        _same(copy.deepcopy(dev), t)
        buf = io.BytesIO()
        torch.save(dev, buf)
        buf.seek(0)
        _same(torch.load(buf, weights_only=False), t)
    # A quantized dtype without parameters yet (torch.empty), as on the CPU.
    e = torch.empty(2, 3, dtype=torch.quint8, device=DEV)
    assert e.device.type == DEV and e.is_quantized and e.shape == (2, 3)


VIEWS = {
    "flatten": lambda q: q.flatten(),
    "ravel": lambda q: q.ravel(),
    "view": lambda q: q.view(6, 10),
    "reshape": lambda q: q.reshape(3, 20),
    "select": lambda q: q.select(1, 2),
    "transpose": lambda q: q.transpose(0, 2),
    "slice": lambda q: q[1:, ::2],
    "unsqueeze": lambda q: q.unsqueeze(1),
    "squeeze": lambda q: q.unsqueeze(0).squeeze(0),
    "permute": lambda q: q.permute(2, 0, 1),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_views_of_a_quantized_tensor_alias_its_device_memory(name):
    x = torch.randn(3, 4, 5)
    cpu = torch.quantize_per_tensor(x, 0.1, 10, torch.quint8)
    dev = cpu.to(DEV)
    v, ref = VIEWS[name](dev), VIEWS[name](cpu)
    assert v.device == dev.device
    assert v.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
    assert v.stride() == ref.stride() and v.storage_offset() == ref.storage_offset()
    _same(v, ref)
    assert torch.equal(v.dequantize().cpu(), ref.dequantize())


def test_per_channel_views_keep_their_axis_as_on_the_cpu():
    x = torch.randn(4, 3)
    cpu = torch.quantize_per_channel(x, torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
                                     torch.tensor([0, 1, 2]), 1, torch.qint8)
    dev = cpu.to(DEV)
    for f in (lambda q: q.unsqueeze(0), lambda q: q.unsqueeze(0).squeeze(0),
              lambda q: q.flatten(0)):
        _same(f(dev), f(cpu))


def test_operators_without_a_native_kernel_run_the_cpus_quantized_kernels():
    torch.manual_seed(2)
    a_cpu = torch.quantize_per_tensor(torch.randn(2, 3, 6, 6), 0.05, 64, torch.quint8)
    b_cpu = torch.quantize_per_tensor(torch.randn(2, 3, 6, 6), 0.04, 60, torch.quint8)
    a, b = a_cpu.to(DEV), b_cpu.to(DEV)
    from torch.ao.nn.quantized import functional as qF
    w = torch.quantize_per_tensor(torch.randn(4, 3, 3, 3) * 0.2, 0.01, 0, torch.qint8)
    cases = [
        lambda a, b: torch.ops.quantized.add(a, b, 0.1, 32),
        lambda a, b: torch.ops.quantized.mul(a, b, 0.1, 32),
        lambda a, b: torch.ops.quantized.cat([a, b], 1, 0.1, 32),
        lambda a, b: torch.relu(a),
        lambda a, b: torch.flip(a, (2, 3)),
        lambda a, b: torch.nn.functional.max_pool2d(a, 2),
        lambda a, b: torch.nn.functional.adaptive_avg_pool2d(a, 3),
        lambda a, b: torch.sigmoid(a),
        lambda a, b: torch.cat([a, a], 0),
        lambda a, b: torch.nn.functional.interpolate(a, scale_factor=2),
        lambda a, b: qF.conv2d(a, w.to(a.device), torch.zeros(4, device=a.device),
                               scale=0.2, zero_point=10),
    ]
    for i, f in enumerate(cases):
        want, got = f(a_cpu, b_cpu), f(a, b)
        assert got.device == a.device, i
        _same(got, want)
    assert torch.equal(torch.topk(a.flatten(), 5).values.dequantize().cpu(),
                       torch.topk(a_cpu.flatten(), 5).values.dequantize())
    assert torch.equal(a, a.clone()) and not torch.equal(a, b)
    report = OPS.fallback_report()
    assert "quantized::add" in report and "aten::flip" in report


def test_in_place_operators_write_the_device_tensor():
    x = torch.randn(3, 4)
    cpu = torch.quantize_per_tensor(x, 0.1, 10, torch.quint8)
    dev = cpu.to(DEV)
    ptr = dev.untyped_storage().data_ptr()
    mask = x > 0
    for t, m in ((cpu, mask), (dev, mask.to(DEV))):
        t.masked_fill_(m, 0.5)
        t[0].fill_(-0.3)
    assert dev.untyped_storage().data_ptr() == ptr
    _same(dev, cpu)
    # A float -> quantized copy and quantized -> float refusal as on the CPU.
    with pytest.raises(RuntimeError, match="Copying from quantized Tensor to non-quantized Tensor"):
        torch.empty(3, 4, device=DEV).copy_(dev)


def test_unsupported_quantized_dtypes_are_a_clear_error_naming_the_backend():
    q4 = torch.quantize_per_tensor(torch.rand(4, 4), 0.1, 0, torch.quint4x2)
    with pytest.raises(NotImplementedError,
                       match=f"{DEV}: quantized tensors of dtype QUInt4x2 are not supported "
                             f"on {DEV}"):
        q4.to(DEV)
    ok = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8).to(DEV)  # still usable
    assert ok.dequantize().cpu().shape == (4,)


@two_devices
def test_quantized_tensors_stay_on_their_device():
    cpu = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 3, torch.qint8)
    dev1 = cpu.to(f"{DEV}:1")
    assert MOD.current_device() == 0
    for r in (dev1, torch.relu(dev1), dev1.dequantize(), dev1.int_repr(), dev1.flatten(),
              torch.ops.quantized.add(dev1, dev1, 0.1, 0)):
        assert r.device == torch.device(f"{DEV}:1")
    dev0 = cpu.to(f"{DEV}:0")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ops.quantized.add(dev0, dev1, 0.1, 0)


def _run(code, **env):
    full = {**os.environ, **{renamed(k): v for k, v in env.items()}}
    return subprocess.run([sys.executable, "-W", "ignore", "-c",
                           renamed("import torch, torch_simdev\n" + code)],
                          capture_output=True, text=True, env=full, timeout=120)


def test_the_fallback_policy_and_block_list_apply_to_quantized_operators():
    code = """
q = torch.quantize_per_tensor(torch.randn(4), 0.1, 3, torch.quint8).to('simdev')
print('int_repr', q.int_repr().tolist() == q.cpu().int_repr().tolist())
try:
    torch.ops.quantized.add(q, q, 0.1, 0)
    print('ran')
except NotImplementedError as e:
    print('refused:', e)
"""
    r = _run(code, SIMDEV_FALLBACK="error")  # creation, copies and int_repr are native
    assert "int_repr True" in r.stdout, r.stdout + r.stderr
    assert f"refused: The operator 'quantized::add' is not implemented for {DEV} and its CPU " \
           f"fallback is disabled ({ENV}FALLBACK=error)" in r.stdout, r.stdout + r.stderr
    r = _run(code.replace("quantized.add(q, q, 0.1, 0)", "aten.flip(q, [0])"),
             SIMDEV_FALLBACK_BLOCKLIST="flip")
    assert f"{ENV}FALLBACK_BLOCKLIST" in r.stdout, r.stdout + r.stderr


def _captures():
    if not hasattr(torch.accelerator, "Graph") or \
            "stream_begin_capture" not in OPS.runtime_members():
        return False
    g = torch.accelerator.Graph()
    try:
        with torch.Stream(device=DEV):
            g.capture_begin()
        g.capture_end()
    except (RuntimeError, NotImplementedError):
        return False
    g.reset()
    return True


@pytest.mark.skipif(not _captures(), reason=f"{DEV} cannot capture graphs here")
def test_a_quantized_operator_is_refused_during_capture_as_the_dense_fallback_is():
    q = torch.quantize_per_tensor(torch.randn(16), 0.1, 3, torch.quint8).to(DEV)
    s = torch.Stream(device=DEV)
    g = torch.accelerator.Graph()
    with s:
        g.capture_begin()
        with pytest.raises(RuntimeError, match=r"aten::flip \(the CPU fallback"):
            torch.flip(q, (0,))
        with pytest.raises(RuntimeError, match="invalidated by aten::"):
            g.capture_end()
    assert torch.flip(q, (0,)).int_repr().cpu().tolist() == q.int_repr().cpu().flip(0).tolist()


class _SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.relu1 = torch.nn.ReLU()
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.relu2 = torch.nn.ReLU()
        self.skip = torch.ao.nn.quantized.FloatFunctional()
        self.pool = torch.nn.MaxPool2d(2)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        x = self.quant(x)
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.skip.add(y, self.relu2(self.conv2(y)))
        y = self.pool(y).flatten(1)
        return self.dequant(self.fc(y))


@pytest.mark.parametrize("engine", ["x86", "fbgemm", "qnnpack"])
def test_eager_quantization_of_a_small_cnn_matches_the_cpu(engine):
    if engine not in torch.backends.quantized.supported_engines:
        pytest.skip(f"PyTorch here has no {engine} engine")
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        torch.manual_seed(3)
        model = _SmallCNN().eval()
        model.qconfig = torch.ao.quantization.get_default_qconfig(engine)
        torch.ao.quantization.fuse_modules(model, [["conv1", "bn1", "relu1"], ["conv2", "relu2"]],
                                           inplace=True)
        torch.ao.quantization.prepare(model, inplace=True)
        for _ in range(4):
            model(torch.randn(4, 3, 8, 8))
        torch.ao.quantization.convert(model, inplace=True)
        x = torch.randn(2, 3, 8, 8)
        want = model(x)
        on_device = copy.deepcopy(model).to(DEV)
        got = on_device(x.to(DEV))
        assert got.device.type == DEV and got.dtype == torch.float32
        assert torch.equal(got.cpu(), want)
        # The quantized activations on the way are device tensors.
        q = on_device.quant(x.to(DEV))
        assert q.is_quantized and q.device.type == DEV
        mid = on_device.conv1(q)
        assert mid.is_quantized and mid.device.type == DEV
        _same(mid, model.conv1(model.quant(x)))
    finally:
        torch.backends.quantized.engine = before


def _torchao_pt2e():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
            from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
                X86InductorQuantizer, get_default_x86_inductor_quantization_config)
        except ImportError:
            return None
    quantizer = X86InductorQuantizer()
    quantizer.set_global(get_default_x86_inductor_quantization_config())
    return prepare_pt2e, convert_pt2e, quantizer


class _Pt2eNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, 3)
        self.fc = torch.nn.Linear(6 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def test_a_pt2e_quantized_model_runs_on_the_device_as_on_the_cpu():
    # In a child process: torch.export and torchao keep the exported modules (their device
    # parameters) in their own global state, which would stay allocated for the tests after it.
    try:
        import torchao  # noqa: F401
    except ImportError:
        pytest.skip("torchao (prepare_pt2e/convert_pt2e for torch 2.13) is not installed: "
                    "scripts/setup.sh installs it")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", "import test_quantized as t; t._pt2e_flow(); print('ok')"],
                       cwd=here, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(
                           [here, os.environ.get("PYTHONPATH", "")])})
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]


def _pt2e_flow():
    prepare_pt2e, convert_pt2e, quantizer = _torchao_pt2e()
    torch.manual_seed(4)
    model = _Pt2eNet().eval()
    x = torch.randn(2, 3, 8, 8)
    exported = torch.export.export(model, (x,)).module()
    prepared = prepare_pt2e(exported, quantizer)
    batches = [torch.randn(2, 3, 8, 8) for _ in range(3)]
    for b in batches:
        prepared(b)
    converted = convert_pt2e(prepared)
    ops = {str(n.target) for n in converted.graph.nodes if n.op == "call_function"}
    assert "quantized_decomposed.quantize_per_tensor.default" in ops
    want = converted(x)
    on_device = copy.deepcopy(converted).to(DEV)
    got = on_device(x.to(DEV))
    assert got.device.type == DEV
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    # The whole flow on the device: export, calibration (the observers' statistics), conversion.
    exported_dev = torch.export.export(copy.deepcopy(model).to(DEV), (x.to(DEV),)).module()
    prepared_dev = prepare_pt2e(exported_dev, quantizer)
    for b in batches:
        prepared_dev(b.to(DEV))
    converted_dev = convert_pt2e(prepared_dev)
    got = converted_dev(x.to(DEV))
    assert got.device.type == DEV
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
