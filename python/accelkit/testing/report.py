"""The Python kit's report: the JSON document and readable summary of the C++
kit's schema (Note [Conformance report] in include/accelkit/testing/report.hpp),
with "kit": "python"."""
import json
import os
import threading

SCHEMA = "accelkit.conformance"
VERSION = 1
STATUSES = ("pass", "fail", "skip")


class Report:
    """The results of one run, in the order the checks ran. Thread-safe."""

    def __init__(self, backend, devices):
        self.backend, self.devices = backend, devices
        self._lock = threading.Lock()
        self._checks = []

    def add(self, group, name, rule, status, message="", duration_s=0.0):
        if status not in STATUSES:
            raise ValueError(f"accelkit.testing: a check's status is one of {STATUSES}, "
                             f"got {status!r}")
        with self._lock:
            self._checks.append({"group": group, "name": name, "rule": rule, "status": status,
                                 "message": message, "duration_s": float(duration_s)})

    @property
    def checks(self):
        with self._lock:
            return list(self._checks)

    def counts(self):
        checks = self.checks
        return {s: sum(c["status"] == s for c in checks) for s in STATUSES}

    def failed(self):
        return [c for c in self.checks if c["status"] == "fail"]

    def to_json(self):
        return json.dumps({"schema": SCHEMA, "version": VERSION, "kit": "python",
                           "backend": self.backend, "devices": self.devices,
                           "checks": self.checks, "summary": self.counts()}, indent=1) + "\n"

    def summary(self):
        """One line per check, failures and skips with their rule and message,
        then the totals (and the time per group)."""
        lines = [f"accelkit conformance kit (Python) on {self.backend}"]
        per_group = {}
        for c in self.checks:
            lines.append(f"  {c['status']:<4} {c['group']}/{c['name']} ({c['duration_s']:.3f} s)")
            if c["status"] != "pass":
                lines.append(f"       rule: {c['rule']}")
                lines.append(f"       {c['message']}")
            g = per_group.setdefault(c["group"], [0, 0.0])
            g[0] += 1
            g[1] += c["duration_s"]
        n = self.counts()
        lines.append("per group: " + ", ".join(f"{g} {k} ({t:.1f} s)"
                                                for g, (k, t) in per_group.items()))
        lines.append(f"{n['pass']} passed, {n['fail']} failed, {n['skip']} skipped")
        return "\n".join(lines) + "\n"

    def write(self, path):
        """Writes `path` (JSON) and `path`.txt (the summary); an OSError
        names the file that could not be written."""
        for file, text in ((path, self.to_json()), (path + ".txt", self.summary())):
            try:
                with open(file, "w") as f:
                    f.write(text)
            except OSError as e:
                raise OSError(e.errno, e.strerror, file) from e


def unwritable(path):
    """Why write(path) could not create or replace its two files ("<file>:
    <reason>"), or None; checked by opening them (a file made for the test
    is removed). Run before the checks, so that a run does not end without
    its report (Note [Conformance report])."""
    for file in (path, path + ".txt"):
        try:
            try:
                with open(file, "a"):
                    pass
            except FileNotFoundError:
                with open(file, "x"):
                    pass
                os.remove(file)
        except OSError as e:
            return f"{file}: {e.strerror or e}"
    return None
