"""A vendor's per-tensor backend metadata (Note [Backend metadata]): what carries it (torch.save and
torch.load, clone, detach and nn.Parameter, in-place operators), what keeps the destination's
(copy_, load_state_dict) and what does not carry it (views, other results, deepcopy, loading onto the
CPU). On every backend through PyTorch's own serialization functions
(torch._C._set_tensor_metadata / _get_tensor_metadata, which torch.load and torch.save call); on
simdev through its private layout tag (torch.ops.simdev_driver.set_layout_tag / layout_tag)."""
import copy
import io
import threading

import pytest
import torch

from backend import DEV, simdev_only, two_devices

KEY = f"{DEV}.layout=nz"


def meta(t):
    return torch._C._get_tensor_metadata(t)


def tagged(value="nz", *shape):
    """A device tensor with field "layout" set through PyTorch's deserialization hook."""
    t = torch.arange(6.0, device=DEV).reshape(2, 3) if not shape else torch.ones(*shape, device=DEV)
    torch._C._set_tensor_metadata(t, {f"{DEV}.layout={value}": True})
    return t


def saved_and_loaded(obj, **load_args):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_args)


def test_fields_round_trip_through_pytorchs_serialization_functions():
    t = torch.zeros(3, device=DEV)
    assert meta(t) == {}
    torch._C._set_tensor_metadata(t, {KEY: True, f"{DEV}.note=a=b": True, f"{DEV}.empty=": True})
    # A value may hold '=' or be empty; the field is what comes before the first '='.
    assert meta(t) == {KEY: True, f"{DEV}.note=a=b": True, f"{DEV}.empty=": True}
    # PyTorch's own bits beside them, and another backend's keys ignored.
    c = torch.zeros(2, dtype=torch.complex64, device=DEV)
    torch._C._set_tensor_metadata(c, {"conj": True, KEY: True, "otherdev.layout=nz": True})
    assert c.is_conj() and meta(c) == {"conj": True, KEY: True}


def test_torch_save_and_load_keep_the_fields():
    t = tagged()
    for args in ({}, {"weights_only": False}, {"map_location": DEV}):
        loaded = saved_and_loaded(t, **args)
        assert loaded.device == t.device and meta(loaded) == {KEY: True}
        assert torch.equal(loaded.cpu(), t.cpu())
    # Tensors of one file keep their own fields; an untagged one stays untagged.
    a, b, plain = saved_and_loaded([tagged("a"), tagged("b"), torch.ones(2, device=DEV)])
    assert meta(a) == {f"{DEV}.layout=a": True} and meta(b) == {f"{DEV}.layout=b": True}
    assert meta(plain) == {}


@two_devices
def test_loading_onto_another_device_of_the_backend_keeps_the_fields():
    loaded = saved_and_loaded(tagged(), map_location=f"{DEV}:1")
    assert loaded.device == torch.device(f"{DEV}:1") and meta(loaded) == {KEY: True}


def test_loading_onto_the_cpu_drops_the_fields():
    t = tagged()
    assert meta(t) == {KEY: True}
    loaded = saved_and_loaded(t, map_location="cpu")
    assert loaded.device.type == "cpu" and meta(loaded) == {}
    assert meta(loaded.to(DEV)) == {}


def test_clone_detach_parameter_and_in_place_operators_carry_the_fields():
    t = tagged()
    assert meta(t.clone()) == {KEY: True}
    assert meta(torch.clone(t, memory_format=torch.contiguous_format)) == {KEY: True}
    assert meta(t.detach()) == {KEY: True} and meta(t.data) == {KEY: True}
    assert meta(torch.nn.Parameter(t)) == {KEY: True}
    t.add_(1)
    t.resize_(6)
    assert meta(t) == {KEY: True}
    assert torch.equal(t.clone().cpu(), torch.arange(1.0, 7.0))
    t.set_(torch.ones(3, device=DEV))
    assert meta(t) == {KEY: True} and torch.equal(t.cpu(), torch.ones(3))


def test_a_shallow_copy_does_not_see_later_changes():
    t = tagged("a")
    d = t.detach()
    torch._C._set_tensor_metadata(t, {f"{DEV}.layout=b": True})
    assert meta(t) == {f"{DEV}.layout=b": True} and meta(d) == {f"{DEV}.layout=a": True}


def test_copy_keeps_the_destinations_fields():
    src = tagged("a")
    dst = tagged("b")
    dst.copy_(src)
    assert meta(dst) == {f"{DEV}.layout=b": True} and torch.equal(dst.cpu(), src.cpu())
    plain = torch.zeros(2, 3, device=DEV)
    plain.copy_(src)
    assert meta(plain) == {}


def test_state_dict_round_trip_and_load_state_dict():
    model = torch.nn.Linear(3, 2).to(DEV)
    torch._C._set_tensor_metadata(model.weight, {KEY: True})
    assert meta(model.weight) == {KEY: True}
    state = saved_and_loaded(model.state_dict())
    assert meta(state["weight"]) == {KEY: True} and meta(state["bias"]) == {}
    # load_state_dict copies into the module's tensors: they keep their own.
    other = torch.nn.Linear(3, 2).to(DEV)
    other.load_state_dict(state)
    assert meta(other.weight) == {} and torch.equal(other.weight.cpu(), model.weight.cpu())


def test_views_other_results_and_deepcopy_do_not_carry_the_fields():
    t = tagged()
    not_carried = {
        "index": t[0], "view": t.view(6), "transpose": t.t(), "add": t + 1,
        "to dtype": t.to(torch.float64), "to cpu": t.cpu(), "deepcopy": copy.deepcopy(t),
        "empty_like": torch.empty_like(t), "from_dlpack": torch.from_dlpack(t),
    }
    assert {name: meta(x) for name, x in not_carried.items() if meta(x)} == {}
    assert meta(t) == {KEY: True}


@two_devices
def test_a_copy_to_another_device_does_not_carry_the_fields():
    t = tagged()
    assert meta(t) == {KEY: True} and meta(t.to(f"{DEV}:1")) == {}


def test_malformed_keys_of_the_backend_are_value_errors():
    t = torch.zeros(2, device=DEV)
    with pytest.raises(ValueError, match=rf"^{DEV}: torch.load: malformed backend metadata key '{DEV}.layout'"):
        torch._C._set_tensor_metadata(t, {f"{DEV}.layout": True})
    with pytest.raises(ValueError, match=rf"^{DEV}: torch.load: a metadata field is a non-empty name .* got 'a-b'"):
        torch._C._set_tensor_metadata(t, {f"{DEV}.a-b=1": True})
    assert meta(t) == {}  # unchanged, and still usable
    torch._C._set_tensor_metadata(t, {KEY: True, f"{DEV}.other=x": False})  # false: not set
    assert meta(t) == {KEY: True}


def test_clone_of_tagged_tensors_from_many_threads():
    t = tagged()
    errors = []

    def work(i):
        try:
            own = torch.zeros(4, device=DEV)
            torch._C._set_tensor_metadata(own, {f"{DEV}.layout=t{i}": True})
            for _ in range(50):
                assert meta(t.clone()) == {KEY: True}
                assert meta(own.clone()) == {f"{DEV}.layout=t{i}": True}
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


# simdev's private layout tag: a vendor's use of the SDK's metadata functions.
@simdev_only
def test_simdev_layout_tag_set_clone_copy_and_save_load():
    ops = torch.ops.simdev_driver
    t = torch.arange(6.0, device=DEV).reshape(2, 3)
    assert ops.layout_tag(t) is None
    ops.set_layout_tag(t, "nz")
    assert ops.layout_tag(t) == "nz" and meta(t) == {"simdev.layout=nz": True}
    assert ops.layout_tag(t.clone()) == "nz"
    dst = torch.zeros(2, 3, device=DEV)
    ops.set_layout_tag(dst, "blocked16")
    dst.copy_(t)
    assert ops.layout_tag(dst) == "blocked16"
    loaded = saved_and_loaded({"t": t, "dst": dst})
    assert ops.layout_tag(loaded["t"]) == "nz" and ops.layout_tag(loaded["dst"]) == "blocked16"
    assert torch.equal(loaded["t"].cpu(), t.cpu())
    # Not carried: views, other results, loading onto the CPU.
    assert ops.layout_tag(t[1]) is None and ops.layout_tag(t * 2) is None
    assert meta(saved_and_loaded(t, map_location="cpu")) == {}
    ops.set_layout_tag(t, None)
    assert ops.layout_tag(t) is None and meta(t) == {}
    assert ops.layout_tag(saved_and_loaded(t)) is None


@simdev_only
def test_simdev_layout_tag_errors():
    ops = torch.ops.simdev_driver
    with pytest.raises(ValueError, match="^simdev: set_backend_meta: expected a tensor of simdev, got cpu"):
        ops.set_layout_tag(torch.zeros(2), "nz")
    with pytest.raises(ValueError, match="^simdev: backend_meta: expected a tensor of simdev, got cpu"):
        ops.layout_tag(torch.zeros(2))
    t = torch.zeros(2, device=DEV)
    with pytest.raises(ValueError, match="^simdev: set_layout_tag: a layout tag is not empty"):
        ops.set_layout_tag(t, "")
    assert ops.layout_tag(t) is None
    ops.set_layout_tag(t, "nz")
    assert ops.layout_tag(t) == "nz"
