#!/usr/bin/env bash
# `switchyard moe-layer` end to end (docs/moe-layer.md):
#  - layout invariance: one input (G=8, T=16, d=8, E=8, f=16, swiglu, top-2, biases, a
#    shared expert, expert bias, jitter, random second choice, capacity dropping, z-loss)
#    run on 1 rank (no mpirun) and under mpirun with 4 ranks, ep=4 and ep=2 (edp=2), and 2
#    ranks ep=2; every output tensor must agree with the 1-rank run (floats to a relative
#    1e-5 of the tensor's largest value, integers exactly), in train and in eval mode;
#  - numbers: a hand-checkable case (E=1, top-1, relu, biases, dropless, z-loss) against
#    values computed in Python from MODEL.md's formulas, on 1 and 2 ranks;
#  - errors: a missing tensor and a wrong shape give exactly one error line naming the
#    tensor and exit 1 (also under mpirun -np 4: one line from all ranks, no hang); a bad
#    flag exits 2; G % ranks != 0 and a tp layout are refused; no output file is written.
# Usage: moe_layer_cli_test.sh path/to/switchyard path/to/scripts/mpirun_test.sh
set -u
bin="$1"
mpirun_wrapper="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tool="$here/moe_layer_tool.py"
config="$root/configs/moe-layer-example.yaml"
python=/usr/bin/python3
[[ -x $python ]] || python=python3
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run NP ARGS...: the command on NP ranks (1: no mpirun), stdout/stderr to $tmp/out,
# $tmp/err; a 300 s limit turns a hang into a failure. Sets $rc.
run() {
  local np="$1"; shift
  if [[ $np -eq 1 ]]; then
    timeout 300 "$bin" moe-layer "$@" >"$tmp/out" 2>"$tmp/err"
  else
    timeout 300 bash "$mpirun_wrapper" "$np" "$bin" moe-layer "$@" >"$tmp/out" 2>"$tmp/err"
  fi
  rc=$?
  [[ $rc -ne 124 ]] || fail "np=$np $*: timed out (a rank hung?)"
}

# expect_ok NAME NP ARGS...
expect_ok() {
  local name="$1" np="$2"; shift 2
  run "$np" "$@"
  if [[ $rc -ne 0 ]]; then
    fail "$name: exit status $rc: $(cat "$tmp/err")"
    return
  fi
  grep -q '^wrote ' "$tmp/out" || fail "$name: no 'wrote' line in: $(cat "$tmp/out")"
  echo "--- $name: $(head -1 "$tmp/out")"
}

# compare NAME GOT WANT: every tensor agrees; prints the per-tensor differences.
compare() {
  local name="$1" got="$2" want="$3"
  if [[ ! -f $got ]]; then
    fail "$name: $got was not written"
    return
  fi
  $python "$tool" compare "$got" "$want" --rtol 1e-5 --label "$name" || fail "$name: outputs differ"
}

# expect_error NAME WANT_STATUS MESSAGE NP ARGS...: exit status (any non-zero when
# WANT_STATUS is "nonzero"), exactly one "switchyard moe-layer: error: " line containing
# MESSAGE (under mpirun other stderr lines are mpirun's own), and, on one rank, nothing else
# on stderr.
expect_error() {
  local name="$1" want_rc="$2" want="$3" np="$4"; shift 4
  rm -f "$tmp/err.out"
  run "$np" "$@"
  if [[ $want_rc == nonzero ]]; then
    [[ $rc -ne 0 ]] || fail "$name: exit status 0, want non-zero"
  else
    [[ $rc -eq $want_rc ]] || fail "$name: exit status $rc, want $want_rc"
  fi
  local lines
  lines=$(grep -c '^switchyard moe-layer: error: ' "$tmp/err")
  [[ $lines -eq 1 ]] || fail "$name: $lines error lines, want 1: $(cat "$tmp/err")"
  if [[ $np -eq 1 ]]; then
    [[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "$name: extra stderr: $(cat "$tmp/err")"
  fi
  grep '^switchyard moe-layer: error: ' "$tmp/err" | grep -qF -- "$want" ||
    fail "$name: the error lacks '$want': $(cat "$tmp/err")"
  [[ ! -e $tmp/err.out ]] || fail "$name: an output file was written"
  echo "--- $name (exit $rc): $(grep '^switchyard moe-layer: error: ' "$tmp/err")"
}

# ---- layout invariance ----------------------------------------------------------------
make_args=(--groups 8 --tokens 16 --d 8 --experts 8 --hidden 16 --activation swiglu --bias
           --shared-hidden 16 --expert-bias --seed 7)
$python "$tool" make --out "$tmp/in.safetensors" "${make_args[@]}" || fail "make input"
common=(--config "$config" --input "$tmp/in.safetensors")

expect_ok "1 rank" 1 "${common[@]}" --out "$tmp/r1.safetensors"
cat "$tmp/out"
expect_ok "np 4, ep 4" 4 "${common[@]}" --out "$tmp/r4_ep4.safetensors" --set parallel.ep=4
compare "np 4 ep 4 vs 1 rank" "$tmp/r4_ep4.safetensors" "$tmp/r1.safetensors"
expect_ok "np 4, ep 2, edp 2" 4 "${common[@]}" --out "$tmp/r4_ep2.safetensors" --set parallel.ep=2
compare "np 4 ep 2 vs 1 rank" "$tmp/r4_ep2.safetensors" "$tmp/r1.safetensors"
expect_ok "np 2, ep 2" 2 "${common[@]}" --out "$tmp/r2_ep2.safetensors" --set=parallel.ep=2
compare "np 2 ep 2 vs 1 rank" "$tmp/r2_ep2.safetensors" "$tmp/r1.safetensors"

# Eval mode and another step: other capacity, no jitter, other random second choices.
expect_ok "1 rank, eval, step 3" 1 "${common[@]}" --out "$tmp/e1.safetensors" --mode eval --step 3
expect_ok "np 4, ep 4, eval, step 3" 4 "${common[@]}" --out "$tmp/e4.safetensors" --mode eval \
  --step 3 --set parallel.ep=4
compare "eval np 4 ep 4 vs 1 rank" "$tmp/e4.safetensors" "$tmp/e1.safetensors"
if $python "$tool" compare "$tmp/e1.safetensors" "$tmp/r1.safetensors" >/dev/null; then
  fail "eval step 3 gave the same outputs as train step 0"
fi

# ---- hand-checkable numbers -------------------------------------------------------------
cat >"$tmp/tiny.yaml" <<'EOF'
model: {d_model: 2}
moe: {num_experts: 1, top_k: 1, d_expert: 2, activation: relu, bias: true,
      capacity_factor: 0, eval_capacity_factor: 0, aux_loss_coef: 0.01, z_loss_coef: 0.1}
EOF
$python "$tool" tiny --input "$tmp/tiny.safetensors" --expected "$tmp/tiny_want.safetensors" \
  --aux-loss-coef 0.01 --z-loss-coef 0.1 || fail "make tiny input"
tiny=(--config "$tmp/tiny.yaml" --input "$tmp/tiny.safetensors")
expect_ok "tiny, 1 rank" 1 "${tiny[@]}" --out "$tmp/tiny1.safetensors"
compare "tiny 1 rank vs hand-computed" "$tmp/tiny1.safetensors" "$tmp/tiny_want.safetensors"
expect_ok "tiny, np 2" 2 "${tiny[@]}" --out "$tmp/tiny2.safetensors"
compare "tiny np 2 vs hand-computed" "$tmp/tiny2.safetensors" "$tmp/tiny_want.safetensors"

# ---- errors -----------------------------------------------------------------------------
$python "$tool" make --out "$tmp/missing.safetensors" "${make_args[@]}" --omit experts.w3
$python "$tool" make --out "$tmp/badshape.safetensors" "${make_args[@]}" --bad-shape experts.w2
$python "$tool" make --out "$tmp/g6.safetensors" "${make_args[@]}" --groups 6
bad_out=(--out "$tmp/err.out")
expect_error "missing tensor" 1 "missing tensor 'experts.w3': expected f32 (8, 8, 16)" 1 \
  --config "$config" --input "$tmp/missing.safetensors" "${bad_out[@]}"
expect_error "missing tensor, np 4" nonzero "missing tensor 'experts.w3'" 4 \
  --config "$config" --input "$tmp/missing.safetensors" "${bad_out[@]}" --set parallel.ep=4
expect_error "wrong shape" 1 "tensor 'experts.w2': expected f32 (8, 16, 8), got f32 (8, 16, 9)" 1 \
  --config "$config" --input "$tmp/badshape.safetensors" "${bad_out[@]}"
expect_error "wrong shape, np 4" nonzero "tensor 'experts.w2'" 4 \
  --config "$config" --input "$tmp/badshape.safetensors" "${bad_out[@]}" --set parallel.ep=2
expect_error "unused tensor" 1 "tensor 'experts.w3' is not used by this config" 1 \
  "${common[@]}" "${bad_out[@]}" --set moe.activation=gelu
expect_error "G % ranks" nonzero "6 routing groups" 4 \
  --config "$config" --input "$tmp/g6.safetensors" "${bad_out[@]}" --set parallel.ep=4
expect_error "G % ranks (3 ranks)" nonzero "do not split over 3 ranks" 3 "${common[@]}" "${bad_out[@]}"
expect_error "unknown flag" 2 "unknown flag --bogus" 1 "${common[@]}" "${bad_out[@]}" --bogus 1
expect_error "bad --mode" 2 '--mode must be train or eval, got "fast"' 1 "${common[@]}" \
  "${bad_out[@]}" --mode fast
expect_error "bad flag, np 4" 2 "--step expects an integer" 4 "${common[@]}" "${bad_out[@]}" --step x
expect_error "missing --input" 2 "--input is required" 1 --config "$config" "${bad_out[@]}"
expect_error "--set without value" 2 "--set needs a value" 1 "${common[@]}" "${bad_out[@]}" --set
expect_error "bad --set key" 2 "unknown key 'moe.topk'" 1 "${common[@]}" "${bad_out[@]}" \
  --set moe.topk=2
expect_error "tp layout" 2 "parallel.tp=2 must be 1" 1 "${common[@]}" "${bad_out[@]}" \
  --set parallel.tp=2
expect_error "ep does not divide E" 2 "moe.num_experts=8 is not divisible by parallel.ep=3" 3 \
  "${common[@]}" "${bad_out[@]}" --set parallel.ep=3
expect_error "a GPU run on two ranks" 2 "moe-layer runs runtime.device=cuda on one rank only (got 2 ranks)" 2 \
  "${common[@]}" "${bad_out[@]}" --set runtime.device=cuda
expect_error "bad precision" 2 "runtime.precision='half' is not one of auto, fp32, bf16" 1 \
  "${common[@]}" "${bad_out[@]}" --set runtime.precision=half
expect_error "missing input file" 1 "nope.safetensors" 1 --config "$config" \
  --input "$tmp/nope.safetensors" "${bad_out[@]}"

# A finite input whose forward is not (a router weight of 3e38): exit 3, one line, nothing
# written (as eval does).
$python - "$tool" "$tmp/in.safetensors" "$tmp/huge.safetensors" <<'PY' || fail "make huge input"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("tool", sys.argv[1])
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)
tensors = tool.read_safetensors(sys.argv[2])  # name -> (dtype, shape, flat values)
tensors["router.weight"][2][0] = 3e38
tool.write_safetensors(sys.argv[3], tensors)
PY
expect_error "non-finite forward" 3 "huge.safetensors: the layer's output '" 1 --config "$config" \
  --input "$tmp/huge.safetensors" "${bad_out[@]}"
expect_error "non-finite forward, np 2" 3 "is not finite (" 2 --config "$config" \
  --input "$tmp/huge.safetensors" "${bad_out[@]}"
# --out the --input file: refused, the input unchanged.
cp "$tmp/in.safetensors" "$tmp/same.safetensors"
expect_error "--out is --input" 2 "--out $tmp/./same.safetensors is the --input file" 1 \
  --config "$config" --input "$tmp/same.safetensors" --out "$tmp/./same.safetensors"
cmp -s "$tmp/in.safetensors" "$tmp/same.safetensors" || fail "--out is --input: the input changed"
# --out the --config file (or a hard link to it): refused, the config unchanged.
cp "$config" "$tmp/layer.yaml"
ln "$tmp/layer.yaml" "$tmp/layer-link.yaml"
for out in "$tmp/layer.yaml" "$tmp/layer-link.yaml"; do
  expect_error "--out is --config ($(basename "$out"))" 2 "--out $out is the --config file" 1 \
    --config "$tmp/layer.yaml" --input "$tmp/in.safetensors" --out "$out"
  cmp -s "$config" "$tmp/layer.yaml" || fail "--out is --config: the config changed"
done
# An --input that is not a regular file: said so (not "cannot read the header length"), the
# same on one rank and on two; a FIFO does not hang the reader.
mkfifo "$tmp/fifo"
for np in 1 2; do
  expect_error "--input a directory, np $np" 1 "$tmp: is a directory, not a file" "$np" \
    --config "$config" --input "$tmp" "${bad_out[@]}"
  expect_error "--input a FIFO, np $np" 1 "$tmp/fifo: is a FIFO (named pipe), not a regular file" \
    "$np" --config "$config" --input "$tmp/fifo" "${bad_out[@]}"
  expect_error "--input missing, np $np" 1 "$tmp/none.st: cannot open (No such file or directory)" \
    "$np" --config "$config" --input "$tmp/none.st" "${bad_out[@]}"
done
# --out that cannot be created: named as given, with the system's reason, before the layer runs.
expect_error "--out in a missing directory" 1 \
  "--out $tmp/nodir/o.safetensors: cannot create it ($tmp/nodir: No such file or directory)" 1 \
  "${common[@]}" --out "$tmp/nodir/o.safetensors"
expect_error "--out under a file" 1 \
  "--out $tmp/in.safetensors/o.safetensors: cannot create it ($tmp/in.safetensors: Not a directory)" 1 \
  "${common[@]}" --out "$tmp/in.safetensors/o.safetensors"
expect_error "--out a directory" 1 "--out $tmp: is a directory; name the file to write" 1 \
  "${common[@]}" --out "$tmp"
grep -q "\.tmp\." "$tmp/err" && fail "--out a directory: the error names a temporary file"
expect_error "--out twice" 2 "--out is given twice" 1 "${common[@]}" "${bad_out[@]}" "${bad_out[@]}"

"$bin" moe-layer --help >"$tmp/out" 2>&1 && grep -q -- "--input" "$tmp/out" || fail "moe-layer --help"
"$bin" --help | grep -q "moe-layer" || fail "switchyard --help does not list moe-layer"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all switchyard moe-layer checks passed"
