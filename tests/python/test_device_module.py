"""torch.simdev, the device module accelkit builds for any backend
(python/accelkit): torch.cuda's names with torch.cuda's semantics, the
devices' generators, and the package's installation."""
import importlib
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import accelkit
from accelkit.testing.names import CUDA_ONLY  # the kit's names group checks the rest

from backend import DEV, MOD, OPS, renamed, two_devices


def _python(code: str, **env) -> str:
    """Runs `code` in a fresh interpreter with torch_simdev imported; its stdout."""
    full = dict(os.environ, **{renamed(k): v for k, v in env.items()})  # SIMDEV_X: <ENV>X
    out = subprocess.run([sys.executable, "-c", renamed("import torch, torch_simdev\n" + code)],
                         env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


# ------------------------------------------------------------------ parity

def test_the_kits_list_of_cuda_only_names_is_current():
    # The conformance kit's names group (accelkit.testing, run by the ctests
    # conformance.py.*) checks that MOD has every other name of torch.cuda
    # with its parameters; its list holds no name that torch.cuda dropped or
    # that the SDK's device module has.
    assert sorted(n for n in CUDA_ONLY if n not in torch.cuda.__all__) == []
    assert sorted(n for n in CUDA_ONLY if hasattr(MOD, n)) == []


def test_submodules_are_importable_by_their_torch_names():
    amp = importlib.import_module(f"torch.{DEV}.amp")
    rnd = importlib.import_module(f"torch.{DEV}.random")  # import torch.<name>.random
    assert amp is MOD.amp and rnd is MOD.random
    assert issubclass(MOD.amp.autocast, torch.amp.autocast)


def test_install_again_returns_the_module_and_another_name_is_refused():
    assert accelkit.install(DEV) is MOD
    with pytest.raises(RuntimeError, match=f"'{DEV}' already.*one (such )?slot"):
        accelkit.install("other")
    with pytest.raises(ValueError, match="lower-case identifier, got 'Bad-Name'"):
        accelkit.install("Bad-Name")


def test_a_library_that_does_not_register_the_name_is_refused(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", "import accelkit; accelkit.install('nosuch', None)"],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0"))  # an installed simdev not loaded
    assert out.returncode != 0
    assert "does not register the backend 'nosuch'" in out.stderr


def test_init_initializes_and_initialized_follows_it():
    out = _python(f"m = torch.{DEV}\n"
                  "print(m._initialized, m.is_initialized())\n"
                  "m.init()\n"
                  "print(m._initialized, m.is_initialized())")
    assert out.split() == ["False", "False", "True", "True"]


@two_devices
def test_device_of_default_stream_and_stream_context():
    x = torch.ones(2, device=f"{DEV}:1")
    with MOD.device_of(x):
        assert MOD.current_device() == 1
    assert MOD.current_device() == 0
    with MOD.device_of(torch.ones(2)):  # a CPU tensor changes nothing
        assert MOD.current_device() == 0
    d = MOD.default_stream(1)
    assert isinstance(d, MOD.Stream) and d.device == torch.device(f"{DEV}:1")
    assert MOD.current_stream(1) == d
    s = MOD.Stream(1)
    assert isinstance(s, torch.Stream) and s != d
    with MOD.StreamContext(s):
        assert MOD.current_stream(1) == s
        assert MOD.current_stream(0) == MOD.default_stream(0)
    assert MOD.current_stream(1) == d
    with MOD.stream(None):
        assert MOD.current_stream() == MOD.default_stream()
    with pytest.raises(IndexError, match=f"{DEV}.*7"):
        MOD.default_stream(7)
    e = MOD.Event(enable_timing=True)
    e.record(s)
    e.synchronize()
    assert e.query()
    with pytest.raises(ValueError, match=f"{DEV}.*interprocess=True with enable_timing=True"):
        MOD.Event(interprocess=True, enable_timing=True)
    if getattr(torch.ops, DEV).ipc_has_events():
        # An event another process can wait for (tests/python/test_ipc.py).
        p = MOD.Event(interprocess=True)  # of the current device
        with pytest.raises(ValueError, match=f"{DEV}.*{DEV}:0.*{DEV}:1"):
            p.record(s)
        p.record(MOD.Stream(0))
        p.synchronize()
        assert p.query() and p.device == torch.device(f"{DEV}:0")
        handle = p.ipc_handle()
        assert isinstance(handle, bytes) and len(handle) == 64
        with pytest.raises(RuntimeError, match=f"{DEV}.*interprocess=True"):
            e.ipc_handle()  # not made for it
    else:
        with pytest.raises(RuntimeError, match=f"{DEV}.*no inter-process event.*interprocess=True"):
            MOD.Event(interprocess=True)


def test_memory_functions_of_torch_cuda():
    MOD.empty_cache()
    MOD.reset_peak_memory_stats(0)
    x = torch.empty(3 << 20, dtype=torch.uint8, device=f"{DEV}:0")
    assert MOD.max_memory_reserved(0) >= MOD.memory_reserved(0) >= 3 << 20
    assert MOD.memory_allocated(0) >= 3 << 20
    nested = MOD.memory_stats_as_nested_dict(0)
    assert nested["allocated_bytes"]["all"]["current"] == MOD.memory_stats(0)[
        "allocated_bytes.all.current"]
    summary = MOD.memory_summary(0)
    assert f"{DEV} memory summary, device ID 0" in summary
    assert "  3072 KiB" in summary  # the allocation, in the "Allocated memory" row
    assert len(MOD.memory_summary(0, abbreviated=True)) < len(summary)
    segments = MOD.memory_snapshot()
    assert any(s["device"] == 0 and s["total_size"] >= 3 << 20 for s in segments)
    with pytest.raises(ValueError, match=f"{DEV}.*mempool_id=5"):
        MOD.memory_snapshot(mempool_id=5)
    free, total = MOD.mem_get_info(0)
    assert MOD.device_memory_used(0) == total - free > 0
    assert f"process {os.getpid():>10d}" in MOD.list_gpu_processes(0)
    with pytest.warns(FutureWarning):
        assert MOD.memory_cached(0) == MOD.memory_reserved(0)
    del x


@two_devices
def test_device_capability_and_peer_access():
    cap = MOD.get_device_capability(1)
    assert torch.float16 in cap["supported_dtypes"]
    assert MOD.can_device_access_peer(0, 0)
    assert isinstance(MOD.can_device_access_peer(0, 1), bool)
    with pytest.raises(IndexError, match=f"{DEV}.*9"):
        MOD.can_device_access_peer(0, 9)


# ------------------------------------------------------------- generators

@two_devices
def test_generators_are_typed_by_device():
    assert torch.Generator(device=f"{DEV}:1").device == torch.device(f"{DEV}:1")
    assert torch.Generator(device=DEV).device == torch.device(f"{DEV}:0")
    gens = MOD.default_generators
    assert [g.device for g in gens] == [torch.device(f"{DEV}:0"), torch.device(f"{DEV}:1")]
    assert torch.Generator(device=f"{DEV}:1").clone_state().device == torch.device(f"{DEV}:1")
    with pytest.raises(IndexError, match=f"{DEV}.*5"):
        torch.Generator(device=f"{DEV}:5")


def test_a_generator_of_another_device_type_is_refused_as_on_cuda():
    with pytest.raises(RuntimeError, match=f"Expected a '{DEV}' device type for generator but found 'cpu'"):
        torch.randn(3, device=DEV, generator=torch.Generator())
    x = torch.empty(4, device=DEV)
    with pytest.raises(RuntimeError, match=f"Expected a '{DEV}' device type for generator but found 'cpu'"):
        x.uniform_(generator=torch.Generator())


@two_devices
def test_a_device_generator_draws_as_the_cpu_generator_of_the_same_seed():
    g = torch.Generator(device=f"{DEV}:1").manual_seed(5)
    c = torch.Generator().manual_seed(5)
    for _ in range(2):  # the device generator advances as the CPU's does
        torch.testing.assert_close(torch.randn(6, device=f"{DEV}:1", generator=g).cpu(),
                                   torch.randn(6, generator=c), rtol=0, atol=0)
    torch.testing.assert_close(torch.rand(3, device=f"{DEV}:1", generator=g).cpu(),
                               torch.rand(3, generator=c), rtol=0, atol=0)
    # A generator of device 1 serves a tensor of device 0 too (CUDA checks the type only).
    torch.testing.assert_close(torch.rand(3, device=f"{DEV}:0", generator=g).cpu(),
                               torch.rand(3, generator=c), rtol=0, atol=0)
    assert g.initial_seed() == 5


@two_devices
def test_default_generators_are_per_device_and_seeded_by_torch_manual_seed():
    torch.manual_seed(11)
    a0 = torch.rand(4, device=f"{DEV}:0").cpu()
    a1 = torch.rand(4, device=f"{DEV}:1").cpu()
    torch.testing.assert_close(a0, a1, rtol=0, atol=0)  # same seed, separate generators
    MOD.manual_seed_all(11)
    MOD.set_device(1)
    MOD.manual_seed(12)  # the current device only
    assert MOD.initial_seed() == 12 and MOD.initial_seed(0) == 11
    torch.testing.assert_close(torch.rand(4, device=f"{DEV}:0").cpu(), a0, rtol=0, atol=0)


@two_devices
def test_seeds_reproduce_across_runs_and_start_where_cuda_starts():
    code = (f"print(torch.{DEV}.initial_seed(0), torch.randn(3, device='{DEV}:1').tolist())\n"
            f"torch.manual_seed(3); print(torch.randn(3, device='{DEV}:0').tolist())")
    first, second = _python(code), _python(code)
    assert first == second
    assert first.split()[0] == "67280421310721"  # PyTorch's default seed, as CUDA's and the CPU's


@two_devices
def test_seed_and_seed_all_seed_with_a_random_number():
    MOD.seed_all()
    seeds = [MOD.initial_seed(i) for i in range(2)]
    assert seeds[0] == seeds[1]
    MOD.seed()
    assert MOD.initial_seed(0) != seeds[0]  # 1 in 2**64 to fail


@two_devices
def test_rng_states_per_device_round_trip():
    MOD.manual_seed_all(1)
    states = MOD.get_rng_state_all()
    assert len(states) == 2 and all(s.dtype == torch.uint8 for s in states)
    a = [torch.rand(3, device=f"{DEV}:{i}").cpu() for i in range(2)]
    MOD.set_rng_state_all(states)
    for i in range(2):
        torch.testing.assert_close(torch.rand(3, device=f"{DEV}:{i}").cpu(), a[i], rtol=0, atol=0)
    MOD.set_rng_state(states[0], f"{DEV}:1")
    torch.testing.assert_close(torch.rand(3, device=f"{DEV}:1").cpu(), a[0], rtol=0, atol=0)
    assert torch.equal(MOD.get_rng_state(torch.device(DEV, 1)),
                       MOD.get_rng_state(1))


@two_devices
def test_fork_rng_restores_the_device_states():
    MOD.manual_seed_all(2)
    with torch.random.fork_rng(device_type=DEV, devices=[0, 1]):
        inside = [torch.rand(3, device=f"{DEV}:{i}").cpu() for i in range(2)]
    after = [torch.rand(3, device=f"{DEV}:{i}").cpu() for i in range(2)]
    for a, b in zip(inside, after):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with warnings.catch_warnings():  # "initialize every device": both are, here
        warnings.simplefilter("ignore")
        with torch.random.fork_rng(device_type=DEV):
            torch.rand(3, device=f"{DEV}:1")
    torch.testing.assert_close(torch.rand(3, device=f"{DEV}:1").cpu(),
                               torch.rand(3, device=f"{DEV}:0").cpu(), rtol=0, atol=0)


def test_rng_functions_refuse_a_device_out_of_range():
    for call in (lambda: MOD.get_rng_state(2), lambda: MOD.get_rng_state(f"{DEV}:3"),
                 lambda: MOD.set_rng_state(torch.get_rng_state(), 2),
                 lambda: MOD.initial_seed(-5)):
        with pytest.raises(IndexError, match=rf"{DEV}: invalid device index (2|3|-5): {DEV} has {MOD.device_count()} "):
            call()
    with pytest.raises(ValueError, match=f"expected a {DEV} device, got cpu"):
        MOD.get_rng_state("cpu")


@two_devices
def test_malformed_rng_states_are_refused_clearly():
    good = MOD.get_rng_state(0)
    with pytest.raises(TypeError, match=f"{DEV}: the RNG state of {DEV}:0 must be a CPU ByteTensor.*got a float tensor on cpu"):
        MOD.set_rng_state(good.float(), 0)
    with pytest.raises(RuntimeError, match=f"{DEV}: the RNG state of {DEV}:1 must be a contiguous ByteTensor of {good.numel()} bytes.*got 10 bytes"):
        MOD.set_rng_state(good[:10], 1)
    with pytest.raises(TypeError, match=f"{DEV}.*CPU ByteTensor"):
        MOD.set_rng_state(good.to(DEV), 0)
    MOD.set_rng_state(good, 0)  # the generator is unharmed
    assert torch.equal(MOD.get_rng_state(0), good)


def test_dropout_draws_from_the_device_generator():
    torch.manual_seed(4)
    x = torch.ones(64, device=DEV)
    a = F.dropout(x, 0.5).cpu()
    torch.manual_seed(4)
    b = F.dropout(x, 0.5).cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert 0 < (a == 0).sum() < 64


def test_events_of_the_device_module_time_each_other():
    # torch.Event.elapsed_time takes only an exact torch.Event as its
    # argument; the device module's Event class times itself.
    start = MOD.Event(enable_timing=True)
    end = MOD.Event(enable_timing=True)
    start.record()
    (torch.ones(1 << 16, device=DEV) * 2).sum()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0
    plain = torch.Event(DEV, enable_timing=True)
    plain.record()
    plain.synchronize()
    assert start.elapsed_time(plain) > 0
    with pytest.raises(ValueError, match=f"{DEV}.*recorded"):
        start.elapsed_time(MOD.Event(enable_timing=True))  # never recorded
    with pytest.raises(ValueError, match=f"{DEV}.*cpu"):
        start.elapsed_time(torch.Event("cpu"))
    with pytest.raises(TypeError, match=DEV):
        start.elapsed_time(3)


@two_devices
def test_per_process_memory_fraction_reads_back_what_was_set():
    assert MOD.get_per_process_memory_fraction(0) == 1.0
    MOD.set_per_process_memory_fraction(0.5, 1)
    try:
        assert MOD.get_per_process_memory_fraction(1) == 0.5
        assert MOD.get_per_process_memory_fraction(0) == 1.0
        with pytest.raises(ValueError, match=f"{DEV}.*1.5"):
            MOD.set_per_process_memory_fraction(1.5, 1)
        assert MOD.get_per_process_memory_fraction(1) == 0.5  # unchanged
        with pytest.raises(IndexError, match=DEV):
            MOD.get_per_process_memory_fraction(7)
    finally:
        MOD.set_per_process_memory_fraction(1.0, 1)


def test_host_memory_stats_count_the_pinned_pool_as_cuda_names_them():
    MOD.synchronize()
    MOD.empty_cache()  # device caches
    OPS.host_empty_cache()
    MOD.reset_peak_host_memory_stats()
    MOD.reset_accumulated_host_memory_stats()
    before = MOD.host_memory_stats()
    pinned = [torch.empty(1 << 20, dtype=torch.uint8).pin_memory() for _ in range(3)]
    during = MOD.host_memory_stats()
    assert during["active_requests.current"] == before["active_requests.current"] + 3
    assert during["active_bytes.current"] >= before["active_bytes.current"] + 3 * (1 << 20)
    assert during["allocations.current"] >= during["active_requests.current"]
    assert during["allocated_bytes.current"] >= during["active_bytes.current"]
    assert during["active_requests.allocated"] >= 3
    del pinned
    after = MOD.host_memory_stats()
    assert after["active_requests.current"] == before["active_requests.current"]
    assert after["active_requests.peak"] >= before["active_requests.current"] + 3
    assert after["active_requests.freed"] >= 3
    nested = MOD.host_memory_stats_as_nested_dict()
    assert nested["active_requests"]["current"] == after["active_requests.current"]
    assert list(after) == sorted(after)
    MOD.reset_peak_host_memory_stats()
    assert MOD.host_memory_stats()["active_requests.peak"] == after["active_requests.current"]
    MOD.reset_accumulated_host_memory_stats()
    assert MOD.host_memory_stats()["active_requests.freed"] == 0
