"""Runs the demo (README's first command, with few steps) and checks that it
exits cleanly with every section there: the device report, training on
simdev with progress and the same losses as the CPU, the memory statistics
and the fallback report with at least one operator."""
import re
import subprocess
import sys

r = subprocess.run([sys.executable, sys.argv[1], "--steps", "5"], capture_output=True, text=True,
                   timeout=600)
out = r.stdout
assert r.returncode == 0, f"demo exited with {r.returncode}\n{out}\n{r.stderr}"
for needed in ["simdev", "torch.accelerator.device_count() = 2",
               "Training an MLP for 5 steps on simdev:0",
               "largest difference over all steps 0.00e+00",
               "Memory on simdev:0:", "num_device_alloc",
               "Operators that ran on the CPU"]:
    assert needed in out, f"demo output lacks {needed!r}:\n{out}"
steps = re.findall(r"^  step +(\d+)  loss ", out, re.M)
assert steps and steps[0] == "1" and steps[-1] == "5", f"no progress lines:\n{out}"
report = out.split("Operators that ran on the CPU", 1)[1]
assert re.search(r"^  aten::\S+ +\d+ +[\d.]+$", report, re.M), f"empty fallback report:\n{out}"
print("demo ok")
