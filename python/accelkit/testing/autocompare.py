"""Autocompare: the backend also runs chosen operators on the CPU, at run
time, and reports (or raises on) a result that differs beyond tolerance.

Set before the backend is installed (import torch_<name>)::

    <NAME>_AUTOCOMPARE=mm,add,nn ops...|all   the operators: ATen names, with or without
                                              "aten::" and the overload ("add", "add.Tensor")
    <NAME>_AUTOCOMPARE_ACTION=warn|raise      warn (AutocompareWarning, the default) or raise
                                              AutocompareMismatch (a RuntimeError)
    <NAME>_AUTOCOMPARE_TOL=rtol,atol          tolerance (default: assert_close's per dtype)
    <NAME>_AUTOCOMPARE_DUMP=DIR               each mismatch also writes DIR/<n>-<op>.pt:
                                              the operator, its arguments and both results
                                              (CPU tensors); replay(path) runs it again

or call enable(name, ops, ...) yourself. It is a TorchDispatchMode pushed for
the thread that installs the backend (and autograd's threads, which inherit
it): every operator with a tensor (or device argument) of the backend,
whose name is listed, runs as usual and then on CPU copies of its
arguments, copied before it ran (in-place and out= operators compare what
they wrote). Operators whose values cannot agree are never compared: the
random ones (PyTorch's nondeterministic_seeded tag) and those that return
uninitialized memory (empty...). An operator that fails on the CPU only
warns once that it cannot be compared. A debugging aid: it slows every
operator and torch.compile refuses to trace under it.
"""
import itertools
import os
import threading
import warnings

import torch
from torch.utils._python_dispatch import (TorchDispatchMode, _disable_current_modes,
                                          _get_current_dispatch_mode, _pop_mode, _push_mode)
from torch.utils._pytree import tree_flatten, tree_map


class AutocompareMismatch(RuntimeError):
    """An operator's result on the device differs from the CPU's."""


class AutocompareWarning(UserWarning):
    """An operator's result on the device differs from the CPU's (or could not be compared)."""


UNINITIALIZED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                 "empty_permuted", "resize_", "set_", "record_stream", "_pin_memory"}


def _describe(x, values):
    """An argument as the device saw it; its values (min, max) from `values`,
    its CPU copy made before the operator ran."""
    if isinstance(x, torch.Tensor):
        text = (f"tensor(shape={tuple(x.shape)}, dtype={x.dtype}, device={x.device}, "
                f"stride={x.stride()}, storage_offset={x.storage_offset()}")
        if x.numel() and not x.is_meta and x.dtype != torch.bool and not x.dtype.is_complex:
            try:
                v = values.detach().to("cpu", torch.float64)
                text += f", min={v.min().item():.6g}, max={v.max().item():.6g}"
            except (RuntimeError, TypeError):
                pass
        return text + ")"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_describe(e, v) for e, v in zip(x, values)) + "]"
    return repr(x)


def describe_arguments(args, kwargs, cpu_args, cpu_kwargs):
    """The operator-argument dump: one line per argument."""
    lines = [f"  arg {i}: {_describe(a, c)}" for i, (a, c) in enumerate(zip(args, cpu_args))]
    lines += [f"  {k}={_describe(v, cpu_kwargs[k])}" for k, v in kwargs.items()]
    return "\n".join(lines)


class Autocompare(TorchDispatchMode):
    def __init__(self, name, ops="all", action="warn", rtol=None, atol=None, dump=None):
        super().__init__()
        if action not in ("warn", "raise"):
            raise ValueError(f"{name}: autocompare's action is warn or raise, got {action!r}")
        self.name, self.action, self.dump = name, action, dump
        self.ops = None if ops in ("all", None) else {o.strip() for o in ops if o.strip()}
        self.tol = {} if rtol is None else {"rtol": rtol, "atol": atol}
        self.lock = threading.Lock()
        self.counts = {}  # op: [compared, mismatched]
        self.dumps = itertools.count()
        self.not_compared = set()

    def wanted(self, func):
        packet = func.overloadpacket.__name__
        if packet in UNINITIALIZED or torch.Tag.nondeterministic_seeded in func.tags:
            return False
        if self.ops is None:
            return True
        schema = func._schema.name  # aten::add
        full = func.name()  # aten::add.Tensor
        return bool(self.ops & {packet, schema, full, full.split("::", 1)[-1]})

    def on_device(self, args, kwargs):
        for x in tree_flatten((args, kwargs))[0]:
            if isinstance(x, torch.Tensor) and x.device.type == self.name:
                return True
            if isinstance(x, torch.device) and x.type == self.name:
                return True
        return False

    def to_cpu(self, x):
        if isinstance(x, torch.Tensor):
            return x.detach().to("cpu", copy=True) if x.device.type == self.name else x
        if isinstance(x, torch.device) and x.type == self.name:
            return torch.device("cpu")
        return x

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.wanted(func) or not self.on_device(args, kwargs):
            return func(*args, **kwargs)
        cpu_args, cpu_kwargs = tree_map(self.to_cpu, (args, kwargs))
        out = func(*args, **kwargs)
        op = func.name()
        try:
            want = func(*cpu_args, **cpu_kwargs)
        except Exception as e:  # noqa: BLE001
            with self.lock:
                first = op not in self.not_compared
                self.not_compared.add(op)
            if first:
                warnings.warn(f"{self.name}: autocompare: {op} cannot be compared, it raised on "
                              f"the CPU: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                              AutocompareWarning, stacklevel=2)
            return out
        problem = self.compare(out, want)
        with self.lock:
            c = self.counts.setdefault(op, [0, 0])
            c[0] += 1
            c[1] += problem is not None
        if problem is not None:
            self.mismatch(op, problem, (args, kwargs), (cpu_args, cpu_kwargs), out, want)
        return out

    def compare(self, got, want):
        g, w = tree_flatten(got)[0], tree_flatten(want)[0]
        if len(g) != len(w):
            return f"{len(g)} results on the device, {len(w)} on the CPU"
        for i, (a, b) in enumerate(zip(g, w)):
            if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
                return f"result {i}: {type(a).__name__} on the device, {type(b).__name__} on the CPU"
            if isinstance(a, torch.Tensor):
                a = a.detach().cpu()
            elif not isinstance(a, (int, float, complex, bool)):
                continue
            try:
                torch.testing.assert_close(a, b, equal_nan=True, check_device=False,
                                           check_stride=False, **self.tol)
            except AssertionError as e:
                return f"result {i}: " + " ".join(str(e).split())
        return None

    def mismatch(self, op, problem, device_args, cpu_args, out, want):
        text = (f"{self.name}: autocompare: {op} differs from the CPU: {problem}\n"
                f"arguments:\n{describe_arguments(*device_args, *cpu_args)}")
        cpu_args, cpu_kwargs = cpu_args
        if self.dump:
            os.makedirs(self.dump, exist_ok=True)
            path = os.path.join(self.dump, f"{next(self.dumps)}-{op.replace('::', '.')}.pt")
            torch.save({"op": op, "args": cpu_args, "kwargs": cpu_kwargs,
                        "device_result": tree_map(
                            lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) else x, out),
                        "cpu_result": want, "message": text}, path)
            text += f"\n(dumped to {path})"
        if self.action == "raise":
            raise AutocompareMismatch(text)
        warnings.warn(text, AutocompareWarning, stacklevel=3)


_active = None
_owner = None  # the thread that enabled it


def enable(name, ops="all", action="warn", rtol=None, atol=None, dump=None):
    """Starts comparing `ops` ("all" or a list of names) of the backend
    `name` with the CPU in this thread; the mode (its .counts:
    {op: [compared, mismatched]}). A second call replaces the first."""
    global _active, _owner
    disable()
    _active = Autocompare(name, ops, action, rtol, atol, dump)
    _push_mode(_active)
    _owner = threading.get_ident()
    return _active


def disable():
    """Stops autocompare: in the thread that enabled it, once the modes
    pushed after it are gone (a mode stack is per thread, and only its top
    can go); otherwise a RuntimeError, and it keeps running."""
    global _active, _owner
    if _active is None:
        return
    if threading.get_ident() != _owner:
        raise RuntimeError(f"{_active.name}: autocompare was enabled in another thread; "
                           "disable it there")
    if _get_current_dispatch_mode() is not _active:
        raise RuntimeError(f"{_active.name}: a dispatch mode pushed after autocompare is still "
                           f"active ({type(_get_current_dispatch_mode()).__name__}); leave it "
                           "first")
    _pop_mode()
    _active = _owner = None


def active():
    return _active


def from_environment(name):
    """enable() as <NAME>_AUTOCOMPARE* ask (see the module's doc); None if unset."""
    env = name.upper() + "_AUTOCOMPARE"
    spec = os.environ.get(env, "").strip()
    if not spec:
        return None
    action = os.environ.get(env + "_ACTION", "warn").strip() or "warn"
    if action not in ("warn", "raise"):
        raise ValueError(f"{name}: {env}_ACTION must be warn or raise, got {action!r}")
    rtol = atol = None
    tol = os.environ.get(env + "_TOL", "").strip()
    if tol:
        try:
            rtol, atol = (float(v) for v in tol.split(","))
        except ValueError:
            raise ValueError(f"{name}: {env}_TOL must be 'rtol,atol' (two numbers), "
                             f"got {tol!r}") from None
    ops = "all" if spec == "all" else spec.split(",")
    return enable(name, ops, action, rtol, atol, os.environ.get(env + "_DUMP") or None)


def replay(path, device):
    """Runs a dumped operator again on `device` and on the CPU: (device's
    result on the CPU, CPU's result, the dump)."""
    d = torch.load(path, weights_only=False)
    ns, _, rest = d["op"].partition("::")
    packet, _, overload = rest.partition(".")
    func = getattr(getattr(getattr(torch.ops, ns), packet), overload or "default")
    move = (lambda x: x.to(device) if isinstance(x, torch.Tensor) else x)
    with _disable_current_modes():  # an autocompare in force would compare it again
        got = func(*tree_map(move, d["args"]), **tree_map(move, d["kwargs"]))
        want = func(*d["args"], **d["kwargs"])
    return tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, got), want, d
