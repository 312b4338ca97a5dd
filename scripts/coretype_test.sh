#!/usr/bin/env bash
# Runs a test under one OpenBLAS core type: coretype_test.sh CORE COMMAND [ARGS...].
# OPENBLAS_CORETYPE picks the sgemm kernel of an OpenBLAS built with DYNAMIC_ARCH (Debian's
# is), so a machine runs the kernels other machines would (Sandybridge: AVX; Haswell and Zen:
# AVX2 + FMA, other blockings; SkylakeX: AVX-512). mpirun passes the variables to every rank.
# Exits 77 (ctest: skipped) with the reason when this CPU cannot run CORE's instructions or
# OpenBLAS cannot be told which kernel to use; fails when a process ran another core type.
set -uo pipefail
core=$1; shift
case "$core" in
  Sandybridge) need=(avx) ;;
  Haswell|Zen) need=(avx2 fma) ;;
  SkylakeX) need=(avx512f avx512bw avx512vl avx512dq avx512cd) ;;
  *) echo "coretype_test.sh: unknown core type $core" >&2; exit 2 ;;
esac
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
for f in "${need[@]}"; do
  if [[ "$flags" != *" $f "* ]]; then
    echo "SKIPPED: this CPU has no $f, which OpenBLAS's $core kernels need"
    exit 77
  fi
done
export OPENBLAS_CORETYPE=$core OPENBLAS_VERBOSE=2
export OMPI_MCA_mca_base_env_list="${OMPI_MCA_mca_base_env_list:+$OMPI_MCA_mca_base_env_list;}OPENBLAS_CORETYPE;OPENBLAS_VERBOSE"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[[ $rc -eq 0 ]] || exit "$rc"
# OpenBLAS with DYNAMIC_ARCH prints "Core: NAME" once per process under OPENBLAS_VERBOSE=2.
chosen=$(grep -o '^Core: [A-Za-z0-9]*' "$log" | sort | uniq -c)
if [[ -z "$chosen" ]]; then
  echo "SKIPPED: OpenBLAS printed no core type (not built with DYNAMIC_ARCH?), so $core was not used"
  exit 77
fi
if grep '^Core: ' "$log" | grep -qv "^Core: $core\$"; then
  echo "FAILED: asked for OPENBLAS_CORETYPE=$core, processes ran: $chosen" >&2
  exit 1
fi
echo "coretype_test.sh: every process ran OpenBLAS's $core kernels ($(echo $chosen))"
