"""PyTorch's allocator settings honoured with CUDA's keys and meanings (Note [Allocator
configuration], Note [Allocator settings hook]): PYTORCH_ALLOC_CONF, its older name
PYTORCH_CUDA_ALLOC_CONF and <NAME>_ALLOC_CONF at start, key by key;
torch._C._accelerator_setAllocatorSettings at run time; a malformed or unknown key is a
ValueError naming it. Each case runs in a child process, whose environment and settings it
owns."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from backend import DEV, ENV, MOD, OPS, renamed, simdev_only

MiB = 1 << 20
_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
         f"{ENV}ALLOC_CONF", f"{ENV}NO_MEMORY_CACHING")


def _run(code, **env):
    """Runs `code` in a fresh interpreter with torch_<backend> imported, with only the
    allocator variables given here (SIMDEV_X: <ENV>X); returns its stdout's last line."""
    full = {k: v for k, v in os.environ.items() if k not in _VARS}
    full.update({renamed(k): v for k, v in env.items()})
    r = subprocess.run([sys.executable, "-c",
                        renamed("import torch, torch_simdev\nM = torch.simdev\n" +
                                textwrap.dedent(code))],
                       capture_output=True, text=True, env=full, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


_MAX_SPLIT = """
torch.empty(1, device='simdev')
print(M.memory_stats()['max_split_size'])
"""


def test_pytorch_alloc_conf_sets_the_backends_allocator():
    assert _run(_MAX_SPLIT) == "-1"
    assert _run(_MAX_SPLIT, PYTORCH_ALLOC_CONF="max_split_size_mb:64") == str(64 * MiB)


def test_the_older_name_is_read_only_where_the_new_one_is_unset():
    assert _run(_MAX_SPLIT, PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:48") == str(48 * MiB)
    assert _run(_MAX_SPLIT, PYTORCH_ALLOC_CONF="max_split_size_mb:64",
                PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:48") == str(64 * MiB)


def test_the_backends_variable_goes_over_pytorchs_key_by_key():
    # max_split_size_mb from SIMDEV_ALLOC_CONF; roundup_power2_divisions from
    # PYTORCH_ALLOC_CONF, which SIMDEV_ALLOC_CONF does not name: 1.1 MiB rounds to 1.25.
    out = _run(f"""
x = torch.empty({int(1.1 * MiB)}, dtype=torch.uint8, device='simdev')
s = M.memory_stats()
print(s['max_split_size'], s['allocated_bytes.all.current'])
""", PYTORCH_ALLOC_CONF="max_split_size_mb:64,roundup_power2_divisions:4",
        SIMDEV_ALLOC_CONF="max_split_size_mb:128")
    assert out.split() == [str(128 * MiB), str(MiB + MiB // 4)]


_SPLITS = """
def splits():
    x = torch.empty(40 << 20, dtype=torch.uint8, device='simdev')
    p = x.data_ptr()
    del x
    y = torch.empty(12 << 20, dtype=torch.uint8, device='simdev')
    q = y.data_ptr()
    del y
    M.empty_cache()
    return p == q
"""


def test_max_split_size_mb_keeps_big_blocks_whole():
    code = _SPLITS + "print(splits())"
    assert _run(code) == "True"
    assert _run(code, PYTORCH_ALLOC_CONF="max_split_size_mb:32") == "False"


@simdev_only  # sized with SIMDEV_MEMORY_MB
def test_garbage_collection_threshold_frees_old_cache_before_growing():
    code = """
x = torch.empty(12 << 20, dtype=torch.uint8, device='simdev')
del x
y = torch.empty(22 << 20, dtype=torch.uint8, device='simdev')
print(M.memory_reserved() >> 20)
"""
    assert _run(code, SIMDEV_MEMORY_MB="64") == "34"
    assert _run(code, SIMDEV_MEMORY_MB="64",
                PYTORCH_ALLOC_CONF="garbage_collection_threshold:0.5") == "22"


@simdev_only  # sized with SIMDEV_MEMORY_MB
def test_per_process_memory_fraction_caps_the_device():
    out = _run("""
print(M.get_per_process_memory_fraction(0), end=' ')
try:
    torch.empty(40 << 20, dtype=torch.uint8, device='simdev')
    print('fit')
except torch.OutOfMemoryError:
    print('oom')
""", SIMDEV_MEMORY_MB="64", PYTORCH_ALLOC_CONF="per_process_memory_fraction:0.5")
    assert out.split() == ["0.5", "oom"]


def test_expandable_segments_reaches_the_allocator():
    has_vm = "vm_reserve" in OPS.runtime_members()
    out = _run("""
try:
    x = torch.ones(16 << 20, dtype=torch.uint8, device='simdev')
    print('ok', int(x.sum().item()))
except RuntimeError as e:
    print('refused', str(e).replace(chr(10), ' '))
""", PYTORCH_ALLOC_CONF="expandable_segments:True")
    if has_vm:
        assert out == f"ok {16 * MiB}"
    else:
        assert out.startswith(f"refused {DEV}: expandable_segments:True needs the runtime's "
                              "virtual-memory members"), out


def test_pinned_max_round_threshold_mb_stops_rounding_big_pinned_requests():
    code = f"""
p = torch.empty({3 * MiB // 2}, dtype=torch.uint8).pin_memory()
print(M.host_memory_stats()['allocated_bytes.current'])
"""
    assert _run(code) == str(2 * MiB)
    assert _run(code, PYTORCH_ALLOC_CONF="pinned_max_round_threshold_mb:1") == str(3 * MiB // 2)


def test_pinned_max_cached_size_mb_returns_big_freed_pinned_blocks():
    code = f"""
p = torch.empty({3 * MiB}, dtype=torch.uint8).pin_memory()
del p
print(M.host_memory_stats()['allocated_bytes.current'])
"""
    assert _run(code) == str(4 * MiB)
    assert _run(code, SIMDEV_ALLOC_CONF="pinned_max_cached_size_mb:1") == "0"


def test_pinned_use_background_threads_runs_pinned_copies():
    out = _run("""
x = torch.arange(1000.0).pin_memory()
y = x.to('simdev', non_blocking=True)
del x
M.synchronize()
z = torch.empty(1000).pin_memory()
print(int(y.sum().item()))
""", PYTORCH_ALLOC_CONF="pinned_use_background_threads:True")
    assert out == str(sum(range(1000)))


def test_set_allocator_settings_changes_the_live_allocator():
    out = _run(_SPLITS + """
before = splits()
torch._C._accelerator_setAllocatorSettings('max_split_size_mb:32')
print(before, splits(), M.memory_stats()['max_split_size'])
""")
    assert out.split() == ["True", "False", str(32 * MiB)]


def test_set_allocator_settings_applies_over_the_current_settings_and_to_later_devices():
    out = _run(f"""
torch._C._accelerator_setAllocatorSettings('max_split_size_mb:64')  # before any allocation
torch.empty(1, device='simdev')
torch._C._accelerator_setAllocatorSettings('per_process_memory_fraction:0.5')
print(M.memory_stats(0)['max_split_size'], M.get_per_process_memory_fraction(0),
      M.memory_stats({MOD.device_count() - 1})['max_split_size'])
""", PYTORCH_ALLOC_CONF="garbage_collection_threshold:0.5")
    assert out.split() == [str(64 * MiB), "0.5", str(64 * MiB)]


@pytest.mark.parametrize("variable", ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF",
                                      "SIMDEV_ALLOC_CONF"])
@pytest.mark.parametrize("text,message", [
    ("max_split_size_mb:abc", "max_split_size_mb expects a whole number in 1..1073741824, "
                              "got 'abc'"),
    ("typo_mb:3", "unknown key 'typo_mb'"),
    ("garbage_collection_threshold:1.5", "garbage_collection_threshold expects a number in "
                                         "(0, 1), got '1.5'"),
    ("backend:cudaMallocAsync", "backend:cudaMallocAsync is refused"),
    ("pinned_use_background_threads:yes", "pinned_use_background_threads expects True or "
                                          "False, got 'yes'"),
])
def test_a_malformed_variable_is_a_value_error_naming_it(variable, text, message):
    out = _run("""
try:
    torch.empty(1, device='simdev')
    print('accepted')
except ValueError as e:
    print('ValueError', e)
""", **{variable: text})
    assert out.startswith(renamed(f"ValueError simdev: {variable}='{text}': {message}")), out


@pytest.mark.parametrize("text,message", [
    ("max_split_size_mb:20.5", "simdev: torch._C._accelerator_setAllocatorSettings="
                               "'max_split_size_mb:20.5': max_split_size_mb expects a whole "
                               "number"),
    ("per_process_memory_fraction:2", "per_process_memory_fraction expects a number in (0, 1], "
                                      "got '2'"),
    ("typo_mb:3", "'typo_mb'"),
    ("pinned_num_register_threads:2", "pinned_num_register_threads:2 is refused"),
])
def test_a_malformed_run_time_setting_is_a_value_error_and_changes_nothing(text, message):
    out = _run(f"""
torch.empty(1, device='simdev')
torch._C._accelerator_setAllocatorSettings('max_split_size_mb:64')
try:
    torch._C._accelerator_setAllocatorSettings({text!r})
    print('accepted')
except ValueError as e:
    print('ValueError', str(e).replace(chr(10), ' '), M.memory_stats()['max_split_size'])
""")
    assert out.startswith("ValueError"), out
    assert renamed(message) in out, out
    assert out.endswith(str(64 * MiB)), out
