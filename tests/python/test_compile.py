"""torch.compile on an accelkit backend (python/accelkit/compile/).

Compiling is slow (seconds per graph), so these tests run in their own ctest
entry (python.simdev.compile, which sets ACCELKIT_COMPILE_TESTS=1) and skip
in the directory-wide runs. Each test resets Dynamo (torch.compiler.reset())
and compiles on one Inductor thread. Models are small: the point is which
code runs where, and that it computes what eager and the CPU compute."""
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from backend import DEV, MOD, PACKAGE, renamed, simdev_only, two_devices

ENABLED = os.environ.get("ACCELKIT_COMPILE_TESTS") == "1"
pytestmark = pytest.mark.skipif(
    not ENABLED,
    reason="compile tests are slow: ctest python.simdev.compile runs them (ACCELKIT_COMPILE_TESTS=1)")

# Only where the tests run: reading the properties initializes the backend,
# which the directory-wide runs' other tests must not find done at collection.
HOST_VISIBLE = ENABLED and MOD.get_device_properties(0).get("host_visible_memory", False)
host_visible = pytest.mark.skipif(not HOST_VISIBLE, reason=f"{DEV}'s memory is not host-visible")

def _compile_module(sub=""):
    """The accelkit.compile package that installed the backend, or its module
    `sub` (kernels, cpu_checks, fake_conv)."""
    import importlib
    for name in (PACKAGE.__name__ + "._accelkit.compile", "accelkit.compile"):
        name += f".{sub}" if sub else ""
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(mod._backend, "name", None) == DEV:
            return mod
    raise AssertionError("no accelkit.compile module installed the backend")


@pytest.fixture(autouse=True)
def _reset_dynamo():
    import torch._inductor.config as iconfig
    torch.compiler.reset()
    with iconfig.patch(compile_threads=1):
        yield
    torch.compiler.reset()


def _run(code, timeout=300, **env):
    """Runs `code` in a child; its Inductor cache is a private one unless
    `env` names TORCHINDUCTOR_CACHE_DIR (the machine's could hand it graphs
    compiled elsewhere)."""
    with tempfile.TemporaryDirectory(prefix="accelkit-inductor-") as cache:
        full = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache,
                **{renamed(k): v for k, v in env.items()}}
        return subprocess.run([sys.executable, "-c", renamed(textwrap.dedent(code))],
                              capture_output=True, text=True, env=full, timeout=timeout)


# ---------------------------------------------------------------- device interface

def test_the_device_interface_answers_as_torch_cuda_s_does():
    from torch._dynamo.device_interface import get_interface_for_device
    di = get_interface_for_device(DEV)
    assert get_interface_for_device(f"{DEV}:0") is di
    assert di.is_available() and di.device_count() == MOD.device_count()
    assert di.current_device() == MOD.current_device() == 0
    assert di.exchange_device(-1) == -1 and di.current_device() == 0
    if MOD.device_count() > 1:
        assert di.exchange_device(1) == 0 and di.current_device() == 1
        assert di.maybe_exchange_device(0) == 1 and di.current_device() == 0
    s = di.Stream()
    assert isinstance(s, torch.Stream) and s.device.type == DEV
    assert isinstance(di.Event(), torch.Event)
    with di.stream(s):
        assert di.current_stream() == s
        assert di.get_raw_stream(0) == s.stream_id
    assert di.current_stream() != s
    di._set_stream_by_id(s.stream_id, s.device_index, s.device_type)
    assert di.current_stream() == s
    di.set_stream(MOD.default_stream())
    props = di.get_device_properties(0)
    assert props.multi_processor_count >= 1 and props.name == MOD.get_device_name(0)
    assert di.Worker.get_device_properties(0).total_memory == props.total_memory
    assert di.get_compute_capability(0) == ""  # the schema has no such numbers
    assert di.is_dtype_supported(torch.float32)
    assert di.is_bf16_supported() == ("bfloat16" in props.dtypes)
    assert not di.is_triton_capable()
    before = di.memory_allocated(0)
    x = torch.empty(1 << 20, device=DEV)
    assert di.memory_allocated(0) >= before + x.nbytes
    di.synchronize(0)
    with di.device(0):
        assert di.current_device() == 0


def test_installing_the_backend_imports_neither_dynamo_nor_inductor():
    # Nor does it check or replace the fake convolution (reading PyTorch's
    # sources cost 2-4 ms of `import torch`): Dynamo's registration does.
    r = _run("""
        import sys, torch, torch_simdev
        from torch._subclasses import fake_impls
        print('dynamo' if 'torch._dynamo' in sys.modules else 'no dynamo',
              'inductor' if 'torch._inductor' in sys.modules else 'no inductor')
        replaced = lambda: [getattr(f, '_accelkit', False)
                            for f in fake_impls.op_implementations_dict.values()].count(True)
        print('replaced at install:', replaced())
        import torch._dynamo
        print('replaced with dynamo:', replaced())
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr
    assert "no dynamo no inductor" in r.stdout, r.stdout
    assert "replaced at install: 0" in r.stdout and "replaced with dynamo: 4" in r.stdout, r.stdout


def test_inductor_s_cpu_checks_are_replaced_only_where_their_source_still_matches():
    import torch._inductor.compile_fx  # noqa: F401  (registers)
    from torch._inductor import ir, utils
    mod = _compile_module("cpu_checks")
    assert mod._changed(mod._CPU_CHECKS) is None  # unwraps the replaced helpers
    assert getattr(ir.is_cpu, "_accelkit", False) and ir.is_cpu(torch.device(DEV, 0)) == HOST_VISIBLE
    assert not ir.is_cpu(torch.device("meta")) and ir.is_cpu(torch.device("cpu"))
    assert utils.get_current_backend("cpu") == "cpp"
    why = mod._changed({("torch._inductor.ir", "is_cpu"): "a line PyTorch never had"})
    assert why and DEV in why and "torch._inductor.ir.is_cpu" in why and torch.__version__ in why


@host_visible
def test_the_fake_convolution_is_replaced_only_where_its_source_and_table_still_match():
    # Checked when Dynamo or Inductor registers the backend, as Inductor's
    # helpers are (the same _changed), not at install (see
    # Note [The convolution's strides under fake tensors]). Here they match ...
    from torch._subclasses import fake_impls
    mod = _compile_module("fake_conv")
    assert mod._conv_error is None
    assert mod._changed(mod._CONV_CHECKS, mod._CONV_WHAT, mod._CONV_NOTE) is None
    assert getattr(fake_impls.op_implementations_dict[torch.ops.aten.convolution.default],
                   "_accelkit", False)
    # ... and in a child whose table holds another implementation for one of
    # the four operators when torch.compile registers the backend, nothing is replaced and
    # compiling for the device raises, naming the backend and the entry
    # (without the check the SDK wrapped the other implementation and compiled).
    r = _run("""
        import torch
        from torch._subclasses import fake_impls
        table, op = fake_impls.op_implementations_dict, torch.ops.aten.convolution_backward.default
        theirs = table[op]
        table[op] = lambda fake_mode, func, *args, **kwargs: theirs(fake_mode, func, *args, **kwargs)
        import torch_simdev
        import torch._inductor.config as c
        c.compile_threads, c.fx_graph_cache = 1, False  # a cached graph is not generated again
        try:
            torch.compile(lambda x: x.sin() + 1)(torch.ones(4, device='simdev'))
            print('compiled')
        except Exception as e:
            print('refused:', type(e).__name__, ' '.join(str(e).split()))
        print('replaced:', [getattr(f, '_accelkit', False) for f in table.values()].count(True))
    """, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "replaced: 0" in r.stdout and "refused: " in r.stdout, r.stdout
    assert renamed("RuntimeError: simdev: the device's convolution under torch.compile's fake "
                   "tensors was checked against PyTorch 2.13's torch._subclasses.fake_impls."
                   "op_implementations_dict[aten.convolution_backward.default]") in r.stdout, r.stdout


# --------------------------------------------------------------- models and checks

def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.Tanh(),
                         nn.Linear(64, 10))


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def _train(model, x, y, device, compiled, steps=2, memory_format=torch.contiguous_format):
    """`steps` SGD steps of `model` (a copy, on `device`, its parameters and
    `x` in `memory_format`), forward and backward compiled or eager; the
    losses, parameters and gradients, and the strides of the last forward's
    output and of the gradients."""
    import copy
    m = copy.deepcopy(model).to(device, memory_format=memory_format)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    fwd = torch.compile(m) if compiled else m
    x, y = x.to(device, memory_format=memory_format), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        out = fwd(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    strides = [out.stride()] + [p.grad.stride() for p in m.parameters()]
    return (torch.stack(losses), [p.detach().cpu() for p in m.parameters()],
            [p.grad.cpu() for p in m.parameters()]), strides


def _close(a, b, **tol):
    for u, v in zip(a, b, strict=True):
        if isinstance(u, list):
            _close(u, v, **tol)
        else:
            torch.testing.assert_close(u, v, **tol)


def _kernels_on_device(fn):
    """Runs fn counting generated kernels run for the device."""
    mod = _compile_module("kernels")
    calls = []
    orig = mod.wait_for_stream

    def counting(index):
        calls.append(index)
        orig(index)
    mod.wait_for_stream = counting
    try:
        out = fn()
    finally:
        mod.wait_for_stream = orig
    return out, len(calls)


@host_visible
@pytest.mark.parametrize("make,shape,memory_format", [
    (_mlp, (16, 32), torch.contiguous_format), (_cnn, (4, 3, 8, 8), torch.contiguous_format),
    (_cnn, (4, 3, 8, 8), torch.channels_last)], ids=["mlp", "cnn", "cnn_channels_last"])
def test_a_compiled_training_step_matches_eager_and_the_compiled_cpu(make, shape, memory_format):
    # The CNNs' graphs get Inductor's layout optimization, as on the CPU
    # (channels-last convolutions inside the graph), and the channels-last
    # one takes channels-last inputs and parameters: the convolution's
    # strides under fake tensors are the device's (Note [The convolution's
    # strides under fake tensors]), or the generated stride checks fail.
    model = make()
    torch.manual_seed(1)
    x, y = torch.randn(shape), torch.randint(0, 10, (shape[0],))
    ((got, strides), kernels) = _kernels_on_device(
        lambda: _train(model, x, y, DEV, compiled=True, memory_format=memory_format))
    assert kernels > 0  # generated kernels ran on the device's memory
    want, eager_strides = _train(model, x, y, DEV, compiled=False, memory_format=memory_format)
    _close(got, want, rtol=1e-5, atol=1e-5)
    torch.compiler.reset()
    # The same generated code on the same memory contents: the CPU's results.
    cpu, cpu_strides = _train(model, x, y, "cpu", compiled=True, memory_format=memory_format)
    _close(got, cpu, rtol=1e-6, atol=1e-6)
    assert strides == cpu_strides
    if memory_format == torch.channels_last:
        assert eager_strides == strides  # eagerly, the CPU's strides too
        return  # the inference graph below is the plain CNN's
    # Inference (an inference graph: Inductor's layout choice for
    # convolutions differs, Note [Inductor's CPU checks]).
    torch.compiler.reset()
    m = model.to(DEV).eval()
    with torch.no_grad():
        _close([torch.compile(m)(x.to(DEV)).cpu()], [m(x.to(DEV)).cpu()], rtol=1e-5, atol=1e-5)


@host_visible
def test_a_compiled_channels_last_convolution_has_the_strides_of_eager_and_the_compiled_cpu():
    # A graph that ends in the convolution returns its output as the
    # generated code made it, checked against what the fake convolution
    # promised. With the fake's own answer (contiguous, PyTorch's for a
    # PrivateUse1 device) the generated stride check fails; the SDK's
    # convolution (the CPU's) returns channels-last, as eagerly (see
    # Note [The convolution's strides under fake tensors]).
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    outs = {}
    for device in (DEV, "cpu"):
        torch.compiler.reset()
        m = conv.to(device, memory_format=torch.channels_last)
        outs[device] = (torch.compile(m)(x.to(device)), m(x.to(device)))
    (compiled, eager), (cpu_compiled, _) = outs[DEV], outs["cpu"]
    assert eager.is_contiguous(memory_format=torch.channels_last)
    assert compiled.stride() == eager.stride() == cpu_compiled.stride()
    _close([compiled.cpu()], [cpu_compiled], rtol=1e-5, atol=1e-5)


@host_visible
def test_layout_optimization_answers_for_the_device_as_for_the_cpu(monkeypatch):
    # GraphLowering.decide_layout_opt gives a graph of the device's
    # convolutions the CPU's answer (channels-last convolutions inside the
    # graph, where oneDNN is there); PyTorch's own answers no for a
    # PrivateUse1 device (Note [Inductor's CPU checks]).
    from torch._inductor import config as iconfig
    from torch._inductor import graph
    _compile_module("cpu_checks")._patch_cpu_checks()  # before the spy: it checks the source it replaces
    answers = []
    decide = graph.GraphLowering.decide_layout_opt

    def spying_on(answer):
        """Inductor's decide_layout_opt replaced by `answer`, whose answers
        go to `answers`."""
        def spy(gm, *, is_inference):
            answers.append(answer(gm, is_inference=is_inference))
            return answers[-1]
        monkeypatch.setattr(graph.GraphLowering, "decide_layout_opt", staticmethod(spy))
    spying_on(decide)
    model = _cnn()
    torch.manual_seed(1)
    x, y = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
    seen = {}
    with iconfig.patch(fx_graph_cache=False):  # a cached graph is not lowered again
        for device in (DEV, "cpu"):
            torch.compiler.reset()
            answers.clear()
            _train(model, x, y, device, compiled=True, steps=1)
            seen[device] = list(answers)
    assert seen[DEV] == seen["cpu"] and len(seen["cpu"]) == 2  # forward and backward graphs
    if torch.backends.mkldnn.is_available():
        assert seen["cpu"][0], seen  # the forward graph, whose convolution it is
    assert getattr(decide, "_accelkit", False)  # the SDK's version, over PyTorch's
    torch.compiler.reset()
    answers.clear()
    spying_on(decide.__wrapped__)
    with iconfig.patch(fx_graph_cache=False):
        _train(model, x, y, DEV, compiled=True, steps=1)
    assert answers and not any(answers), answers  # PyTorch's own: no layout optimization


class _Attention(nn.Module):
    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv, self.out, self.norm = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), nn.LayerNorm(dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1),
                              float("-inf")).softmax(-1)
        return x + self.out((att @ v).transpose(1, 2).reshape(b, t, d))


@host_visible
def test_an_attention_block_matches_eager_and_the_cpu():
    # Forward only (the training steps above cover backward graphs): one
    # graph per side keeps the test short.
    torch.manual_seed(0)
    block, x = _Attention(), torch.randn(2, 8, 32)

    def run(device, compiled):
        m = _Attention().to(device)
        m.load_state_dict(block.state_dict())
        with torch.no_grad():
            return [(torch.compile(m) if compiled else m)(x.to(device)).cpu()]

    (got, kernels) = _kernels_on_device(lambda: run(DEV, True))
    assert kernels > 0
    _close(got, run(DEV, False), rtol=1e-5, atol=1e-5)
    torch.compiler.reset()
    _close(got, run("cpu", True), rtol=1e-6, atol=1e-6)


def _views(x, y):
    # transposes, slices with steps, an expand, a view's in-place update and
    # an input mutated through a view
    a = x.t()[1:, ::2].reshape(-1, 2).unsqueeze(0).expand(3, -1, -1)
    b = a.sum(0).narrow(0, 1, 4)
    y[:, 1:].mul_(2)
    c = y.view(-1)[::3].flip(0)
    d = torch.cat([b.flatten(), c]).view(2, -1).transpose(0, 1).contiguous()
    d[::2] += 1
    return d, a.diagonal(dim1=1, dim2=2)


@host_visible
def test_a_view_heavy_graph_with_an_input_mutated_through_a_view():
    torch.manual_seed(0)
    x, y = torch.randn(8, 6), torch.randn(4, 6)
    want = _views(x.to(DEV), y_eager := y.to(DEV))
    yc = y.to(DEV)
    (got, kernels) = _kernels_on_device(lambda: torch.compile(_views)(x.to(DEV), yc))
    assert kernels > 0
    _close([g.cpu() for g in got], [w.cpu() for w in want], rtol=0, atol=0)
    torch.testing.assert_close(yc.cpu(), y_eager.cpu(), rtol=0, atol=0)
    torch.compiler.reset()  # and the compiled CPU's: outputs, their strides, the mutated input
    cpu = torch.compile(_views)(x, y_cpu := y.clone())
    _close([g.cpu() for g in got], list(cpu), rtol=0, atol=0)
    assert [g.stride() for g in got] == [c.stride() for c in cpu]
    torch.testing.assert_close(yc.cpu(), y_cpu, rtol=0, atol=0)


def _count_recompiles(device):
    from torch._dynamo.testing import CompileCounterWithBackend
    torch.compiler.reset()
    cnt = CompileCounterWithBackend("inductor")
    f = torch.compile(lambda x: (x.relu() * 2).sum(-1), backend=cnt)
    outs = [f(torch.arange(n * 3, dtype=torch.float32, device=device).view(n, 3) - 4)
            for n in (2, 3, 5, 7)]
    return cnt.frame_count, [o.cpu() for o in outs]


@host_visible
def test_recompilations_and_dynamic_shapes_as_on_the_cpu():
    frames, got = _count_recompiles(DEV)
    cpu_frames, want = _count_recompiles("cpu")
    assert frames == cpu_frames == 2  # static, then one dynamic graph for every other size
    _close(got, want, rtol=0, atol=0)


@host_visible
@two_devices
def test_a_graph_on_the_second_device_allocates_its_buffers_there():
    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    assert MOD.current_device() == 0
    (out, kernels) = _kernels_on_device(
        lambda: torch.compile(lambda t: (t.exp() + 1).sum(1))(x.to(f"{DEV}:1")))
    assert kernels > 0 and out.device == torch.device(DEV, 1)
    torch.testing.assert_close(out.cpu(), (x.exp() + 1).sum(1))


# ----------------------------------------------------------------- stream order

@host_visible
@simdev_only
@pytest.mark.parametrize("cpp_wrapper", [False, True], ids=["python_wrapper", "cpp_wrapper"])
def test_compiled_kernels_wait_for_the_current_stream(cpp_wrapper):
    # A held stream (simdev's knob) keeps an asynchronous copy into x queued
    # (released from a driver thread 200 ms later); the compiled kernel must
    # read x after the copy lands. Without the wait it reads the zeros
    # (checked: with wait_for_stream a no-op, and with the C++ wrapper's
    # accelkit_wait_for_stream emptied, out is all ones).
    import re
    import torch._inductor.config as iconfig
    from torch._inductor.utils import run_and_get_code
    with iconfig.patch(cpp_wrapper=cpp_wrapper):
        f = torch.compile(lambda x: x * 2 + 1)
        src = torch.arange(4096, dtype=torch.float32).pin_memory()
        _, code = run_and_get_code(f, torch.zeros(4096, device=DEV))  # outside the hold
        if cpp_wrapper:  # the wait is the line before the kernel's call
            assert re.search(r"accelkit_wait_for_stream\(\d+\);\s*\n\s*cpp_fused\w*\(",
                             "\n".join(code)), "\n".join(code)[-3000:]
        x = torch.zeros(4096, device=DEV)
        MOD.synchronize()
        s = MOD.current_stream()
        gate = torch.ops.simdev_driver.hold(s)
        x.copy_(src, non_blocking=True)
        torch.ops.simdev_driver.release_later(gate, 200)
        out = f(x)
    assert torch.equal(out.cpu(), src * 2 + 1)


@host_visible
def test_the_cpp_wrapper_runs_generated_kernels_and_refuses_aten_operators():
    # Buffers on the graph's device, kernels after the stream; an ATen
    # operator (here addmm) has no C shim for the device (Note [The C++ wrapper]).
    import torch._inductor.config as iconfig
    x = torch.arange(12, dtype=torch.float32).view(3, 4)
    dev = f"{DEV}:{MOD.device_count() - 1}"
    with iconfig.patch(cpp_wrapper=True):
        (out, kernels) = _kernels_on_device(
            lambda: torch.compile(lambda t: (t.exp() + 1).sum(1))(x.to(dev)))
        assert out.device == torch.device(dev)
        assert kernels == 0  # the C++ wrapper waits in C++, not through wait_for_stream
        torch.testing.assert_close(out.cpu(), (x.exp() + 1).sum(1))
        torch.compiler.reset()
        lin = nn.Linear(4, 2).to(DEV)
        with pytest.raises(Exception, match="C shim") as e:
            torch.compile(lambda t: lin(t).relu())(x.to(DEV))
    assert f"{DEV}: Inductor's C++ wrapper" in str(e.value) and "addmm" in str(e.value)


# ----------------------------------------------------------------- the codegen slot

@host_visible
def test_a_vendor_scheduling_registered_in_the_slot_generates_the_kernels():
    import torch._inductor.config as iconfig
    mod = _compile_module()
    made = []

    class Counting(mod.HostVisibleScheduling):
        def codegen_node(self, node):
            made.append(node.get_name())
            return super().codegen_node(node)

    mod.register_codegen(Counting)
    try:
        with iconfig.patch(fx_graph_cache=False):
            out = torch.compile(lambda x: (x.exp() + 1).sum(0))(torch.ones(4, 3, device=DEV))
    finally:
        mod.register_codegen(None)  # back to the defaults
    assert made, "the registered scheduling generated no kernel"
    torch.testing.assert_close(out.cpu(), torch.full((3,), 4 * (1 + torch.e)))
    with pytest.raises(ValueError, match=DEV):
        mod.register_codegen("not a class")


# ------------------------------------------------------- without host-visible memory

@simdev_only
def test_without_host_visible_memory_a_clear_error_and_eager_fallback():
    r = _run("""
        import torch, torch_simdev
        import torch._dynamo, torch._inductor.config as c
        c.compile_threads = 1
        f = lambda x: x.sin() + 1
        x = torch.ones(4, device='simdev')
        try:
            torch.compile(f)(x)
        except Exception as e:
            print('refused:', type(e).__name__, str(e).splitlines()[0][:400])
        torch._dynamo.reset()
        torch._dynamo.config.suppress_errors = True
        print('eager', torch.equal(torch.compile(f)(x).cpu(), f(x).cpu()))
        torch._dynamo.reset()
        torch._dynamo.config.suppress_errors = False
        print('aot_eager', torch.equal(torch.compile(f, backend='aot_eager')(x).cpu(), f(x).cpu()))
    """, SIMDEV_HOST_VISIBLE="0", SIMDEV_DEVICE_COUNT="1")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "refused: " in r.stdout and "needs host-visible device memory" in r.stdout, r.stdout
    assert "simdev:0" in r.stdout and "eager True" in r.stdout and "aot_eager True" in r.stdout


@simdev_only
def test_a_graph_cached_with_host_visible_memory_is_compiled_again_without_it(tmp_path):
    # The device's custom pass puts its host visibility into the caches'
    # keys, so the second child, sharing the first one's Inductor cache but
    # without host-visible memory, misses it and the scheduling refuses at
    # compile time: a BackendCompilerFailed, and with suppress_errors the
    # graph runs eagerly, rather than a graph found in the cache that raises
    # at its first kernel. A third child like the first finds the graph in
    # the cache (Note [Generated code from the cache]).
    code = """
        import torch, torch_simdev
        import torch._dynamo, torch._inductor.config as c
        from torch._dynamo.utils import counters
        c.compile_threads = 1
        f = lambda x: x.sin() + 1
        x = torch.zeros(4, device='simdev')
        try:
            print('result', torch.compile(f)(x).cpu().tolist())
        except Exception as e:  # InductorError, a BackendCompilerFailed
            print('refused:', isinstance(e, torch._dynamo.exc.BackendCompilerFailed),
                  ' '.join(str(e).split()))
        torch._dynamo.reset()
        torch._dynamo.config.suppress_errors = True
        try:
            print('suppressed', torch.compile(f)(x).cpu().tolist())
        except Exception as e:
            print('raised:', type(e).__name__, ' '.join(str(e).split()))
        print('hits', counters['inductor']['fxgraph_cache_hit'])
    """
    env = dict(TORCHINDUCTOR_CACHE_DIR=str(tmp_path), SIMDEV_DEVICE_COUNT="1",
               TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    first = _run(code, SIMDEV_HOST_VISIBLE="1", **env)
    assert "result [1.0, 1.0, 1.0, 1.0]" in first.stdout, first.stdout + first.stderr[-3000:]
    second = _run(code, SIMDEV_HOST_VISIBLE="0", **env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "refused: True" in second.stdout, second.stdout  # at compile time, not run time
    assert renamed("simdev: Inductor's C++ code generator") in second.stdout, second.stdout
    assert renamed("simdev:0 does not have") in second.stdout, second.stdout
    assert "suppressed [1.0, 1.0, 1.0, 1.0]" in second.stdout, second.stdout
    assert "hits 0" in second.stdout, second.stdout
    third = _run(code, SIMDEV_HOST_VISIBLE="1", **env)
    assert "result [1.0, 1.0, 1.0, 1.0]" in third.stdout, third.stdout + third.stderr[-3000:]
    assert "hits 0" not in third.stdout, third.stdout  # the cache still serves its configuration


@host_visible
def test_wait_for_stream_checks_each_device_once(monkeypatch):
    # The backstop asks once per device; None (the current device) joins the
    # checked ones once every device has been, so a None call does not ask
    # again (Note [Generated code from the cache]).
    mod = _compile_module("kernels")
    monkeypatch.setattr(mod, "_allowed", set())
    mod.wait_for_stream(None)
    for i in range(MOD.device_count()):
        mod.wait_for_stream(i)
    mod.wait_for_stream(None)
    assert mod._allowed == {None, *range(MOD.device_count())}
    # Without host-visible memory it refuses, by name, and does not offer
    # suppress_errors: a graph that runs is past Dynamo's fallback.
    monkeypatch.setattr(mod, "_allowed", set())
    monkeypatch.setattr(mod, "host_visible", lambda index: False)
    with pytest.raises(RuntimeError, match=f"needs host-visible device memory, which {DEV}:0") as e:
        mod.wait_for_stream(0)
    assert "suppress_errors" not in str(e.value) and "Inductor's cache" in str(e.value)
    assert 0 not in mod._allowed


@host_visible
def test_the_cpp_wrapper_calls_dispatched_operators_on_the_device():
    # Finding: the device-generic shims (aoti_torch_index_put_out) and the
    # runtime lookup of a custom operator go through the dispatcher (the
    # backend's operators); they were refused as device-specific C shims.
    import torch._inductor.config as iconfig
    from torch._inductor.utils import run_and_get_code

    @torch.library.custom_op("accelkit_tc2::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    def f(t, i, v):
        t = t + 1
        t.index_put_((i,), v, accumulate=True)
        return twice(t) + 1

    t, i, v = torch.zeros(6), torch.tensor([0, 2, 2]), torch.tensor([1.0, 2.0, 3.0])
    with iconfig.patch(cpp_wrapper=True):
        out, code = run_and_get_code(torch.compile(f), t.to(DEV), i.to(DEV), v.to(DEV))
    src = "\n".join(code)
    assert "accelkit_tc2" in src and "aoti_torch_simdev" not in src, src[-3000:]
    assert out.device.type == DEV
    torch.testing.assert_close(out.cpu(), f(t, i, v))


def test_aot_inductor_is_refused_by_name():
    class M(nn.Module):
        def forward(self, x):
            return x.sin() + 1

    x = torch.ones(4, device=DEV)
    ep = torch.export.export(M(), (x,))
    with pytest.raises(Exception, match="AOTInductor") as e:
        torch._inductor.aoti_compile_and_package(ep)
    assert f"{DEV}: AOTInductor" in str(e.value)


@host_visible
def test_a_non_cpp_vendor_scheduling_refuses_the_cpp_wrapper_by_name():
    import torch._inductor.config as iconfig
    from torch._inductor.codegen.simd import SIMDScheduling
    mod = _compile_module()

    class NotCpp(SIMDScheduling):
        pass

    mod.register_codegen(NotCpp)
    try:
        with iconfig.patch(cpp_wrapper=True, fx_graph_cache=False):
            with pytest.raises(Exception, match="NotCpp") as e:
                torch.compile(lambda x: x.exp() + 1)(torch.ones(4, device=DEV))
    finally:
        mod.register_codegen(None)
    assert f"{DEV}: torch._inductor.config.cpp_wrapper=True" in str(e.value)
