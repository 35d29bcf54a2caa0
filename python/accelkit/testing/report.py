"""The Python kit's report: the JSON document and readable summary of the C++
kit's schema (Note [Conformance report] in include/accelkit/testing/report.hpp),
with "kit": "python" and one more field, "known_differences": the checks
that failed where a list of known differences (known_differences.py) says
they differ, each as a check with status "known", the list's "reason" and
its "source" ("accelkit" for the SDK's list, else the vendor's file). They
are not among "checks", not counted in "summary" and do not fail the run;
the readable summary lists them apart."""
import json
import os
import threading

SCHEMA = "accelkit.conformance"
VERSION = 1
STATUSES = ("pass", "fail", "skip")


class Report:
    """The results of one run, in the order the checks ran. Thread-safe."""

    def __init__(self, backend, devices, vendor_list=None):
        self.backend, self.devices = backend, devices
        self.vendor_list = vendor_list  # known_differences.VendorList or None
        self._lock = threading.Lock()
        self._checks = []
        self._known = []

    def add(self, group, name, rule, status, message="", duration_s=0.0, known=None):
        """Adds a result; a failure that `known` (a reason from the SDK's
        list) or the vendor's list explains becomes a known difference.
        Returns the status it got: pass, fail, skip or known."""
        if status not in STATUSES:
            raise ValueError(f"accelkit.testing: a check's status is one of {STATUSES}, "
                             f"got {status!r}")
        entry = {"group": group, "name": name, "rule": rule, "status": status,
                 "message": message, "duration_s": float(duration_s)}
        if status == "fail":
            source = "accelkit" if known else None
            if not known and self.vendor_list is not None:
                known = self.vendor_list.reason(group, name)
                source = self.vendor_list.path
            if known:
                entry.update(status="known", reason=known, source=source)
                with self._lock:
                    self._known.append(entry)
                return "known"
        with self._lock:
            self._checks.append(entry)
        return status

    @property
    def checks(self):
        with self._lock:
            return list(self._checks)

    @property
    def known_differences(self):
        with self._lock:
            return list(self._known)

    def counts(self):
        checks = self.checks
        return {s: sum(c["status"] == s for c in checks) for s in STATUSES}

    def failed(self):
        return [c for c in self.checks if c["status"] == "fail"]

    def to_json(self):
        return json.dumps({"schema": SCHEMA, "version": VERSION, "kit": "python",
                           "backend": self.backend, "devices": self.devices,
                           "checks": self.checks, "summary": self.counts(),
                           "known_differences": self.known_differences}, indent=1) + "\n"

    def summary(self):
        """One line per check, failures and skips with their rule and message;
        the known differences with their reason; then the time per group and
        the totals."""
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
        known = self.known_differences
        lines += self.known_summary()
        n = self.counts()
        lines.append("per group: " + ", ".join(f"{g} {k} ({t:.1f} s)"
                                                for g, (k, t) in per_group.items()))
        lines.append(f"{n['pass']} passed, {n['fail']} failed, {n['skip']} skipped"
                     + (f", {len(known)} known difference{'s' if len(known) != 1 else ''}"
                        if known else ""))
        return "\n".join(lines) + "\n"

    def known_summary(self):
        """The summary's lines on known differences: each with its reason and
        list, then the vendor's entries that matched no failure."""
        lines = []
        known = self.known_differences
        if known:
            lines.append("known differences (not failures):")
        for c in known:
            lines.append(f"  known {c['group']}/{c['name']}: {c['reason']} (list: {c['source']})")
            lines.append(f"       {c['message']}")
        unused = self.vendor_list.unused() if self.vendor_list is not None else []
        if unused:
            lines.append("entries of the known differences that matched no failure in this "
                         "run (remove those whose checks now pass):")
            lines += [f"  {u}" for u in unused]
        return lines

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
