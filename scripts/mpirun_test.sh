#!/usr/bin/env bash
# Runs a test binary under mpirun on loopback: mpirun_test.sh NP BINARY [ARGS...].
# Oversubscribes (CI has 2 cores) and allows root, which OpenMPI refuses by default.
set -euo pipefail
np=$1; shift
args=(--oversubscribe -np "$np" --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
if [ "$(id -u)" = 0 ]; then args+=(--allow-run-as-root); fi
exec mpirun "${args[@]}" "$@"
