"""The check() the experiment scripts' Python tests share (tests/cli/experiments_*_test.py):
each failed check prints one FAIL line and is counted; finish() exits 1 when any failed."""
import sys

failures = 0


def check(name, ok, detail=""):
    global failures
    if not ok:
        failures += 1
        print("FAIL: %s %s" % (name, detail))


def finish(message=None):
    if failures:
        sys.exit(1)
    if message:
        print(message)
