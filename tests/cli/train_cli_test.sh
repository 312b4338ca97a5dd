#!/usr/bin/env bash
# `switchyard train` end to end on tests/data/train-tiny.yaml and a small three-language
# corpus written here (vocabulary 256). Global batch 16 x 16 tokens everywhere: grad_accum
# 4 on one rank, 2 on two, 1 on four.
#  - resume is bit-identical on the same layout: 12 steps straight vs 6 + --resume 6, on
#    one rank and under mpirun -np 2 (ep=2): the same loss strings in metrics.jsonl and
#    byte-identical model and optimizer files at step 12;
#  - cross-layout resume: a checkpoint saved under -np 2 (dp=2, ep=2) resumed on one rank
#    and under -np 4 (ep=4): the losses of steps 6..11 within a relative 1e-5 of the
#    uninterrupted runs;
#  - tensor parallelism across layouts: 6 steps under (tp 2, ep 2) on 4 ranks resumed under
#    (tp 1, ep 4), and (etp 2, ep 2): the losses of the 1-rank run within 1e-5, and the
#    checkpoints evaluate to the same loss on 1 rank and under (tp 2, ep 2);
#  - a rank dies (SIGKILL under -np 2): mpirun ends the job non-zero, no hang, and the last
#    checkpoint resumes;
#  - SIGTERM: a 300-step run (one rank; -np 2 with only one rank signalled) stops after
#    the step it was in, exits 75 on every rank, saves that step (latest, trainer_state.json), and
#    --resume finishes with exactly the losses and weights of an uninterrupted run;
#  - bad inputs: exactly one "switchyard train: error:" line naming the problem, a
#    non-zero exit, and the existing checkpoints unchanged (checksums before/after):
#    unknown keys, a wrong type, ep not dividing the experts, a world ep does not divide,
#    parallel.cp=2 with seq_len not divisible by 2 cp, tp on one process, tp not dividing n_heads, etp not dividing d_expert,
#    seq_len not divisible by tp, tp 4 on 2 ranks ("needs 4 ranks ... mpirun -np 4"), a missing data dir (exit 1), a truncated checkpoint, another model's checkpoint,
#    a missing checkpoint, a bad --steps; a previous run in --out without --resume (exit
#    2, on 1 and 2 ranks, the run byte-identical after), an empty --resume or --out, a
#    flag given twice;
#  - optional: the loss falls on the fortune corpus when it is installed.
# Usage: train_cli_test.sh path/to/switchyard path/to/scripts/mpirun_test.sh
set -u
bin="$1"
mpirun_wrapper="$2"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
config="$root/tests/data/train-tiny.yaml"
python=/usr/bin/python3
[[ -x $python ]] || python=python3
failures=0
tmp="$(mktemp -d)"
running=""  # the pid of a background run not yet waited for
# rank_pids PID: the switchyard processes under PID (mpirun's ranks), in pid order.
rank_pids() {
  local child
  for child in $(pgrep -P "$1"); do
    [[ "$(ps -o comm= -p "$child")" == switchyard ]] && echo "$child"
    rank_pids "$child"
  done | sort -n
}
source "$(dirname "$0")/run_guard_lib.sh"
# Each rank of a multi-rank job through rank_rc.sh, which records its exit status in $RC_DIR.
rank_rc="$(cd "$(dirname "$0")" && pwd)/rank_rc.sh"
SECONDS=0

# ---- data -------------------------------------------------------------------------------
# Three "languages" of templated two-line documents in fortune format (120 each).
make_corpus() {
  local dir="$1" i
  mkdir -p "$dir"
  local en_s=("the cat" "the dog" "a bird" "my friend" "the old man")
  local de_s=("der hund" "die katze" "ein vogel" "mein freund" "der alte")
  local fr_s=("le chat" "le chien" "un oiseau" "mon ami" "le vieux")
  local en_v=(sat ran sang slept jumped) de_v=(lief sang schlief sprang sass)
  local fr_v=(dort chante court saute mange)
  for i in $(seq 0 119); do
    printf '%s %s on the mat %d times\nand then it %s again\n%%\n' "${en_s[i % 5]}" \
      "${en_v[i % 5]}" $((i % 7)) "${en_v[(i + 2) % 5]}" >>"$dir/en.txt"
    printf '%s %s auf der matte %d mal\nund dann %s es wieder\n%%\n' "${de_s[i % 5]}" \
      "${de_v[i % 5]}" $((i % 7)) "${de_v[(i + 3) % 5]}" >>"$dir/de.txt"
    printf '%s %s sur le tapis %d fois\net puis il %s encore\n%%\n' "${fr_s[i % 5]}" \
      "${fr_v[i % 5]}" $((i % 7)) "${fr_v[(i + 1) % 5]}" >>"$dir/fr.txt"
  done
}
make_corpus "$tmp/corpus"
if ! "$bin" prep --out "$tmp/data" --vocab 256 "$tmp"/corpus/*.txt >"$tmp/prep.log" 2>&1; then
  cat "$tmp/prep.log"
  echo "FAIL: prep"
  exit 1
fi

# ---- helpers ----------------------------------------------------------------------------
# set_cfg NP EP: cfg=(the config's arguments for NP ranks: the data, grad_accum
# 16 / (4 * NP), parallel.ep=EP).
set_cfg() {
  cfg=(--config "$config" --set "data.dir=$tmp/data" --set "train.grad_accum=$((4 / $1))"
       --set "parallel.ep=$2")
}

# run NP ARGS...: `switchyard train ARGS` on NP ranks (1: no mpirun), stdout/stderr to
# $tmp/out, $tmp/err; a 300 s limit turns a hang into a failure. Sets $rc.
run() {
  local np="$1"; shift
  if [[ $np -eq 1 ]]; then
    timeout 300 "$bin" train "$@" >"$tmp/out" 2>"$tmp/err"
  else
    timeout 300 bash "$mpirun_wrapper" "$np" "$bin" train "$@" >"$tmp/out" 2>"$tmp/err"
  fi
  rc=$?
  [[ $rc -ne 124 ]] || fail "np=$np $*: timed out (a rank hung?)"
}

# train_ok NAME NP EP ARGS...: a run that must succeed.
train_ok() {
  local name="$1" np="$2" ep="$3"; shift 3
  set_cfg "$np" "$ep"
  run "$np" "${cfg[@]}" "$@"
  if [[ $rc -ne 0 ]]; then
    fail "$name: exit status $rc: $(tail -5 "$tmp/err")"
    return 1
  fi
  echo "--- $name ($SECONDS s)"
}

# compare_losses NAME MODE GOT WANT FIRST LAST: MODE "exact" or a relative tolerance
# (tests/cli/compare_losses.py).
compare_losses() {
  local name="$1" mode="$2" got="$3" want="$4" first="$5" last="$6" msg
  if msg=$($python "$here/compare_losses.py" "$mode" "$got" "$want" "$first" "$last" 2>&1); then
    echo "    $name: $msg"
  else
    fail "$name: $msg"
  fi
}

# same_files NAME DIR1 DIR2 FILES...: byte-identical.
same_files() {
  local name="$1" a="$2" b="$3" f; shift 3
  for f in "$@"; do
    cmp -s "$a/$f" "$b/$f" || fail "$name: $f differs between $a and $b"
  done
}

# same_tensors NAME A B: two step directories saved under the same layout hold the same
# tensor files (every rank's model-* and optimizer-* file, or model.safetensors and
# optimizer.safetensors on one rank) and the same index, byte for byte.
same_tensors() {
  local name="$1" a="$2" b="$3" files
  files=$(cd "$a" && ls -- *.safetensors 2>/dev/null | sort)
  [[ -n $files ]] || fail "$name: no .safetensors files in $a"
  [[ "$files" == "$(cd "$b" && ls -- *.safetensors 2>/dev/null | sort)" ]] ||
    fail "$name: $a and $b hold different files: $(ls "$a") vs $(ls "$b")"
  # shellcheck disable=SC2086
  same_files "$name" "$a" "$b" $files model.safetensors.index.json
}

# checksum DIR: one hash of every file's name and bytes.
checksum() {
  (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}

# expect_error NAME MESSAGE NP ARGS...: a non-zero exit, exactly one
# "switchyard train: error: " line containing MESSAGE (under mpirun the other stderr lines
# are mpirun's), and on one rank nothing else on stderr.
expect_error() {
  local name="$1" want="$2" np="$3"; shift 3
  run "$np" "$@"
  [[ $rc -ne 0 ]] || fail "$name: exit status 0, want non-zero"
  local lines
  lines=$(grep -c '^switchyard train: error: ' "$tmp/err")
  [[ $lines -eq 1 ]] || fail "$name: $lines error lines, want 1: $(cat "$tmp/err")"
  if [[ $np -eq 1 ]]; then
    [[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "$name: extra stderr: $(cat "$tmp/err")"
  fi
  grep '^switchyard train: error: ' "$tmp/err" | grep -qF -- "$want" ||
    fail "$name: the error lacks '$want': $(cat "$tmp/err")"
  echo "--- $name (exit $rc): $(grep '^switchyard train: error: ' "$tmp/err")"
}

steps12=(--set train.max_steps=12)

# ---- resume is bit-identical on the same layout -------------------------------------------
for layout in "1 1" "2 2"; do
  read -r np ep <<<"$layout"
  tag="np$np-ep$ep"
  train_ok "$tag: 12 steps straight" "$np" "$ep" "${steps12[@]}" --out "$tmp/straight-$tag"
  train_ok "$tag: 6 steps" "$np" "$ep" "${steps12[@]}" --out "$tmp/half-$tag" --steps 6
  [[ "$(cat "$tmp/half-$tag/latest" 2>/dev/null)" == step-00000006 ]] ||
    fail "$tag: latest after 6 steps is '$(cat "$tmp/half-$tag/latest" 2>/dev/null)'"
  # The step-6 checkpoint for the cross-layout resumes below.
  cp -r "$tmp/half-$tag/step-00000006" "$tmp/ckpt6-$tag"
  # No --out: a resumed run goes on in its own directory.
  train_ok "$tag: --resume for the other 6" "$np" "$ep" "${steps12[@]}" --resume "$tmp/half-$tag"
  grep -q "^resumed from .*step-00000006 at step 6 (saved with world $np, ep $ep" "$tmp/out" ||
    fail "$tag: no 'resumed from' line: $(grep resumed "$tmp/out")"
  compare_losses "$tag: straight vs resumed" exact "$tmp/half-$tag/metrics.jsonl" \
    "$tmp/straight-$tag/metrics.jsonl" 0 11
  same_tensors "$tag: straight vs resumed, step 12" "$tmp/half-$tag/step-00000012" \
    "$tmp/straight-$tag/step-00000012"
done
# The two layouts agree with each other too.
compare_losses "np 2 ep 2 vs 1 rank (straight)" 1e-5 "$tmp/straight-np2-ep2/metrics.jsonl" \
  "$tmp/straight-np1-ep1/metrics.jsonl" 0 11

# ---- cross-layout resume ----------------------------------------------------------------
train_ok "resume the np 2 ep 2 checkpoint on 1 rank" 1 1 "${steps12[@]}" --out "$tmp/x1" \
  --resume "$tmp/ckpt6-np2-ep2"
compare_losses "np 2 ep 2 -> 1 rank" 1e-5 "$tmp/x1/metrics.jsonl" \
  "$tmp/straight-np1-ep1/metrics.jsonl" 6 11
train_ok "resume the np 2 ep 2 checkpoint on 4 ranks, ep 4" 4 4 "${steps12[@]}" --out "$tmp/x4" \
  --resume "$tmp/ckpt6-np2-ep2"
grep -q "^world 4: .* ep 4 " "$tmp/out" || fail "np 4: no 'world 4 ... ep 4' line"
compare_losses "np 2 ep 2 -> np 4 ep 4" 1e-5 "$tmp/x4/metrics.jsonl" \
  "$tmp/straight-np1-ep1/metrics.jsonl" 6 11
compare_losses "np 2 ep 2 -> np 4 ep 4 (vs np 2)" 1e-5 "$tmp/x4/metrics.jsonl" \
  "$tmp/straight-np2-ep2/metrics.jsonl" 6 11

# ---- tensor and expert tensor parallelism across layouts ---------------------------------
# 6 steps under (tp 2, ep 2) on 4 ranks (dp 2), resumed under (tp 1, ep 4), and the step-12
# checkpoint evaluated on 1 rank and on 2 under (tp 2, ep 2): the losses follow the 1-rank
# run, and both evaluations give the same loss.
train_ok "np 4 tp 2 ep 2: 6 steps" 4 2 "${steps12[@]}" --set parallel.tp=2 \
  --set train.grad_accum=2 --out "$tmp/tp" --steps 6
grep -q "^world 4: tp 2 x cp 1 x dp 2" "$tmp/out" || fail "tp 2: no 'world 4: tp 2 ...' line"
train_ok "np 4 tp 2 ep 2 -> tp 1 ep 4: 6 more" 4 4 "${steps12[@]}" --out "$tmp/tp" \
  --resume "$tmp/tp"
compare_losses "tp 2 ep 2 then tp 1 ep 4 vs 1 rank" 1e-5 "$tmp/tp/metrics.jsonl" \
  "$tmp/straight-np1-ep1/metrics.jsonl" 0 11
train_ok "np 4 tp 1 etp 2 ep 2: 12 steps" 4 2 "${steps12[@]}" --set parallel.etp=2 \
  --out "$tmp/etp"
compare_losses "etp 2 ep 2 vs 1 rank" 1e-5 "$tmp/etp/metrics.jsonl" \
  "$tmp/straight-np1-ep1/metrics.jsonl" 0 11
eval_loss() {  # eval_loss NP ARGS...: the loss `switchyard eval --json` prints
  local np="$1"; shift
  if [[ $np -eq 1 ]]; then
    timeout 300 "$bin" eval --json "$@" >"$tmp/eval.json" 2>"$tmp/eval.err"
  else
    timeout 300 bash "$mpirun_wrapper" "$np" "$bin" eval --json "$@" >"$tmp/eval.json" \
      2>"$tmp/eval.err"
  fi || fail "eval $*: $(tail -3 "$tmp/eval.err")"
  $python -c 'import json,sys; print(repr(json.loads(open(sys.argv[1]).read())["loss"]))' \
    "$tmp/eval.json"
}
for run_dir in tp etp; do
  # The same data-parallel size (1), so both see the same validation batches.
  one_rank=$(eval_loss 1 --checkpoint "$tmp/$run_dir" --set parallel.tp=1 --set parallel.etp=0 \
    --set parallel.ep=1)
  two=$(eval_loss 2 --checkpoint "$tmp/$run_dir" --set parallel.tp=2 --set parallel.etp=1 \
    --set parallel.ep=2)
  $python -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-5 * abs(b))' \
    "$two" "$one_rank" || fail "eval of the $run_dir checkpoint: $two under tp 2 vs $one_rank on 1 rank"
  echo "    eval of the $run_dir checkpoint: 1 rank $one_rank, np 2 tp 2 ep 2 $two"
done

# ---- SIGTERM ------------------------------------------------------------------------------
long=(--set train.max_steps=300)
# sigterm_case NP EP: start a 300-step run, SIGTERM it (one rank only under mpirun) once it
# has logged 3 steps, check the stop and the checkpoint, resume to the end, compare.
sigterm_case() {
  local np="$1" ep="$2" tag="np$1-ep$2"
  local out="$tmp/sig-$tag" pid target i k
  set_cfg "$np" "$ep"
  if [[ $np -eq 1 ]]; then
    "$bin" train "${cfg[@]}" "${long[@]}" --out "$out" >"$tmp/sig.out" 2>"$tmp/sig.err" &
  else
    # Each rank through rank_rc.sh, which records its exit status in $tmp/rc-$tag/.
    rm -rf "$tmp/rc-$tag"
    mkdir -p "$tmp/rc-$tag"
    RC_DIR="$tmp/rc-$tag" bash "$mpirun_wrapper" "$np" -x RC_DIR bash "$rank_rc" "$bin" \
      train "${cfg[@]}" "${long[@]}" --out "$out" >"$tmp/sig.out" 2>"$tmp/sig.err" &
  fi
  pid=$!
  running=$pid
  wait_for_lines "$out/metrics.jsonl" 3 "$pid" 1200
  target=$pid
  if [[ $np -gt 1 ]]; then
    # Signal only one rank (the last switchyard under mpirun): the others must stop at the
    # same step.
    target=$(rank_pids "$pid" | tail -1)
    [[ -n $target ]] || fail "$tag: no rank process under mpirun $pid"
  fi
  [[ -n $target ]] && kill -TERM "$target"
  for ((i = 0; i < 1200; ++i)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    fail "$tag: still running 60 s after SIGTERM"
    kill_tree "$pid"
  fi
  wait "$pid"
  rc=$?
  running=""
  # Preempted with the checkpoint safe: exit 75 (docs/failures.md), from every rank.
  [[ $rc -eq 75 ]] || fail "$tag: exit status $rc after SIGTERM, want 75: $(tail -5 "$tmp/sig.err")"
  if [[ $np -gt 1 ]]; then
    local r
    for ((r = 0; r < np; ++r)); do
      [[ "$(cat "$tmp/rc-$tag/$r" 2>/dev/null)" == 75 ]] ||
        fail "$tag: rank $r exited '$(cat "$tmp/rc-$tag/$r" 2>/dev/null)' after SIGTERM, want 75"
    done
  fi
  k=$(tail -1 "$out/metrics.jsonl" | sed -n 's/^{"step":\([0-9]*\),.*/\1/p')
  if [[ -z $k || $k -ge 299 ]]; then
    fail "$tag: the run was not stopped early (last step '$k')"
    return
  fi
  local want_dir
  want_dir=$(printf 'step-%08d' $((k + 1)))
  [[ "$(cat "$out/latest")" == "$want_dir" ]] ||
    fail "$tag: latest is '$(cat "$out/latest")', want $want_dir (last logged step $k)"
  grep -q "\"step\": *$((k + 1))[,}]" "$out/$want_dir/trainer_state.json" ||
    fail "$tag: trainer_state.json: $(cat "$out/$want_dir/trainer_state.json")"
  grep -q "^stopped by signal 15 after step $k; resume with --resume $out" "$tmp/sig.out" ||
    fail "$tag: no 'stopped by signal 15 after step $k' line: $(grep stopped "$tmp/sig.out")"
  echo "--- $tag: SIGTERM after step $k, exit 75 on every rank, saved $want_dir ($SECONDS s)"
  train_ok "$tag: --resume after SIGTERM" "$np" "$ep" "${long[@]}" --out "$out" --resume "$out"
  train_ok "$tag: 300 steps uninterrupted" "$np" "$ep" "${long[@]}" --out "$tmp/long-$tag"
  compare_losses "$tag: SIGTERM + resume vs uninterrupted" exact "$out/metrics.jsonl" \
    "$tmp/long-$tag/metrics.jsonl" 0 299
  same_tensors "$tag: SIGTERM + resume vs uninterrupted, step 300" "$out/step-00000300" \
    "$tmp/long-$tag/step-00000300"
}
sigterm_case 1 1
sigterm_case 2 2

# ---- a rank dies ---------------------------------------------------------------------------
# SIGKILL one rank of a -np 2 run mid-training: the other must not hang; mpirun ends the job
# with a non-zero status and the last good checkpoint stays loadable.
rank_death_case() {
  local out="$tmp/death" pid target i died
  set_cfg 2 2
  bash "$mpirun_wrapper" 2 "$bin" train "${cfg[@]}" "${long[@]}" --set train.checkpoint_every=2 \
    --out "$out" >"$tmp/death.out" 2>"$tmp/death.err" &
  pid=$!
  running=$pid
  for ((i = 0; i < 1200; ++i)); do
    [[ -f $out/latest && $(wc -l <"$out/metrics.jsonl") -ge 5 ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  target=$(rank_pids "$pid" | tail -1)
  [[ -n $target ]] || fail "rank death: no rank process under mpirun $pid"
  kill -KILL "$target"
  for ((i = 0; i < 1200; ++i)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    fail "rank death: the surviving rank still runs 60 s after its peer was killed"
    kill_tree "$pid"
  fi
  wait "$pid"
  died=$?
  running=""
  [[ $died -ne 0 ]] || fail "rank death: mpirun exited 0 after a rank was killed"
  train_ok "rank death: the last checkpoint resumes" 1 1 --out "$tmp/death-resumed" \
    --resume "$out" --steps 1
  echo "--- rank death: mpirun exited $died, $(cat "$out/latest") resumes ($SECONDS s)"
}
rank_death_case

# ---- bad inputs ---------------------------------------------------------------------------
good="$tmp/straight-np1-ep1"  # a finished run: step-00000012, latest, metrics.jsonl
mkdir -p "$tmp/corrupt"
# A one-rank run: its tensors are in model.safetensors and optimizer.safetensors.
cp -r "$good/step-00000012" "$good/latest" "$tmp/corrupt/"
size=$(stat -c %s "$tmp/corrupt/step-00000012/model.safetensors")
truncate -s $((size / 2)) "$tmp/corrupt/step-00000012/model.safetensors"
# A two-rank run: each rank wrote its own files; the second rank's is cut short.
cp -r "$tmp/ckpt6-np2-ep2" "$tmp/corrupt2"
[[ -f "$tmp/corrupt2/model-00001-of-00002.safetensors" ]] ||
  fail "np 2 ep 2 checkpoint: no model-00001-of-00002.safetensors: $(ls "$tmp/corrupt2")"
size=$(stat -c %s "$tmp/corrupt2/model-00001-of-00002.safetensors")
truncate -s $((size - 16)) "$tmp/corrupt2/model-00001-of-00002.safetensors"
before_good=$(checksum "$good")
before_corrupt=$(checksum "$tmp/corrupt")
printf 'model:\n  d_model: 32\nmoe:\n  topk: 2\n' >"$tmp/bad-key.yaml"
base=(--config "$config" --set "data.dir=$tmp/data" --out "$good")
one=("${base[@]}" --set train.grad_accum=4)
two=("${base[@]}" --set train.grad_accum=2)

expect_error "unknown key in the config file" "$tmp/bad-key.yaml: unknown key 'moe.topk'" 1 \
  --config "$tmp/bad-key.yaml" --out "$good"
expect_error "unknown key in --set" "unknown key 'moe.topk'" 1 "${one[@]}" --set moe.topk=2
expect_error "unknown section" "unknown section 'optim'" 1 "${one[@]}" --set optim.lr=1
expect_error "wrong type" "moe.top_k: expected an integer, got 'two'" 1 "${one[@]}" \
  --set moe.top_k=two
expect_error "ep does not divide the experts" \
  "moe.num_experts=8 is not divisible by parallel.ep=3" 1 "${one[@]}" --set parallel.ep=3
expect_error "a layout needing more ranks" "needs 4 ranks (or a multiple), but 2 were launched; launch with mpirun -np 4 switchyard" 2 \
  "${two[@]}" --set parallel.ep=4
expect_error "unknown precision" "runtime.precision='fp16' is not one of auto, fp32, bf16" 1 "${one[@]}" \
  --set runtime.precision=fp16
if ! command -v nvidia-smi >/dev/null 2>&1; then
  # (into a new --out: $good holds a run, refused before the device is looked at)
  expect_error "cuda without a GPU" "runtime.device=cuda: " 1 --config "$config" \
    --set "data.dir=$tmp/data" --set train.grad_accum=4 --out "$tmp/cuda-run" --set runtime.device=cuda
fi
expect_error "seq_len not divisible by 2 cp" \
  "model.seq_len=18 is not divisible by 2 * parallel.cp = 4" 2 "${two[@]}" \
  --set parallel.cp=2 --set model.seq_len=18
expect_error "tp on one process" "needs 2 ranks (or a multiple), but this is one process; launch with mpirun -np 2 switchyard" 1 "${one[@]}" \
  --set parallel.tp=2
expect_error "tp not dividing n_heads" "parallel.tp=4 does not divide model.n_heads=2" 4 \
  "${base[@]}" --set train.grad_accum=4 --set parallel.tp=4
expect_error "etp not dividing d_expert" "parallel.etp=3 does not divide moe.d_expert=32" 1 \
  "${one[@]}" --set parallel.etp=3
expect_error "seq_len not divisible by tp" "model.seq_len=15 is not divisible by parallel.tp=2" 2 \
  "${two[@]}" --set parallel.tp=2 --set model.seq_len=15
expect_error "tp 4 on 2 ranks" "parallel.tp=4 cp=1 pp=1 ep=1 etp=4 needs 4 ranks (or a multiple), but 2 were launched; launch with mpirun -np 4 switchyard ..." 2 \
  "${two[@]}" --set parallel.tp=4 --set model.n_heads=4
# A missing data dir is a missing file (exit 1), found before the output directory is made.
expect_error "missing data dir" "$tmp/no-data/index.json: cannot open" 1 --config "$config" \
  --set "data.dir=$tmp/no-data" --set train.grad_accum=4 --out "$tmp/no-data-run"
[[ $rc -eq 1 ]] || fail "missing data dir: exit status $rc, want 1"
[[ ! -e $tmp/no-data-run ]] || fail "missing data dir: $tmp/no-data-run was created"
# A previous run in --out without --resume: refused before anything is written (exit 2),
# even for another model (whose checkpoints would have replaced these); $good is compared
# byte for byte below.
for extra in "" "--set model.d_model=48"; do
  # shellcheck disable=SC2086
  expect_error "a previous run in --out ${extra:-(same model)}" \
    "$good: holds a previous run (latest, metrics.jsonl, routing.jsonl, " 1 "${one[@]}" $extra
  [[ $rc -eq 2 ]] || fail "a previous run in --out: exit status $rc, want 2"
  grep -qF "; continue it with --resume $good, train into another --out, or remove it first" \
    "$tmp/err" || fail "a previous run in --out: the ways on are missing: $(cat "$tmp/err")"
done
expect_error "a previous run in --out, np 2" "$good: holds a previous run" 2 "${two[@]}" \
  --set parallel.ep=2
expect_error "an empty --resume" "--resume is empty; it needs a path" 1 "${one[@]}" --resume ""
[[ $rc -eq 2 ]] || fail "an empty --resume: exit status $rc, want 2"
expect_error "an empty --out" "--out is empty; it needs a path" 1 --config "$config" --out ""
expect_error "--steps twice" "--steps is given twice; give it once" 1 "${one[@]}" --steps 2 \
  --steps 1
expect_error "--config twice" "--config is given twice" 1 "${one[@]}" --config "$config"
# Resuming a checkpoint already at train.max_steps: one line, exit 0 (as Megatron and
# torchtitan), no output directory made.
run 1 --config "$config" --set "data.dir=$tmp/data" --set train.grad_accum=4 --set train.max_steps=12 \
  --resume "$good" --out "$tmp/nothing"
[[ $rc -eq 0 ]] || fail "nothing to train: exit status $rc: $(cat "$tmp/err")"
grep -qx "nothing to train: $good is at step 12 and train.max_steps is 12; set it above 12 (--set train.max_steps=N) to train on" \
  "$tmp/out" || fail "nothing to train: no line: $(tail -2 "$tmp/out")"
[[ ! -e $tmp/nothing ]] || fail "nothing to train: $tmp/nothing was created"
expect_error "--profile-skip past the run" "--profile-skip=5 leaves nothing to profile: this run trains 2 step(s)" 1 \
  --config "$config" --set "data.dir=$tmp/data" --out "$tmp/prof" --profile --profile-skip 5 --steps 2
[[ $rc -eq 2 && ! -e $tmp/prof ]] || fail "--profile-skip past the run: exit status $rc, want 2, no $tmp/prof"
expect_error "--dry-run --world 0" "--world=0 must be between 1 and 131072" 1 "${one[@]}" \
  --dry-run --world 0
expect_error "--dry-run --world 2^31-1" "--world=2147483647 must be between 1 and 131072" 1 \
  "${one[@]}" --dry-run --world 2147483647
expect_error "--dry-run --resume" "--resume needs training, not --dry-run" 1 \
  --config "$config" --set "data.dir=$tmp/data" --dry-run --resume "$good"
# --resume continues the run it names: another run's directory as --out is refused before
# anything is read or written; without --out the damaged checkpoints' own directories are
# the output (and their loads fail).
expect_error "--resume into another run's --out" \
  "$good: holds another run (latest, metrics.jsonl, routing.jsonl, 1 step-* checkpoint) than the one --resume $tmp/corrupt/step-00000012 continues ($tmp/corrupt); leave out --out to go on there, train into another --out, or remove it first" \
  1 "${one[@]}" --resume "$tmp/corrupt/step-00000012"
[[ $rc -eq 2 ]] || fail "--resume into another run's --out: exit status $rc, want 2"
unout=(--config "$config" --set "data.dir=$tmp/data")
expect_error "truncated checkpoint" "$tmp/corrupt/step-00000012/model.safetensors" 1 \
  "${unout[@]}" --set train.grad_accum=4 --resume "$tmp/corrupt/step-00000012"
expect_error "truncated checkpoint, np 2" "$tmp/corrupt/step-00000012/model.safetensors" 2 \
  "${unout[@]}" --set train.grad_accum=2 --resume "$tmp/corrupt"
expect_error "a rank's file truncated, np 2" "$tmp/corrupt2/model-00001-of-00002.safetensors" 2 \
  "${unout[@]}" --set train.grad_accum=2 --resume "$tmp/corrupt2"
expect_error "a rank's file truncated, 1 rank" "$tmp/corrupt2/model-00001-of-00002.safetensors" 1 \
  "${unout[@]}" --set train.grad_accum=4 --resume "$tmp/corrupt2"
expect_error "another model's checkpoint" \
  "tensor 'embed.wte': the model has f32 (256, 48), the checkpoint f32 (256, 32)" 1 "${one[@]}" \
  --set model.d_model=48 --resume "$good"
expect_error "another model's checkpoint, np 2 ep 2" "the checkpoint f32 (256, 32)" 2 "${two[@]}" \
  --set parallel.ep=2 --set model.d_model=48 --resume "$good"
expect_error "missing checkpoint" "$tmp/nope: no such checkpoint" 1 "${one[@]}" \
  --resume "$tmp/nope"
expect_error "bad --steps" "--steps=-1 must be >= 1" 1 "${one[@]}" --steps -1
[[ $(checksum "$good") == "$before_good" ]] || fail "a failed run changed $good"
[[ $(checksum "$tmp/corrupt") == "$before_corrupt" ]] || fail "a failed run changed $tmp/corrupt"

# ---- optional: the fortune corpus (5 languages, 80 documents each, vocabulary 300) -----
fortunes=/usr/share/games/fortunes
if [[ -d $fortunes ]]; then
  if "$bin" prep --out "$tmp/fortunes" --vocab 300 --max-docs-per-label 80 \
    >"$tmp/prep.log" 2>&1; then
    train_ok "fortunes: 60 steps" 1 1 --set "data.dir=$tmp/fortunes" --set model.vocab_size=320 \
      --set train.max_steps=60 --out "$tmp/fortune-run"
    $python - "$tmp/fortune-run/metrics.jsonl" <<'EOF' || fail "fortunes: the loss did not fall"
import json, math, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1]) if '"loss"' in l]
tail = sum(losses[-5:]) / 5
print(f"    fortunes: loss {losses[0]:.3f} -> {tail:.3f} (mean of the last 5 of {len(losses)})")
# Real text is harder than the templates: about 5.8 -> 5.1 (the unigram level) here.
sys.exit(0 if len(losses) == 60 and tail < min(losses[0] - 0.5, math.log(320)) else 1)
EOF
  else
    fail "prep of $fortunes: $(tail -1 "$tmp/prep.log")"
  fi
else
  echo "--- skipped the fortune check: $fortunes is not installed (bash scripts/setup.sh)"
fi

echo "($SECONDS s)"
if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all switchyard train checks passed"
