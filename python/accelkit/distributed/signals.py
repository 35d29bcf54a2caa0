"""The backend's host signals as the process group uses them: a stream's
wait for a collective on the device (Note [wait() on the stream]), and the
SDK's own stream of each device for the group's blocking copies."""
import warnings

import torch

from .. import _backend

def _signal_ops():
    """The backend's host signal operators (Note [Host signals]) when its
    streams wait for them on the device, else None (the runtime lacks the
    members, or the library was built without them)."""
    global _SIGNALS
    if _SIGNALS is None:
        ops = getattr(torch.ops, _backend.name)
        try:
            _SIGNALS = ops if bool(ops.stream_signals()) else False
        except (AttributeError, RuntimeError):
            _SIGNALS = False
    return _SIGNALS or None


_SIGNALS = None
_SDK_STREAMS = {}


def _sdk_stream(device):
    """The SDK's own stream of `device` (torch.ops.<name>.sdk_stream), or
    None where the streams do not wait for signals."""
    ops = _signal_ops()
    if ops is None:
        return None
    if device.index not in _SDK_STREAMS:
        _SDK_STREAMS[device.index] = ops.sdk_stream(device.index)
    return _SDK_STREAMS[device.index]


# The error a collective's failure completes its signals with: the streams
# that wait for them report it as their asynchronous error.
_SIGNAL_FAILED = 1


def _finish_signal(index, signal, code, reason="", failures=None):
    """Completes a signal a stream waits for, never raising (on a completion
    thread): a failed completion is tried once more, since a signal left
    incomplete would hold its streams forever. A signal completed with a
    failure (`code` not 0) stays alive in `failures` (the group's), so that
    its streams stay failed until the group is destroyed (Note [Failed
    waits]); the others are destroyed at once."""
    ops = _signal_ops()
    for attempt in range(2):
        try:
            ops.signal_complete(index, signal, code, reason)
            break
        except Exception as e:  # noqa: BLE001
            if attempt:
                warnings.warn(f"{_backend.name}: a stream's wait for a collective could not be "
                              f"released (its stream stays waiting): {e}", RuntimeWarning,
                              stacklevel=1)
                return
    if code != 0 and failures is not None:
        failures.keep_signal(index, signal)
        return
    _destroy_signal(index, signal)


def _destroy_signal(index, signal):
    try:
        _signal_ops().signal_destroy(index, signal)
    except Exception as e:  # noqa: BLE001
        warnings.warn(f"{_backend.name}: a collective's host signal was not destroyed: {e}",
                      RuntimeWarning, stacklevel=1)

