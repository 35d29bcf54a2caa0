#!/usr/bin/env bash
# Runs a sanitizer build of the core tests (core.tsan, core.asan). A
# sanitizer whose runtime cannot start on this machine is reported as
# skipped (exit 77), not passed: ThreadSanitizer refuses kernels that
# randomize mmap more than it expects, LeakSanitizer needs ptrace.
out="$("$@" 2>&1)"
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ] && grep -qE "unexpected memory mapping|LeakSanitizer has encountered a fatal error|LeakSanitizer does not work under ptrace" <<<"$out"; then
  echo "the sanitizer's runtime cannot run on this machine: skipped"
  exit 77
fi
exit "$rc"
