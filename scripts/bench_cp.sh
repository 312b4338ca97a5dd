#!/usr/bin/env bash
# Ring attention for context parallelism (benchmarks/cp_attention_perf) at cp = 1, 2, 4
# (one mpirun each, cp = ranks), sequence lengths 512 to 4096, B 1, Hq 8, Hkv 2, hd 64:
# forward + backward time per rank, the exposed communication, the ranks' balance and the
# bytes sent beside the analytic volume. Each run uses the machine's cores once: OpenBLAS
# threads per rank = max(1, cores / cp). JSON per run under out/bench_cp/, then merged into
# out/bench_cp/cp_attention.json with one summary table (speedup = cp 1's total / this
# total at the same S). Usage: bash scripts/bench_cp.sh [extra cp_attention_perf flags]
# (defaults: --seq_lens 512,1024,2048,4096 -n 3 -w 1; later flags override).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/cp_attention_perf
[[ -x $bin ]] || { echo "bench_cp: $bin is missing; run bash scripts/setup.sh" >&2; exit 2; }
mkdir -p out/bench_cp
cores=$(nproc)
for cp in 1 2 4; do
  threads=$(( cores / cp > 1 ? cores / cp : 1 ))
  echo "=== cp $cp ($threads OpenBLAS thread(s) per rank)"
  bash scripts/mpirun_test.sh "$cp" "$bin" --seq_lens 512,1024,2048,4096 -n 3 -w 1 \
    --threads "$threads" --json "out/bench_cp/cp${cp}.json" "$@"
done
python3 - <<'EOF'
import json
runs = [json.load(open(f"out/bench_cp/cp{cp}.json")) for cp in (1, 2, 4)]
base = {r["seq"]: r["total"] for r in runs[0]["rows"]}
print("=== merged: out/bench_cp/cp_attention.json")
print(f"{'seq':>6} {'cp':>3} {'total_ms':>9} {'speedup':>8} {'wait_ms':>8} {'balance':>8} "
      f"{'cbal':>6} {'fwd_sent':>10} {'fwd_vol':>10} {'bwd_sent':>10} {'bwd_vol':>10} {'pairs/rank':>11}")
for seq in sorted(base):
    for run in runs:
        for r in run["rows"]:
            if r["seq"] != seq:
                continue
            print(f"{seq:>6} {run['cp']:>3} {r['total']:>9.1f} {base[seq] / r['total']:>8.2f} "
                  f"{r['wait']:>8.1f} {r['balance']:>8.3f} {r['cbal']:>6.3f} {r['fwd_sent']:>10} "
                  f"{r['fwd_vol']:>10} {r['bwd_sent']:>10} {r['bwd_vol']:>10} {r['pairs']:>11}")
json.dump({"benchmark": "cp_attention_perf", "runs": runs},
          open("out/bench_cp/cp_attention.json", "w"), indent=2)
print("ok" if all(r["ok"] for r in runs) else "FAILED: some run counted wrong values")
EOF
