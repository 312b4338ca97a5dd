#!/usr/bin/env bash
# Failure behaviour of `switchyard train` (docs/failures.md), on a tiny model and corpus:
#  - non-finite numbers: a learning rate that diverges stops with exit 3, one error line
#    naming the step and the first parameter whose gradient is not finite, nothing new
#    saved (latest stays the last good step); a NaN written into one expert's gradient
#    (the SWITCHYARD_TEST_NAN_GRAD hook) under stop on 1 rank and on 2 ranks (ep 2: the
#    expert lives on rank 1; every rank exits 3), and under skip: the step is skipped
#    (weights and optimizer state bit-identical before and after it), counted in
#    metrics.jsonl, and training finishes (1 rank and 2 ranks); too many skips in a row
#    stop with exit 3;
#  - metrics: a full disk (metrics.jsonl is /dev/full): one warning, training finishes
#    and saves (whole records under a file-size limit: metrics_writer_test); a file-size
#    limit (ulimit -f): a failed save, exit 1, the real cause, nothing damaged; resuming from
#    an earlier checkpoint leaves one record per step, with the losses of a straight run;
#  - a token id outside the vocabulary with data.verify false (in the training split, on 1
#    and 2 ranks, and in the validation split): one error line naming the shard, the token
#    and the id, exit 1 on every rank;
#  - memory: a layout the host cannot hold stops before allocating it (runtime.memory_check,
#    exit 2 on 1 and 2 ranks, no output directory); memory running out later (a test cap on
#    the host allocator, hit while resuming) ends with exit 5 and one line, the checkpoints
#    untouched;
#  - one writer per output directory: a second training into a live run's directory is
#    refused (exit 2, naming the holder), and a killed holder leaves no stale lock; a
#    directory holding a previous run is refused without --resume (exit 2);
#  - the temporary directories of a killed save are removed at the next start, one line
#    each; a second SIGINT/SIGTERM while the first is pending ends the run at once (exit
#    130/143, one line, the last checkpoint intact);
# Jobs of several ranks (different command lines or configs, SIGTERM under mpirun, the
# collective watchdog): failures_ranks_cli_test.sh. What both share: failures_lib.sh.
# Usage: failures_cli_test.sh path/to/switchyard path/to/scripts/mpirun_test.sh
set -u
bin="$1"
mpirun_wrapper="$2"
source "$(dirname "$0")/failures_lib.sh"

# ---- non-finite numbers -------------------------------------------------------------------
# A learning rate that diverges: stop at the first non-finite step, nothing new saved.
out="$tmp/diverge"
run 1 "${one[@]}" --out "$out" --set train.lr=1e4 --set train.max_steps=30
[[ $rc -eq 3 ]] || fail "diverging lr: exit status $rc, want 3: $(tail -3 "$tmp/err")"
k=$(sed -n 's/^switchyard train: error: step \([0-9]*\): loss .*, gradient norm .* (first non-finite gradient: .*); train.on_nonfinite=stop: nothing saved, the latest checkpoint stays .*/\1/p' "$tmp/err")
if [[ -z $k ]]; then
  fail "diverging lr: no stop line: $(cat "$tmp/err")"
else
  one_error "diverging lr" "the latest checkpoint stays $out/$(printf 'step-%08d' "$k")"
  [[ "$(cat "$out/latest")" == "$(printf 'step-%08d' "$k")" ]] ||
    fail "diverging lr: latest is $(cat "$out/latest"), want the step before $k"
  [[ ! -e $out/$(printf 'step-%08d' $((k + 1))) ]] || fail "diverging lr: step $k was saved"
  record "$out" "$k" | grep -q '"nonfinite":true,"skipped":false' ||
    fail "diverging lr: metrics of step $k: $(record "$out" "$k" | cut -c1-300)"
  "$bin" checkpoint verify "$out" >/dev/null 2>&1 || fail "diverging lr: the latest checkpoint does not verify"
  echo "--- diverging lr: stopped at step $k, exit 3 ($SECONDS s)"
fi

# A NaN in expert 3's gradient of layer 1 at step 3, under stop: 1 rank and 2 (ep 2).
for np in 1 2; do
  out="$tmp/nan-stop-$np"
  if [[ $np -eq 1 ]]; then args=("${one[@]}"); else args=("${two[@]}"); fi
  SWITCHYARD_TEST_NAN_GRAD=3:layers.1.moe.experts.w1:3 run "$np" "${args[@]}" --out "$out"
  [[ $rc -eq 3 ]] || fail "NaN stop np $np: exit status $rc, want 3: $(tail -3 "$tmp/err")"
  every_rank "NaN stop np $np" "$np" 3
  one_error "NaN stop np $np" "step 3: loss "
  one_error "NaN stop np $np" "(first non-finite gradient: layers.1.moe.experts.w1 (expert 3)); train.on_nonfinite=stop: nothing saved, the latest checkpoint stays $out/step-00000003"
  [[ "$(cat "$out/latest")" == step-00000003 && ! -e $out/step-00000004 ]] ||
    fail "NaN stop np $np: latest $(cat "$out/latest")"
  echo "--- NaN stop np $np: exit 3 on every rank, latest step-00000003 ($SECONDS s)"
done

# The same NaN under skip: the update of step 3 is skipped, the run finishes.
for np in 1 2; do
  out="$tmp/nan-skip-$np"
  if [[ $np -eq 1 ]]; then args=("${one[@]}"); else args=("${two[@]}"); fi
  SWITCHYARD_TEST_NAN_GRAD=3:layers.1.moe.experts.w1:3 run "$np" "${args[@]}" --out "$out" \
    --set train.on_nonfinite=skip
  [[ $rc -eq 0 ]] || fail "NaN skip np $np: exit status $rc: $(tail -3 "$tmp/err")"
  every_rank "NaN skip np $np" "$np" 0
  grep -q "^step 3: loss .*, gradient norm nan (first non-finite gradient: layers.1.moe.experts.w1 (expert 3)); train.on_nonfinite=skip: update skipped (1 in a row, at most 10)$" "$tmp/out" ||
    fail "NaN skip np $np: no skip line: $(grep -i skip "$tmp/out")"
  record "$out" 3 | grep -q '"grad_norm":null,"nonfinite":true,"skipped":true,"nonfinite_param":"layers.1.moe.experts.w1 (expert 3)","nonfinite_skips":1' ||
    fail "NaN skip np $np: metrics of step 3: $(record "$out" 3 | cut -c1-300)"
  [[ $(record "$out" 3 | wc -l) -eq 1 ]] ||
    fail "NaN skip np $np: metrics.jsonl holds $(record "$out" 3 | wc -l) records of step 3, want 1"
  for s in 4 5; do
    record "$out" "$s" | grep -q '"nonfinite_skips":1' || fail "NaN skip np $np: step $s does not count the skip"
  done
  # Nothing changed over the skipped step: the checkpoints before and after it hold the
  # same weights and optimizer state (step-00000003 is saved after step 2).
  for f in "$out"/step-00000003/*.safetensors; do
    cmp -s "$f" "$out/step-00000004/$(basename "$f")" ||
      fail "NaN skip np $np: $(basename "$f") changed over the skipped step"
  done
  [[ "$(cat "$out/latest")" == step-00000006 ]] || fail "NaN skip np $np: latest $(cat "$out/latest")"
  echo "--- NaN skip np $np: step 3 skipped, weights unchanged over it, finished ($SECONDS s)"
done
# The counts are saved with the checkpoint (trainer_state.json "nonfinite"): a run resumed
# after the skip goes on counting it, as the run that was not interrupted did.
out="$tmp/nan-skip-1"
$python - "$out/step-00000004/trainer_state.json" <<'EOF2' || fail "NaN skip: trainer_state.json"
import json, sys
state = json.load(open(sys.argv[1]))
assert state["nonfinite"] == {"in_row": 1, "skips": 1}, state.get("nonfinite")  # saved after step 3
EOF2
run 1 "${one[@]}" --out "$tmp/nan-skip-resumed" --resume "$out/step-00000004" \
  --set train.on_nonfinite=skip
[[ $rc -eq 0 ]] || fail "NaN skip resumed: exit status $rc: $(tail -3 "$tmp/err")"
for s in 4 5; do
  record "$tmp/nan-skip-resumed" "$s" | grep -q '"nonfinite_skips":1' ||
    fail "NaN skip resumed: step $s does not count the skip before the resume"
done
echo "--- NaN skip: the count of skips resumes with the checkpoint ($SECONDS s)"

# Too many skips in a row: a diverged model. A skipped step keeps the weights, so the next
# batch's gradient may be finite again (it is on some CPUs and not on others) and the count
# starts over; what must hold is that the run stops at the third non-finite step in a row,
# after skipping the two before it.
out="$tmp/skips"
run 1 "${one[@]}" --out "$out" --set train.lr=1e4 --set train.max_steps=30 \
  --set train.on_nonfinite=skip --set train.max_nonfinite_skips=2
[[ $rc -eq 3 ]] || fail "skips in a row: exit status $rc, want 3: $(tail -3 "$tmp/err")"
one_error "skips in a row" "3 non-finite steps in a row (train.max_nonfinite_skips=2): nothing saved"
last=$(sed -n 's/^switchyard train: error: step \([0-9]*\): .*non-finite steps in a row.*/\1/p' "$tmp/err")
skips=$(sed -n 's/^step \([0-9]*\): .*update skipped (\([0-9]*\) in a row, at most 2)$/\1:\2/p' "$tmp/out" |
  tail -2 | tr '\n' ' ')
[[ -n $last && $skips == "$((last - 2)):1 $((last - 1)):2 " ]] ||
  fail "skips in a row: stopped at step '$last' after skips (step:in a row) '$skips'"
echo "--- skips in a row: exit 3 at step $last after skipping steps $((last - 2)) and $((last - 1)) ($SECONDS s)"

# ---- a bad token id with data.verify false ------------------------------------------------
# Token 5 of a shard := 65535 (the vocabulary has 128 ids). Without verify the shards are
# not read at the start; the step that reads it (one epoch's windows are all read within
# 100 steps) ends the run on every rank with one line naming the shard, the token and the
# id, exit 1. In the validation split it is found when the validation batches are read at
# the start, also exit 1.
# bad_token SPLIT DIR: a copy of $tmp/data in DIR with token 5 of SPLIT's first shard bad.
bad_token() {
  rm -rf "$2"
  cp -r "$tmp/data" "$2"
  $python - "$2" "$1" <<'EOF2'
import json, sys
d, split = sys.argv[1], sys.argv[2]
index = json.load(open(d + "/index.json"))
assert index["dtype"] == "u16", index["dtype"]
name = [s["name"] for s in index["shards"] if s["split"] == split][0]
b = bytearray(open(d + "/" + name, "rb").read())
b[32 + 5 * 2:32 + 6 * 2] = b"\xff\xff"  # after the 32-byte shard header
open(d + "/" + name, "wb").write(b)
print(name)
EOF2
}
for np in 1 2; do
  if [[ $np -eq 1 ]]; then args=("${one[@]}"); else args=("${two[@]}"); fi
  shard=$(bad_token train "$tmp/bad_train")
  run "$np" "${args[@]}" --out "$tmp/bad-token-$np" --set data.dir="$tmp/bad_train" \
    --set data.verify=false --set train.max_steps=100 --set train.checkpoint_every=0
  [[ $rc -eq 1 ]] || fail "bad token np $np: exit status $rc, want 1: $(tail -3 "$tmp/err")"
  every_rank "bad token np $np" "$np" 1
  one_error "bad token np $np" "$tmp/bad_train/$shard: token 5 is 65535, not below the vocabulary size 128 (data.verify is false"
  ! grep -q "Check failed\|CHECK" "$tmp/err" || fail "bad token np $np: a CHECK: $(cat "$tmp/err")"
  echo "--- bad token np $np: $(grep '^switchyard train: error' "$tmp/err" | cut -c1-120)... ($SECONDS s)"
done
shard=$(bad_token val "$tmp/bad_val")
run 1 "${one[@]}" --out "$tmp/bad-val" --set data.dir="$tmp/bad_val" --set data.verify=false \
  --set train.eval_every=3
[[ $rc -eq 1 ]] || fail "bad validation token: exit status $rc, want 1: $(tail -3 "$tmp/err")"
one_error "bad validation token" "$tmp/bad_val/$shard: token 5 is 65535, not below the vocabulary size 128"
echo "--- bad validation token: exit 1 ($SECONDS s)"

# ---- metrics ------------------------------------------------------------------------------
# A full disk: metrics.jsonl is /dev/full (every write fails with ENOSPC). One warning,
# training goes on to the end and saves; the count of lost records at the end.
out="$tmp/full"
mkdir -p "$out"
ln -s /dev/full "$out/metrics.jsonl"
run 1 "${one[@]}" --out "$out"
[[ $rc -eq 0 ]] || fail "disk full: exit status $rc: $(tail -3 "$tmp/err")"
[[ $(grep -c "^warning: $out/metrics.jsonl: a metrics record could not be written (No space left on device); training goes on" "$tmp/err") -eq 1 ]] ||
  fail "disk full: want one warning line: $(cat "$tmp/err")"
grep -q "^warning: [0-9]* metrics records could not be written to $out/metrics.jsonl$" "$tmp/err" ||
  fail "disk full: no count at the end: $(cat "$tmp/err")"
[[ "$(cat "$out/latest")" == step-00000006 ]] || fail "disk full: the run did not finish and save"
grep -q "^step 5 | loss" "$tmp/out" || fail "disk full: no step 5"
echo "--- disk full for metrics: one warning, the run finished ($SECONDS s)"

# A file-size limit (ulimit -f, in a subshell): writes fail with EFBIG (SIGXFSZ is ignored)
# instead of the signal killing the process. A save past the limit fails as a save does:
# exit 1, one line with the real cause, its temporary directory removed, the checkpoint
# before it and `latest` unchanged. The metrics warning names the real cause too.
out="$tmp/fsize"
run 1 "${one[@]}" --out "$out" --set train.max_steps=2
[[ $rc -eq 0 ]] || fail "file-size limit: the first run exited $rc: $(tail -3 "$tmp/err")"
before=$(cd "$out" && find step-00000002 latest -type f -exec sha256sum {} + | sort)
biggest=$(find "$out/step-00000002" -type f -printf '%s\n' | sort -n | tail -1)
limit=$((biggest / 1024 / 2))  # ulimit -f counts 1024-byte blocks: half the largest file
(ulimit -f "$limit"; run 1 "${one[@]}" --out "$out" --resume "$out" --set train.max_steps=4; exit $rc)
rc=$?
[[ $rc -eq 1 ]] || fail "file-size limit: exit status $rc, want 1 (153: killed by SIGXFSZ): $(cat "$tmp/err")"
one_error "file-size limit" "(File too large)"
[[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "file-size limit: more than one stderr line: $(cat "$tmp/err")"
[[ -z $(find "$out" -name '.step-*') ]] || fail "file-size limit: a temporary was left: $(ls -a "$out")"
[[ "$before" == "$(cd "$out" && find step-00000002 latest -type f -exec sha256sum {} + | sort)" ]] ||
  fail "file-size limit: step-00000002 or latest changed"
(ulimit -f 1; run 1 "${one[@]}" --out "$tmp/fsize-metrics" --set train.checkpoint_every=0; exit $rc)
rc=$?
[[ $rc -eq 1 ]] || fail "file-size limit, metrics: exit status $rc, want 1: $(cat "$tmp/err")"
grep -q "^warning: $tmp/fsize-metrics/metrics.jsonl: a metrics record could not be written (File too large); training goes on" "$tmp/err" ||
  fail "file-size limit, metrics: want the real cause in the warning: $(cat "$tmp/err")"
echo "--- file-size limit: a failed save (exit 1), the checkpoint before it intact ($SECONDS s)"

# ---- a second signal ------------------------------------------------------------------------
# The first SIGINT/SIGTERM lets the step in progress end and saves it; a second while it is
# pending ends the process at once: one line naming the checkpoint left intact, exit 128 +
# the signal (130, 143), nothing saved. A step of 10^6 micro-batches takes minutes.
for sig in INT TERM; do
  out="$tmp/second-$sig"
  run 1 "${one[@]}" --out "$out" --set train.max_steps=1
  before=$(hashes "$out")
  "$bin" train "${one[@]}" --out "$out" --resume "$out" --set train.max_steps=3 \
    --set train.grad_accum=1000000 >"$tmp/second.out" 2>"$tmp/second.err" &
  pid=$!
  running=$pid
  for _ in $(seq 1 300); do grep -q "^resumed from" "$tmp/second.out" && break; sleep 0.1; done
  sleep 0.5
  kill -s "$sig" "$pid"
  sleep 0.3
  kill -s "$sig" "$pid"
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { fail "second SIG$sig: still running after 10 s"; kill -9 "$pid"; }
  wait "$pid"
  rc=$?
  running=""
  want=$([[ $sig == INT ]] && echo 130 || echo 143)
  [[ $rc -eq $want ]] || fail "second SIG$sig: exit status $rc, want $want: $(cat "$tmp/second.err")"
  [[ "$(cat "$tmp/second.err")" == "switchyard train: second signal: exiting without saving; the last checkpoint $out/step-00000001 is intact" ]] ||
    fail "second SIG$sig: stderr: $(cat "$tmp/second.err")"
  # metrics.jsonl was rewritten at the resume (the records before step 1 kept): the same.
  [[ "$before" == "$(hashes "$out")" ]] || fail "second SIG$sig: the output directory changed"
  echo "--- a second SIG$sig: exit $rc at once, step-00000001 intact ($SECONDS s)"
done

# A signal while the run starts (loading the checkpoint, verifying the data) is kept: the
# run stops after its first step, saved, exit 75 (before, the process died unsaved, 143).
# SWITCHYARD_TEST_SIGNAL_AT_START raises SIGTERM as soon as the handlers are in place.
out="$tmp/signal-at-start"
run 1 "${one[@]}" --out "$out" --set train.max_steps=1
SWITCHYARD_TEST_SIGNAL_AT_START=1 run 1 "${one[@]}" --out "$out" --resume "$out" \
  --set train.max_steps=3
[[ $rc -eq 75 ]] || fail "signal at start: exit status $rc, want 75: $(tail -3 "$tmp/err")"
grep -q "^stopped by signal 15 after step 1; resume with --resume $out$" "$tmp/out" ||
  fail "signal at start: no 'stopped by signal' line: $(tail -3 "$tmp/out")"
[[ "$(cat "$out/latest")" == step-00000002 ]] || fail "signal at start: latest $(cat "$out/latest")"
echo "--- a signal while the run starts: one step, saved, exit 75 ($SECONDS s)"

# Resume from an earlier checkpoint of a finished run: the records after it are dropped.
out="$tmp/resume"
run 1 "${one[@]}" --out "$out" --set train.checkpoint_every=3
[[ $rc -eq 0 ]] || fail "resume: first run exit status $rc"
cp "$out/metrics.jsonl" "$tmp/straight.jsonl"
run 1 "${one[@]}" --out "$out" --set train.checkpoint_every=3 --resume "$out/step-00000003"
[[ $rc -eq 0 ]] || fail "resume: exit status $rc: $(tail -3 "$tmp/err")"
grep -q "^metrics.jsonl: dropped [0-9]* records logged after step 2 (resuming at step 3)$" "$tmp/out" ||
  fail "resume: no 'dropped' line: $(grep metrics "$tmp/out")"
$python - "$out/metrics.jsonl" "$tmp/straight.jsonl" <<'EOF' || fail "resume: not one record per step"
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        j = json.loads(line)
        if "loss" in j:
            assert j["step"] not in out, f"{path}: step {j['step']} twice"
            out[j["step"]] = j["loss"]
    return out
got, want = losses(sys.argv[1]), losses(sys.argv[2])
assert sorted(got) == list(range(6)), sorted(got)
assert got == want, (got, want)  # a bit-identical resume
EOF
echo "--- resume: one record per step, the same losses ($SECONDS s)"

# ---- memory ----------------------------------------------------------------------------------
# A layout the host cannot hold (runtime.memory_check): exit 2 on every rank before anything
# the model's size is allocated, one line naming the need and the host's available memory,
# no output directory. 1 rank, and 2 (the two ranks on this node are summed). seq_len 4e7:
# about 775 GiB a rank, under the 2^53 attention scores a config may ask for.
for np in 1 2; do
  out="$tmp/too-big-$np"
  if [[ $np -eq 1 ]]; then args=("${one[@]}"); else args=("${two[@]}"); fi
  run "$np" "${args[@]}" --out "$out" --set model.seq_len=40000000
  [[ $rc -eq 2 ]] || fail "memory check np $np: exit status $rc, want 2: $(tail -3 "$tmp/err")"
  every_rank "memory check np $np" "$np" 2
  if [[ $np -eq 1 ]]; then who="this rank needs"; else who="the 2 ranks on this node need"; fi
  one_error "memory check np $np" "runtime.memory_check: $who "
  one_error "memory check np $np" "the host has available (MemAvailable)"
  [[ ! -e $out ]] || fail "memory check np $np: $out was created"
  echo "--- memory check np $np: exit 2 on every rank ($SECONDS s)"
done
# Memory running out after the check passed: a resume under a cap on the host allocator
# (SWITCHYARD_TEST_HOST_MEMORY_LIMIT) of the model states plus half the step's workspace, less
# than the run needs (it stops while loading the checkpoint, whose reads take more than that
# at this size): exit 5, one line naming the rank and the sizes, the checkpoints untouched.
out="$tmp/oom"
run 1 "${one[@]}" --out "$out" --set train.max_steps=2
[[ $rc -eq 0 ]] || fail "oom: the first run exited $rc: $(tail -3 "$tmp/err")"
read -r states peak < <(awk '/model states +workspace pk/ {getline; print $5, $6; exit}' "$tmp/out")
before=$(hashes "$out")
SWITCHYARD_TEST_HOST_MEMORY_LIMIT=$((states + peak / 2)) run 1 "${one[@]}" --out "$out" \
  --resume "$out" --set train.max_steps=4
[[ $rc -eq 5 ]] || fail "oom: exit status $rc, want 5: $(tail -3 "$tmp/err")"
[[ $(grep -c "^switchyard: error: rank 0 ran out of memory on cpu: " "$tmp/err") -eq 1 ]] ||
  fail "oom: want one out-of-memory line: $(cat "$tmp/err")"
[[ "$before" == "$(hashes "$out")" ]] ||
  fail "oom: the output directory changed"
"$bin" checkpoint verify "$out" >/dev/null 2>&1 || fail "oom: the latest checkpoint does not verify"
echo "--- out of memory at a limit of $((states + peak / 2)) bytes: exit 5, checkpoints intact ($SECONDS s)"

# ---- one writer per output directory ------------------------------------------------------
# A second training into the directory a live run writes is refused (exit 2, one line naming
# the holder's pid), and the live run's files are left alone; once the holder is killed
# (SIGKILL: no clean-up), the lock is gone with it and a new run proceeds.
out="$tmp/busy"
"$bin" train "${one[@]}" --out "$out" --set train.max_steps=1000000 --set train.checkpoint_every=0 \
  >"$tmp/busy.out" 2>&1 &
holder=$!
for _ in $(seq 1 300); do [[ -s $out/metrics.jsonl ]] && break; sleep 0.1; done
run 1 "${one[@]}" --out "$out" --set train.max_steps=2
[[ $rc -eq 2 ]] || fail "busy output: exit status $rc, want 2: $(tail -3 "$tmp/err")"
one_error "busy output" "$out: another process is writing this output directory (pid $holder)"
[[ -z $(find "$out" -name 'step-*') ]] || fail "busy output: the refused run saved a checkpoint"
kill -0 "$holder" 2>/dev/null || fail "busy output: the first run ended: $(tail -3 "$tmp/busy.out")"
kill -9 "$holder"
wait "$holder" 2>/dev/null
# The lock went with the holder: the directory now holds the logs of a run that saved no
# checkpoint, refused as such (not as busy, and not pointing at a --resume that would find
# nothing); cleared, a new run proceeds.
run 1 "${one[@]}" --out "$out" --set train.max_steps=1
[[ $rc -eq 2 ]] || fail "busy output: after the holder died, exit status $rc, want 2: $(tail -3 "$tmp/err")"
one_error "busy output" "$out: holds the logs of a run that saved no checkpoint (metrics.jsonl, routing.jsonl), so there is nothing to resume; remove them or train into another --out"
rm -rf "$out"
run 1 "${one[@]}" --out "$out" --set train.max_steps=1
[[ $rc -eq 0 ]] || fail "busy output: after the holder died, exit status $rc: $(tail -3 "$tmp/err")"
echo "--- busy output directory: refused with exit 2 while held, free once its holder was killed ($SECONDS s)"

# ---- a killed save's temporary directories ------------------------------------------------
out="$tmp/leftover"
mkdir -p "$out/.step-00000004.tmp-4242" "$out/.step-00000002.old-77"
echo junk >"$out/.step-00000004.tmp-4242/model.safetensors"
run 1 "${one[@]}" --out "$out" --set train.max_steps=1
[[ $rc -eq 0 ]] || fail "leftovers: exit status $rc: $(tail -3 "$tmp/err")"
for d in .step-00000002.old-77 .step-00000004.tmp-4242; do
  grep -qx "removed $out/$d: the temporary directory of a save that did not finish" "$tmp/out" ||
    fail "leftovers: no line for $d: $(grep removed "$tmp/out")"
  [[ ! -e $out/$d ]] || fail "leftovers: $d is still there"
done
echo "--- leftovers of a killed save removed ($SECONDS s)"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "failures: all cases passed ($SECONDS s)"
