"""Deterministic fill of new memory (Note [Deterministic fill of new memory] in
accelkit/torch/empty.hpp): under torch.use_deterministic_algorithms(True) with
torch.utils.deterministic.fill_uninitialized_memory, torch.empty, empty_strided, empty_like and
the growth of resize_ give NaN for floating and complex types and the largest value for integer
types and bool, as the CPU (and CUDA) do; with either flag off, nothing is filled.

The memory each check reads is a cached block that held other values just before (the caching
pool hands the block just freed to the next request of its size on the same stream; the tests
assert it is the same block), so that a missing fill shows as those values, not as fresh zeros."""
import pytest
import torch
import torch.utils.deterministic

from backend import DEV, MOD

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64,
          torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]


@pytest.fixture
def deterministic():
    """Sets (algorithms, fill_uninitialized_memory) for a test and restores them after."""
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)

    def set_flags(algorithms, fill):
        torch.use_deterministic_algorithms(algorithms)
        torch.utils.deterministic.fill_uninitialized_memory = fill

    yield set_flags
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.utils.deterministic.fill_uninitialized_memory = before[2]


def _dirty_block(numel, dtype):
    """The address of a freed cached block of `numel` elements of `dtype` that holds ones
    (False for bool, whose fill is True), which the next request of its size on the current
    stream gets."""
    t = torch.full((numel,), dtype != torch.bool, dtype=dtype, device=DEV)
    address = t.data_ptr()
    del t
    return address


def _expected(numel, dtype):
    """What the CPU's torch.empty gives under the flags (the reference)."""
    return torch.empty(numel, dtype=dtype)


def _same(device_tensor, cpu_tensor):
    return torch.equal(device_tensor.cpu(), cpu_tensor) if not (
        cpu_tensor.is_floating_point() or cpu_tensor.is_complex()) else bool(
        torch.isnan(device_tensor.cpu()).all() and torch.isnan(cpu_tensor).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_is_filled_as_on_the_cpu(deterministic, dtype):
    deterministic(True, True)
    numel = 1000
    reference = _expected(numel, dtype)
    if not (dtype.is_floating_point or dtype.is_complex):
        assert reference.eq(torch.iinfo(dtype).max if dtype != torch.bool else True).all()
    address = _dirty_block(numel, dtype)
    t = torch.empty(numel, dtype=dtype, device=DEV)
    assert t.data_ptr() == address  # the block that held other values
    assert _same(t, reference)


def test_empty_strided_and_empty_like_are_filled(deterministic):
    deterministic(True, True)
    address = _dirty_block(600, torch.float32)
    t = torch.empty_strided((20, 30), (1, 20), device=DEV)
    assert t.data_ptr() == address and torch.isnan(t.cpu()).all()
    del t
    source = torch.zeros(20, 30, dtype=torch.int32, device=DEV).t()
    address = _dirty_block(600, torch.int32)
    like = torch.empty_like(source)
    assert like.data_ptr() == address and not like.is_contiguous()
    assert like.cpu().eq(torch.iinfo(torch.int32).max).all()
    address = _dirty_block(600, torch.int64)
    kept = torch.empty((30, 20), dtype=torch.int64, device=DEV,
                       memory_format=torch.contiguous_format)
    assert kept.data_ptr() == address and kept.cpu().eq(torch.iinfo(torch.int64).max).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16], ids=str)
def test_resize_fills_only_the_elements_its_growth_added(deterministic, dtype):
    deterministic(True, True)
    t = torch.full((4,), 3, dtype=dtype, device=DEV)
    cpu = torch.full((4,), 3, dtype=dtype)
    address = _dirty_block(1000, dtype)
    t.resize_(1000)
    cpu.resize_(1000)
    assert t.data_ptr() == address  # the grown storage is the block that held ones
    assert torch.equal(t[:4].cpu(), cpu[:4])
    assert _same(t[4:], cpu[4:])
    # Within the storage it has, resize_ adds nothing and fills nothing.
    t[:10] = 5
    t.resize_(10)
    assert t.cpu().eq(5).all()


@pytest.mark.parametrize("flags", [(False, True), (True, False), (False, False)])
def test_nothing_is_filled_with_either_flag_off(deterministic, flags):
    deterministic(*flags)
    address = _dirty_block(1000, torch.float32)
    t = torch.empty(1000, device=DEV)
    assert t.data_ptr() == address and t.cpu().eq(1).all()  # the block's old contents
    del t
    address = _dirty_block(600, torch.float32)
    s = torch.empty_strided((20, 30), (1, 20), device=DEV)
    assert s.data_ptr() == address and s.cpu().eq(1).all()
    r = torch.full((4,), 3.0, device=DEV)
    address = _dirty_block(1000, torch.float32)
    r.resize_(1000)
    assert r.data_ptr() == address and r[4:].cpu().eq(1).all()


def test_the_fill_is_queued_on_the_current_stream(deterministic):
    deterministic(True, True)
    stream = MOD.Stream()
    with MOD.stream(stream):
        address = _dirty_block(1000, torch.float32)
        t = torch.empty(1000, device=DEV)
        assert t.data_ptr() == address
    stream.synchronize()
    assert torch.isnan(t.cpu()).all()
