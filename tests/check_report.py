"""Runs the demo's report program and checks that its JSON report is valid
JSON with the schema's fields for every device."""
import json
import subprocess
import sys

REQUIRED = [
    "name", "vendor", "architecture", "uuid", "pci_bus_id", "driver_version",
    "runtime_version", "total_memory", "free_memory", "max_allocation", "memory_alignment",
    "compute_units", "subgroup_size", "clock_rate_khz", "l2_cache_bytes", "dtypes",
    "unified_memory", "host_access", "host_visible_memory", "stream_priorities", "event_timing",
    "async_copy_engines", "dlpack_device_type", "dlpack_pinned_device_type", "extras",
]

env = {"PATH": "/usr/bin:/bin", "SIMDEV_VISIBLE_DEVICES": "1,0"}
out = subprocess.run([sys.argv[1], "--json"], check=True, capture_output=True, text=True,
                     env=env).stdout
report = json.loads(out)
assert report["schema_version"] == 5, report["schema_version"]
assert report["backend"] == "simdev"
assert report["device_count"] == 2 and report["init_error"] is None, report
devices = report["devices"]
assert [d["physical_index"] for d in devices] == [1, 0], "visibility did not reorder"
for d in devices:
    missing = [k for k in REQUIRED if k not in d]
    assert not missing, f"device {d['index']} lacks {missing}"
    assert d["error"] is None
    assert 0 < d["free_memory"] <= d["total_memory"]
    for t in ["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2",
              "complex64", "int64", "bool"]:
        assert t in d["dtypes"], t
assert report["peer_access"] == [[True, True], [True, True]], report["peer_access"]

bad = subprocess.run([sys.argv[1], "--json"], capture_output=True, text=True,
                     env={**env, "SIMDEV_VISIBLE_DEVICES": "0,zz"})
assert bad.returncode == 1, "a malformed visibility variable must fail the report"
report = json.loads(bad.stdout)
assert report["device_count"] == 0
assert "SIMDEV_VISIBLE_DEVICES='0,zz'" in report["init_error"], report["init_error"]
assert "'zz'" in report["init_error"]
print("report: ok")
