#!/usr/bin/env bash
# Runs `mpirun ARGS...` as a job a scheduler can preempt: mpirun_job.sh [mpirun args...].
#
# Open MPI 4.1's mpirun does not forward SIGTERM: it kills the job (each rank gets SIGTERM
# only after odls_base_sigkill_timeout, 1 s by default, then SIGKILL as long after, which
# cuts a checkpoint save) and exits 1. It does forward SIGUSR1 to every rank at once, and
# `switchyard train` treats SIGUSR1 as SIGTERM: stop after the step in progress, save it,
# exit 75. So this script starts mpirun in its own process group, turns a SIGTERM or SIGINT
# it receives into one SIGUSR1 to mpirun, and exits with mpirun's status: 75 when the ranks
# stopped and saved (mpirun passes on the ranks' non-zero status), as a single
# `switchyard train` does. Any other status is mpirun's own. docs/failures.md has the
# details and the Slurm form.
#   scripts/mpirun_job.sh -np 8 switchyard train --config c.yaml --out runs/x
# MPIRUN (default mpirun) names the launcher (split into words: "bash tests/launcher.sh 2").
set -u
set -m  # background jobs in their own process group: a group-wide SIGTERM reaches this script, not mpirun
${MPIRUN:-mpirun} "$@" &
pid=$!
stop() { kill -USR1 "$pid" 2>/dev/null; }
trap stop TERM INT
while true; do
  wait "$pid"
  rc=$?
  # wait returns early (status > 128) when a trapped signal arrives; go on waiting.
  kill -0 "$pid" 2>/dev/null || break
done
exit "$rc"
