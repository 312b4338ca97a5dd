#!/usr/bin/env bash
# The CPU calibration at tiny sizes (ctest label bench): plan_calibrate on NP ranks writes a
# hardware file that `switchyard plan` reads, and `plan` ranks the tiny config's layouts on it.
# Figures are not checked (a shared machine); that it measures, fits and writes is.
# Usage: plan_calibrate_test.sh SWITCHYARD PLAN_CALIBRATE NP REPO
set -euo pipefail
bin=$1 calibrate=$2 np=$3 repo=$4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
launch=()
if [ "$np" -gt 1 ]; then launch=(bash "$repo/scripts/mpirun_test.sh" "$np"); fi
"${launch[@]}" "$calibrate" --out "$tmp/cpu.yaml" --gemm-sizes 16,32,64 --copy-bytes 1M \
  --max-message 4K -n 2 -w 1 --config "$repo/configs/switch-tiny.yaml" --steps 2 > "$tmp/log" 2>&1 || { cat "$tmp/log"; echo "plan_calibrate failed"; exit 1; }
grep -q "^name: cpu-calibrated" "$tmp/cpu.yaml" || { cat "$tmp/cpu.yaml"; echo "no hardware file"; exit 1; }
grep -q "^cores_per_node: [1-9]" "$tmp/cpu.yaml" || { cat "$tmp/cpu.yaml"; echo "no cores_per_node"; exit 1; }
grep -q "^# overhead: a step of .*operations" "$tmp/log" || { cat "$tmp/log"; echo "no overhead run"; exit 1; }
"$bin" plan --config "$repo/configs/switch-tiny.yaml" --gpus "$np" --gpu "$tmp/cpu.yaml" --top 3 \
  > "$tmp/plan" 2>&1 || { cat "$tmp/plan"; echo "plan on the calibrated file failed"; exit 1; }
grep -q "on $np x cpu-calibrated" "$tmp/plan" || { cat "$tmp/plan"; echo "plan did not use the file"; exit 1; }
grep -q ", fp32$" "$tmp/plan" || { cat "$tmp/plan"; echo "a cpu file should plan in fp32"; exit 1; }
echo "plan_calibrate_test: OK ($np rank(s))"
