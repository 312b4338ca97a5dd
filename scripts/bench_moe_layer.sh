#!/usr/bin/env bash
# One MoE layer, forward + backward, ours (build/bin/moe_layer_perf, one rank) beside the
# plain-PyTorch reference (benchmarks/reference/moe_layer_torch.py) at the same shapes and
# the same thread count; prints one table and writes $OUT/moe_layer.json.
#
#   bash scripts/bench_moe_layer.sh                       # the default shapes
#   SHAPES="4096,512,1024,8,2,gelu,1.25" THREADS=2 ITERS=20 bash scripts/bench_moe_layer.sh
#
# SHAPES: space-separated "tokens,d,f,E,k,activation,capacity" entries. THREADS: OpenBLAS
# threads for us and torch.set_num_threads for the reference (default: all cores).
# Installs Debian's python3-torch with apt-get when /usr/bin/python3 cannot import torch.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
OUT=${OUT:-runs/bench}
THREADS=${THREADS:-$(nproc)}
ITERS=${ITERS:-10}
WARMUP=${WARMUP:-2}
SHAPES=${SHAPES:-"2048,512,1024,8,2,gelu,1.25 2048,512,1024,8,2,swiglu,1.25 4096,256,512,16,1,gelu,1.25"}
PY=/usr/bin/python3
BIN=$BUILD/bin/moe_layer_perf

if [ ! -x "$BIN" ]; then
  echo "bench_moe_layer: $BIN not found; build it: cmake --build $BUILD --target moe_layer_perf" >&2
  exit 1
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "bench_moe_layer: installing python3-torch (Debian) for the reference" >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y --no-install-recommends python3-torch >&2
fi

mkdir -p "$OUT/moe_layer"
i=0
for shape in $SHAPES; do
  IFS=, read -r tokens d f e k act cf <<<"$shape"
  args=(--tokens "$tokens" --hidden "$d" --ffn "$f" --experts "$e" --topk "$k"
        --activation "$act" --capacity "$cf" -n "$ITERS" -w "$WARMUP")
  echo "# shape $shape: ours" >&2
  OPENBLAS_NUM_THREADS=$THREADS "$BIN" "${args[@]}" --threads "$THREADS" \
    --json "$OUT/moe_layer/ours-$i.json" >&2
  echo "# shape $shape: torch" >&2
  "$PY" benchmarks/reference/moe_layer_torch.py "${args[@]}" --threads "$THREADS" \
    --json "$OUT/moe_layer/torch-$i.json" >&2
  i=$((i + 1))
done

"$PY" - "$OUT" "$i" "$THREADS" <<'EOF'
import json, sys
out, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = []
print(f"# MoE layer fwd+bwd, one rank, {threads} thread(s); ratio = torch / ours (> 1: ours faster)")
print("#  tokens     d     f    E  k     act    cf |  ours fwd    bwd   total | torch fwd    bwd   total |  ratio  %peak")
print("#                                           |      (ms)   (ms)    (ms) |      (ms)   (ms)    (ms) |")
for i in range(n):
    ours = json.load(open(f"{out}/moe_layer/ours-{i}.json"))
    ref = json.load(open(f"{out}/moe_layer/torch-{i}.json"))
    r = ours["rows"][0]
    ratio = ref["total_ms"] / ours["total_ms"]
    print(f"  {r['tokens']:6d} {r['d']:5d} {r['f']:5d} {r['E']:4d} {r['k']:2d} {r['act']:>7s} {r['cf']:5.2f} |"
          f" {ours['fwd_ms']:9.2f} {ours['bwd_ms']:6.2f} {ours['total_ms']:7.2f} |"
          f" {ref['fwd_ms']:9.2f} {ref['bwd_ms']:6.2f} {ref['total_ms']:7.2f} | {ratio:6.2f} {r['%peak']:6.1f}")
    rows.append({"shape": {k: r[k] for k in ("tokens", "d", "f", "E", "k", "act", "cf")},
                 "ours": {k: ours[k] for k in ("fwd_ms", "bwd_ms", "total_ms")},
                 "torch": {k: ref[k] for k in ("fwd_ms", "bwd_ms", "total_ms")},
                 "torch_over_ours": ratio, "ours_peak_fraction": r["%peak"] / 100,
                 "ours_gemm_peak_fraction": r["gemm%peak"] / 100})
json.dump({"benchmark": "bench_moe_layer", "threads": threads, "torch": ref.get("torch"),
           "rows": rows}, open(f"{out}/moe_layer.json", "w"), indent=2)
print(f"# wrote {out}/moe_layer.json")
EOF
