"""Copy-on-write storage (torch._lazy_clone) on every device, whichever device is current, as on
CUDA: the clone shares the original's memory until either side is written; the first write
copies the data on the storage's own device (never the current one), and the other side keeps
its values. The last reference left takes the memory over without a copy, and every block goes
back to its own device's pool.

Values are read back through the CPU, which waits for the copies queued on the device, so a
copy queued with the wrong device or stream fails here and not in a later test."""
import gc
import threading

import pytest
import torch

from backend import DEV, MOD, two_devices

N = 6

# Writes that reach the storage by different paths: the backend's fill_, an arithmetic kernel, a
# copy from the CPU, an indexed store, and data_ptr(), which hands out the memory for writing.
WRITES = {
    "fill_": lambda t: t.fill_(7.0),
    "add_": lambda t: t.add_(1.0),
    "copy_": lambda t: t.copy_(torch.full((N,), 3.0)),
    "setitem": lambda t: t.__setitem__(0, 9.0),
    "data_ptr": lambda t: t.data_ptr(),
}


def _expected(write, values):
    t = values.clone()
    if write != "data_ptr":
        WRITES[write](t)
    return t


def _address(t):
    # The address of the data without asking for it writable, which would copy it.
    return torch._C._data_address(t)


def _sync():
    for d in range(MOD.device_count()):
        torch.accelerator.synchronize(d)


def _cases():
    # (device of the tensor, device current while cloning and writing)
    return [pytest.param(d, c, id=f"on{d}-current{c}", marks=[two_devices] if d or c else [])
            for d in (0, 1) for c in (0, 1)]


def _setup(device, current):
    MOD.set_device(device)
    a = torch.arange(N, dtype=torch.float32, device=f"{DEV}:{device}")
    MOD.set_device(current)
    return a


def _check_apart(a, c, device):
    """`a` and `c` hold their own memory, on `device`."""
    for t in (a, c):
        assert t.device == torch.device(DEV, device)
        assert t.untyped_storage().device == torch.device(DEV, device)
    assert _address(a) != _address(c)


@pytest.mark.parametrize("device,current", _cases())
def test_a_lazy_clone_shares_the_memory_until_written(device, current):
    a = _setup(device, current)
    c = torch._lazy_clone(a)
    assert c.device == a.device
    assert torch._C._is_cow_tensor(a) and torch._C._is_cow_tensor(c)
    assert _address(c) == _address(a)
    assert c.cpu().tolist() == list(range(N))
    assert MOD.current_device() == current


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("device,current", _cases())
def test_a_write_to_the_clone_copies_on_the_storages_device(device, current, write):
    a = _setup(device, current)
    c = torch._lazy_clone(a)
    WRITES[write](c)
    assert MOD.current_device() == current
    _sync()
    assert c.cpu().tolist() == _expected(write, torch.arange(N, dtype=torch.float32)).tolist()
    assert a.cpu().tolist() == list(range(N))
    _check_apart(a, c, device)
    assert not torch._C._is_cow_tensor(c)


@pytest.mark.parametrize("device,current", _cases())
def test_a_write_to_the_original_leaves_the_clone_as_it_was(device, current):
    a = _setup(device, current)
    c = torch._lazy_clone(a)
    a.mul_(10.0)  # copies: the clone still shares the memory
    _sync()
    assert a.cpu().tolist() == [10.0 * i for i in range(N)]
    assert c.cpu().tolist() == list(range(N))
    _check_apart(a, c, device)
    # The clone is now the only reference to the shared memory: it takes it over.
    shared = _address(c)
    c.add_(1.0)
    _sync()
    assert _address(c) == shared
    assert c.cpu().tolist() == [i + 1.0 for i in range(N)]
    assert a.cpu().tolist() == [10.0 * i for i in range(N)]
    _check_apart(a, c, device)


@pytest.mark.parametrize("device,current", _cases())
def test_clones_of_clones_and_of_views_write_apart_and_free_on_their_device(device, current):
    gc.collect()
    _sync()
    before = [MOD.memory_allocated(d) for d in range(MOD.device_count())]
    a = _setup(device, current)
    c1 = torch._lazy_clone(a)
    c2 = torch._lazy_clone(c1)
    tail = torch._lazy_clone(a[2:])  # a view: the clone keeps its offset into the storage
    assert tail.storage_offset() == 2
    assert len({_address(t) for t in (a, c1, c2)}) == 1
    del a  # the others still share the memory
    c1.fill_(-1.0)
    tail.add_(100.0)
    _sync()
    assert c1.cpu().tolist() == [-1.0] * N
    assert tail.cpu().tolist() == [100.0 + i for i in range(2, N)]
    assert c2.cpu().tolist() == list(range(N))  # the last reference: takes the memory over
    c2.sub_(1.0)
    _sync()
    assert c2.cpu().tolist() == [i - 1.0 for i in range(N)]
    assert {t.untyped_storage().device for t in (c1, c2, tail)} == {torch.device(DEV, device)}
    del c1, c2, tail
    gc.collect()
    _sync()
    # Every block went back to the pool of the device that holds it.
    assert [MOD.memory_allocated(d) for d in range(MOD.device_count())] == before


@pytest.mark.parametrize("device,current", _cases())
def test_a_clone_written_in_another_thread_copies_on_the_storages_device(device, current):
    a = _setup(device, current)
    clones = [torch._lazy_clone(a) for _ in range(4)]
    errors = []
    start = threading.Barrier(len(clones))

    def write(i, t):
        try:
            MOD.set_device(current)  # a new thread's current device is its own
            start.wait()
            t.add_(float(i + 1))
            torch.accelerator.synchronize(device)
        except BaseException as e:  # noqa: BLE001 -- reported by the main thread
            errors.append((i, repr(e)))

    threads = [threading.Thread(target=write, args=(i, t)) for i, t in enumerate(clones)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors
    _sync()
    assert a.cpu().tolist() == list(range(N))
    for i, t in enumerate(clones):
        assert t.cpu().tolist() == [x + i + 1.0 for x in range(N)], i
        _check_apart(a, t, device)
    assert len({_address(t) for t in clones}) == len(clones)
