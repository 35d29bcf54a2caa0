"""The backend the Python tests run on, and the marks of tests that cannot run on every one.

ACCELKIT_TEST_BACKEND names it (default simdev; the ctest entries set it): the tests import
torch_<name> and reach its device module as MOD (torch.<name>), its operators as OPS
(torch.ops.<name>), its device type as DEV and its environment prefix as ENV ("SIMDEV_").
renamed(text) rewrites simdev's names in a text (a script run in a child, a pattern with braces)
for the backend under test.
"""
import importlib
import os

import pytest
import torch

DEV = os.environ.get("ACCELKIT_TEST_BACKEND", "simdev")
ENV = DEV.upper() + "_"
PACKAGE = importlib.import_module(f"torch_{DEV}")
MOD = getattr(torch, DEV)
OPS = getattr(torch.ops, DEV)
IS_SIMDEV = DEV == "simdev"


def renamed(text):
    return text.replace("torch_simdev", f"torch_{DEV}").replace("simdev", DEV).replace(
        "SIMDEV_", ENV)


# A test of simdev's own test knobs (torch.ops.simdev_driver: holding a stream, injected
# faults, its counters; SIMDEV_DEVICE_COUNT, SIMDEV_MEMORY_MB, SIMDEV_HOST_VISIBLE...) or of
# the values they configure (device names, capacities): simdev's alone.
simdev_only = pytest.mark.skipif(
    not IS_SIMDEV, reason=f"uses simdev's test knobs, which {DEV} does not have")

# A test that needs two devices of the backend.
two_devices = pytest.mark.skipif(
    MOD.device_count() < 2, reason=f"needs two devices; {DEV} has {MOD.device_count()}")

# A test sized for simdev's configured capacity (the ctest entries' SIMDEV_MEMORY_MB=256):
# what runs out of memory there fits on a real device.
simdev_capacity = pytest.mark.skipif(
    not IS_SIMDEV, reason="sized for simdev's configured capacity (SIMDEV_MEMORY_MB=256)")
