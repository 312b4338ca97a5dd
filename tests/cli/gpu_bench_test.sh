#!/usr/bin/env bash
# The GPU benchmark's driver (benchmarks/reference/gpu_bench.py, run by scripts/gpu_bench.sh)
# on the CPU: one tiny case (switch-tiny, micro-batch 4), both sides in f32 with --device cpu,
# two alternating rounds of 3 timed steps. Checks that it runs end to end and writes what the
# GPU run will be read for: per side tokens/s, the dropped fraction and the step-0 loss
# (within 0.1 of ln V: both start from the same initialisation scheme), the planner's step,
# the phases of `--profile`, the reference's paths (its CPU fallbacks named), ours' peak
# memory beside the dry-run's (within 2x: the units read right); and that the table names the
# case; a second case with the eager reference (torch:compile=0), and the targets' summary
# sorting the two ratios by reference. Never looks at the timings' values. Skipped (77) without
# python3-torch.
# Usage: gpu_bench_test.sh path/to/switchyard path/to/train_batches
set -u
bin="$1"
batches_bin="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
python=/usr/bin/python3
if ! $python -c "import torch, numpy" 2>/dev/null; then
  echo "SKIPPED: $python cannot import torch and numpy (apt-get install python3-torch)"
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/corpus"
for i in $(seq 1 300); do
  printf 'the cat %d sat on the mat and the dog ran away from it\n%%\n' "$i" >>"$tmp/corpus/en.txt"
  printf 'der hund %d lief weit weg und die katze schlief im haus\n\n' "$i" >>"$tmp/corpus/de.txt"
done
"$bin" prep --out "$tmp/data" --vocab 120 --val-fraction 0.1 --seed 1 \
  "$tmp/corpus/en.txt" "$tmp/corpus/de.txt" >"$tmp/prep.out" 2>&1 ||
  { echo "FAIL: prep: $(cat "$tmp/prep.out")"; exit 1; }
# A calibrated file as plan_calibrate_gpu writes one: the bench plans with it, and again at
# elementwise_efficiency 1.
{ cat "$root/configs/hardware/h200.yaml"; echo "elementwise_efficiency: 0.25"; } >"$tmp/calibrated.yaml"
$python "$root/benchmarks/reference/gpu_bench.py" --switchyard "$bin" --train_batches "$batches_bin" \
  --data "$tmp/data" --out "$tmp/out" --cases switch-tiny-smoke,switch-tiny-smoke-eager --device cpu \
  --rounds 2 --steps 3 --calibration "$tmp/calibrated.yaml" \
  --warmup 1 >"$tmp/run.out" 2>&1 || { echo "FAIL: gpu_bench.py: $(tail -15 "$tmp/run.out")"; exit 1; }
cat "$tmp/out/gpu_bench.txt"
$python - "$tmp/out/gpu_bench.json" "$tmp/out/gpu_bench.txt" <<'PY' || exit 1
import json, math, sys
j = json.load(open(sys.argv[1]))
row = j["cases"][0]
bad = []
if row.get("case") != "switch-tiny-smoke" or "skipped" in row:
    bad.append(f"case not run: {row}")
for side in ("ours", "torch"):
    s = row.get(side, {})
    if not s.get("tokens_per_s", 0) > 0:
        bad.append(f"{side}: no tokens/s")
    if not 0.0 <= s.get("dropped_frac", -1) <= 1.0:
        bad.append(f"{side}: dropped_frac {s.get('dropped_frac')}")
    if abs(s.get("first_loss", 0) - row["ln_vocab"]) > 0.1:
        bad.append(f"{side}: step-0 loss {s.get('first_loss')} is not near ln V {row['ln_vocab']}")
if len(row.get("torch", {}).get("rounds", [])) != 2 or len(row.get("ours", {}).get("rounds", [])) != 2:
    bad.append("not two rounds per side")
if not row.get("plan", {}).get("step_s", 0) > 0:
    bad.append(f"no plan: {row.get('plan_error')}")
cal, one = row.get("plan_calibrated") or {}, row.get("plan_calibrated_elementwise1") or {}
if not one.get("step_s", 0) > 0 or not cal.get("step_s", 0) > one["step_s"]:
    bad.append(f"the calibrated plans: {cal.get('step_s')} s, at elementwise_efficiency 1 {one.get('step_s')} s")
if "at elementwise_efficiency 1)" not in open(sys.argv[2]).read():
    bad.append("no elementwise_efficiency 1 plan in the table")
if not row.get("flops_per_token", 0) > 0:
    bad.append("no FLOPs per token from the dry run")
ledger, held, dry = (row["ours"].get("ledger_peak_bytes"), row["ours"].get("held_peak_bytes"),
                     row.get("dry_run_peak_bytes"))
if not (ledger and held and dry):
    bad.append(f"memory missing: ours {ledger} held {held} dry-run {dry}")
elif not 0.5 < ledger / dry < 2:  # the dry-run's figure read in the wrong unit
    bad.append(f"ours' peak {ledger} B against the dry-run's {dry} B")
if "memory GiB: ours" not in open(sys.argv[2]).read():
    bad.append("no memory line in the table")
if "ms_per_step" not in row["ours"].get("profile", {}):
    bad.append("no profile phases")
paths = row.get("torch", {}).get("paths", {})
if not all(k in paths for k in ("attention", "experts", "optimizer", "compile")):
    bad.append(f"reference paths missing: {paths}")
text = open(sys.argv[2]).read()
if "switch-tiny-smoke" not in text:
    bad.append("the table does not name the case")
# The eager reference (torch:compile=0) and the targets' summary, which sorts the ratios by
# the reference they are against.
eager = j["cases"][1]
if eager.get("case") != "switch-tiny-smoke-eager" or "skipped" in eager or not eager.get("torch_eager"):
    bad.append(f"the eager case: {eager.get('case')} {eager.get('skipped')} torch_eager {eager.get('torch_eager')}")
elif "eager reference" not in eager.get("torch", {}).get("paths", {}).get("compile", ""):
    bad.append(f"the eager case's torch compiled: {eager.get('torch', {}).get('paths')}")
lines = {l.split(":")[0].strip(): l for l in text.splitlines() if l.startswith("  ")}
strong = lines.get("ours >= 1.2x the strong reference", "")
weak = lines.get("ours >= 2.0x PyTorch eager at switch-medium", "")
if "issue #36 targets:" not in text or "switch-tiny-smoke " not in strong or \
        "switch-tiny-smoke-eager" in strong or "switch-tiny-smoke-eager" not in weak:
    bad.append(f"the targets' lines: {strong!r} {weak!r}")
for b in bad:
    print("FAIL:", b)
sys.exit(1 if bad else 0)
PY
echo "gpu_bench.py runs end to end on the CPU and reports both sides"
