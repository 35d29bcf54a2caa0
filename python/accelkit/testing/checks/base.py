"""The Python kit's check registry: each check is a function of a Context,
registered with the group it belongs to and the rule it proves (in words, as
the report names it). It passes by returning, fails by raising (the message
says what broke the rule) and is skipped by raising Skip (e.g. a check of two
devices on a backend with one)."""
import torch


class Skip(Exception):
    """Raised by a check that does not apply to the backend; says why."""


class Check:
    def __init__(self, group, name, rule, fn):
        self.group, self.name, self.rule, self.fn = group, name, rule, fn


CHECKS = []


def check(group, rule):
    """Registers the decorated function as the check `group`/<its name>."""
    def register(fn):
        CHECKS.append(Check(group, fn.__name__, rule, fn))
        return fn
    return register


class Context:
    """What the checks know of the backend under test."""

    def __init__(self, name, rtol=1e-4, atol=1e-5):
        self.name = name
        self.mod = getattr(torch, name)
        self.devices = self.mod.device_count()
        self.props = self.mod.get_device_properties(0) if self.devices else None
        self.rtol, self.atol = rtol, atol
        self.dev = torch.device(name, 0)

    def dtypes(self):
        """The dtypes the capability schema reports that this torch knows."""
        return [getattr(torch, d) for d in self.props["dtypes"]
                if isinstance(getattr(torch, d, None), torch.dtype)]

    def close(self, got, want, what, **tol):
        tol = tol or {"rtol": self.rtol, "atol": self.atol}
        torch.testing.assert_close(got.cpu() if isinstance(got, torch.Tensor) else got, want,
                                   equal_nan=True, msg=lambda m: f"{what}: {m}", **tol)

    def need_devices(self, n):
        if self.devices < n:
            raise Skip(f"needs {n} devices; {self.name} has {self.devices}")


def expect_raises(kind, f, *contains):
    """f() must raise `kind` (exactly that class or a subclass) whose message
    holds every string of `contains`; the exception."""
    try:
        f()
    except kind as e:
        for c in contains:
            if c not in str(e):
                raise AssertionError(f"{type(e).__name__} raised without {c!r} in its "
                                     f"message: {e}") from None
        return e
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {kind.__name__}, got {type(e).__name__}: {e}") from None
    raise AssertionError(f"expected {kind.__name__}, nothing was raised")
