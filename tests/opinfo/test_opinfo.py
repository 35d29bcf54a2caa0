"""PyTorch's own operator samples (op_db) on the backend against the CPU,
forward, backward and with out= (the same samples; the outcome, the CPU's
own error included, the warnings, the results and the out= tensors), for
each dtype of DTYPES the backend reports, and njt_op_db's nested samples in
both layouts (float32). The conformance kit's accelkit.testing.opinfo runs them, one operator at a time in child processes
(a crash is charged to its operator); every difference must be on the SDK's
list of known differences (python/accelkit/testing/known_differences.py, which
the kit ships), and every entry there must still differ somewhere it applies.
The tally
per dtype and direction is printed at the end of the run.

    pytest tests/opinfo [--opinfo-samples N]   (default 4; the full sweep: 1000)

The backend is ACCELKIT_OPINFO_BACKEND (default simdev, whose package
torch_simdev must be importable); the memory mode is the backend's own
(host_visible_memory of device 0), so run it once per mode."""
import os
import time

import pytest

from accelkit.testing import opinfo
from conftest import TALLY
from accelkit.testing.known_differences import KNOWN_DIFFERENCES, covers, known

BACKEND = os.environ.get("ACCELKIT_OPINFO_BACKEND", "simdev")
DIRECTIONS = ["forward", "backward", "out", "nested"]
# njt_op_db's nested samples (both layouts) in float32 only: the other
# dtypes add about 100 s per memory mode for the same kernels' paths.
NESTED_DTYPES = ["float32"]
# The list of known differences is what 4 samples per operator show (the
# test command's count); with fewer, an entry may not show and is not stale.
LISTED_AT = 4


@pytest.fixture(scope="module")
def sweep(request):
    found = opinfo.listing(BACKEND, opinfo.DTYPES, NESTED_DTYPES)
    dtypes = [d for d in opinfo.DTYPES if d in found["dtypes"]]
    items = [i for i in opinfo.items_for(found, dtypes, DIRECTIONS)
             if not i.endswith("|nested") or i.split("|")[1] in NESTED_DTYPES]
    samples = request.config.getoption("--opinfo-samples")
    t0 = time.monotonic()
    results = opinfo.run(BACKEND, items, samples=samples,
                              jobs=request.config.getoption("--opinfo-jobs"), timeout=300)
    memory = "host-visible" if found["host_visible_memory"] else "hidden"
    TALLY.append(f"{BACKEND}, {memory} memory, {samples} sample(s) per operator, "
                 f"{len(items)} cases in {time.monotonic() - t0:.0f} s:")
    return found, dtypes, results, memory, samples


@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("dtype", opinfo.DTYPES)
def test_operators_match_the_cpu(sweep, dtype, direction):
    found, dtypes, results, memory, samples = sweep
    if dtype not in dtypes:
        pytest.skip(f"{BACKEND} does not report {dtype}")
    if direction == "nested" and dtype not in NESTED_DTYPES:
        pytest.skip(f"nested samples are compared in {', '.join(NESTED_DTYPES)}")
    mine = {i.split("|")[0]: r for i, r in results.items() if i.split("|")[1:] == [dtype, direction]}
    failures, listed = [], []
    for op, r in sorted(mine.items()):
        if r["status"] in opinfo.FAILED:
            listed_for = known(op, dtype, direction, memory)
            (listed if listed_for else failures).append(f"{op}: {r['status']}: {r['message']}")
    count = {s: sum(r["status"] == s for r in mine.values()) for s in ("match", "not compared")}
    TALLY.append(f"  {dtype:9} {direction:8}: {len(mine)} operators, {count['match']} match, "
                 f"{len(listed)} known differences, {len(failures)} failures, "
                 f"{count['not compared']} not compared (CUDA-only, or no sample both sides take)")
    assert not failures, "\n".join(failures)


def test_every_known_difference_still_differs(sweep):
    # The list may only shrink: an entry whose operator matched wherever it
    # applies in this run must go. Its operator must be one of op_db's.
    found, dtypes, results, memory, samples = sweep
    names = {n for d in found["items"].values() for w in d.values() for n in w}
    unknown = [op for (op, *_), _ in KNOWN_DIFFERENCES.items() if op not in names]
    assert not unknown, f"entries for operators op_db does not have: {unknown}"
    if samples < LISTED_AT:
        pytest.skip(f"the list is what {LISTED_AT} samples per operator show")
    stale = []
    for (op, dtype, direction, mem), reason in KNOWN_DIFFERENCES.items():
        if mem not in (None, memory):
            continue
        covered = [r for i, r in results.items()
                   if i.split("|")[0] == op and covers(dtype, i.split("|")[1])
                   and direction in (None, i.split("|")[2])]
        if covered and not any(r["status"] in opinfo.FAILED for r in covered):
            stale.append(f"{op} ({dtype or 'every dtype'}, {direction or 'both directions'}): "
                         f"matches now; remove it from python/accelkit/testing/"
                         f"known_differences.py ({reason})")
    assert not stale, "\n".join(stale)


def test_a_child_that_dies_after_its_last_result_is_charged_to_that_item(tmp_path, monkeypatch):
    # A process that crashes at exit, after every item's result, is still a crash.
    child = tmp_path / "child.py"
    child.write_text("import json, sys\n"
                     "for item in sys.argv[3:]:\n"
                     "    print('START ' + item)\n"
                     "    print('RESULT ' + json.dumps({'item': item, 'status': 'match', 'message': ''}))\n"
                     "sys.stderr.write('dying at exit\\n')\n"
                     "sys.exit(3)\n")
    monkeypatch.setattr(opinfo, "CHILD", str(child))
    results = opinfo.run_chunk(BACKEND, ["a|float32|forward", "b|float32|forward"], 1, 60)
    assert results["a|float32|forward"]["status"] == "match"
    assert results["b|float32|forward"]["status"] == "crash"
    assert results["b|float32|forward"]["message"] == \
        "the process died (3) after its last item: dying at exit"
