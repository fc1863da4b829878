"""Shared by the Python hook tests: PASS/FAIL lines in the format run.sh counts."""
import sys


class Checks:
    """`check(ok, msg)` prints one PASS or FAIL line tagged with the test's name; `finish()` prints
    the summary and exits 1 if any check failed."""

    def __init__(self, name):
        self.name, self.passed, self.failed = name, 0, 0

    def check(self, ok, msg):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print(("PASS" if ok else "FAIL") + " [%s] %s" % (self.name, msg), flush=True)

    def info(self, msg):
        print("INFO [%s] %s" % (self.name, msg), flush=True)

    def finish(self):
        print("%s: %d passed, %d failed" % (self.name, self.passed, self.failed))
        sys.exit(1 if self.failed else 0)
