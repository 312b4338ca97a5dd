#!/usr/bin/env bash
# rank_rc.sh BIN ARGS...: one rank of an `mpirun ... bash rank_rc.sh BIN ARGS` job. Runs the
# rank, writes its exit status to $RC_DIR/<world rank>, then waits (up to 60 s) until every
# rank of the job has written its own before exiting. mpirun kills the other ranks as soon
# as one exits non-zero, so without the wait a rank still tearing down after the same error
# (or the same SIGTERM) leaves no status, and a test reads '' where the rank exited 3 or 75.
# mpirun signals the process group: the shell outlives a SIGUSR1 that stops the rank.
trap : USR1
"$@"
rc=$?
echo "$rc" >"$RC_DIR/${OMPI_COMM_WORLD_RANK:-0}"
for ((i = 0; i < 1200; ++i)); do
  [[ $(find "$RC_DIR" -maxdepth 1 -type f | wc -l) -ge ${OMPI_COMM_WORLD_SIZE:-1} ]] && break
  sleep 0.05
done
exit "$rc"
