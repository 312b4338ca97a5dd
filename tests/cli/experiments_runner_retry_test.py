#!/usr/bin/python3
"""scripts/experiments/runner.py's run_one against a stand-in `switchyard`: a training whose
log ends in Open MPI's singleton start-up failure ("before MPI_INIT completed") is run again
(up to three times in all), and then evaluated as usual; any other failure, and a start-up
failure on every attempt, ends in the runner's error naming the log.
    experiments_runner_retry_test.py path/to/scripts/experiments
"""
import os
import stat
import sys
import tempfile
import types

sys.path.insert(0, os.path.abspath(sys.argv[1]))
import runner  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402

MPI_ABORT = "[vm:1] Local abort before MPI_INIT completed completed successfully, but not able"

# The stand-in: `train` fails (the message of $FAIL_TEXT) while the count in $COUNTER is below
# $FAILS, then makes its --out directory and exits 0; `eval` prints a JSON object.
STAND_IN = """#!/bin/sh
if [ "$1" = eval ]; then echo '{"loss": 1.0}'; exit 0; fi
n=$(cat "$COUNTER" 2>/dev/null || echo 0)
echo $((n + 1)) > "$COUNTER"
if [ "$n" -lt "$FAILS" ]; then echo "$FAIL_TEXT"; exit 1; fi
while [ $# -gt 0 ]; do
  if [ "$1" = --out ]; then mkdir -p "$2"; fi
  shift
done
exit 0
"""


def attempt(fails, text):
    """run_one with a stand-in failing `fails` times with `text`: (error or None, trainings)."""
    with tempfile.TemporaryDirectory() as d:
        bin_path = os.path.join(d, "switchyard")
        with open(bin_path, "w") as f:
            f.write(STAND_IN)
        os.chmod(bin_path, os.stat(bin_path).st_mode | stat.S_IEXEC)
        counter = os.path.join(d, "count")
        os.environ.update(COUNTER=counter, FAILS=str(fails), FAIL_TEXT=text)
        a = types.SimpleNamespace(out=os.path.join(d, "out"), bin=bin_path, config="c.yaml",
                                  steps=2, data=d, extra=[], identity={})
        try:
            runner.run_one(a, "setting", ["train.lr=0.1"], 1, 64, 1)
            error = None
        except RuntimeError as e:
            error = str(e)
        with open(counter) as f:
            return error, int(f.read())


error, runs = attempt(0, "")
check("no failure: one training", error is None and runs == 1, "%s %d" % (error, runs))
error, runs = attempt(2, MPI_ABORT)
check("two start-up failures: run again, the third succeeds", error is None and runs == 3,
      "%s %d" % (error, runs))
error, runs = attempt(3, MPI_ABORT)
check("three start-up failures: the error, after three trainings",
      error is not None and "before MPI_INIT" in error and runs == 3, "%s %d" % (error, runs))
error, runs = attempt(1, "switchyard train: error: model.d_model=0 must be > 0")
check("another failure: the error at once", error is not None and "d_model" in error and runs == 1,
      "%s %d" % (error, runs))
finish("experiments_runner_retry_test: ok")
