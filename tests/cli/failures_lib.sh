# What the two failure tests share (failures_cli_test.sh: one process and its files;
# failures_ranks_cli_test.sh: jobs of several ranks). Source it after setting bin (the
# switchyard binary) and mpirun_wrapper (scripts/mpirun_test.sh); it makes tmp (removed on
# exit, run_guard_lib.sh), a tiny corpus prepared into $tmp/data and a tiny config
# $tmp/tiny.yaml (one=(...) its flags on one rank, two=(...) on two under ep 2), and
# defines run, every_rank, one_error, hashes and record (below).
python=/usr/bin/python3
[[ -x $python ]] || python=python3
failures=0
tmp="$(mktemp -d)"
running=""
source "$(dirname "$0")/run_guard_lib.sh"
# Each rank of a multi-rank job through rank_rc.sh, which records its exit status in $RC_DIR.
rank_rc="$(cd "$(dirname "$0")" && pwd)/rank_rc.sh"
SECONDS=0

mkdir -p "$tmp/corpus"
for i in $(seq 1 80); do
  printf 'the cat sat on the mat %d times\nand then it ran away\n%%\n' $((i % 7)) >>"$tmp/corpus/en.txt"
  printf 'le chat dort sur le tapis %d fois\net puis il court encore\n%%\n' $((i % 5)) >>"$tmp/corpus/fr.txt"
done
"$bin" prep --out "$tmp/data" --vocab 128 "$tmp"/corpus/*.txt >"$tmp/prep.log" 2>&1 ||
  { cat "$tmp/prep.log"; echo "FAIL: prep"; exit 1; }
# Two MoE layers of 4 experts; global batch 4 sequences (grad_accum 2 on one rank, 1 on two).
cat >"$tmp/tiny.yaml" <<EOF
model: {vocab_size: 128, seq_len: 8, d_model: 16, n_layers: 2, n_heads: 2, d_ff: 32}
moe: {num_experts: 4, top_k: 1, d_expert: 16}
train: {max_steps: 6, micro_batch_size: 2, grad_accum: 2, eval_every: 0, eval_batches: 2,
        checkpoint_every: 1}
data: {dir: $tmp/data}
EOF
one=(--config "$tmp/tiny.yaml")
two=(--config "$tmp/tiny.yaml" --set train.grad_accum=1 --set parallel.ep=2)

# run NP ARGS...: `switchyard train` on NP ranks (each rank's status in $tmp/rc/), output
# in $tmp/out and $tmp/err; sets $rc. A 300 s limit turns a hang into a failure.
run() {
  local np="$1"; shift
  rm -rf "$tmp/rc"
  mkdir -p "$tmp/rc"
  if [[ $np -eq 1 ]]; then
    timeout 300 "$bin" train "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    echo "$rc" >"$tmp/rc/0"
  else
    RC_DIR="$tmp/rc" timeout 300 bash "$mpirun_wrapper" "$np" -x RC_DIR -x SWITCHYARD_TEST_NAN_GRAD \
      bash "$rank_rc" "$bin" train "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
  fi
  [[ $rc -ne 124 ]] || fail "np=$np $*: timed out"
}
# every_rank NAME NP CODE: each rank exited CODE.
every_rank() {
  local r
  for ((r = 0; r < $2; ++r)); do
    [[ "$(cat "$tmp/rc/$r" 2>/dev/null)" == "$3" ]] ||
      fail "$1: rank $r exited '$(cat "$tmp/rc/$r" 2>/dev/null)', want $3"
  done
}
# one_error NAME WANT: exactly one "switchyard train: error:" line, containing WANT.
one_error() {
  local n
  n=$(grep -c "^switchyard train: error: " "$tmp/err")
  [[ $n -eq 1 ]] || fail "$1: $n error lines, want 1: $(cat "$tmp/err")"
  grep -qF -- "$2" "$tmp/err" || fail "$1: stderr lacks '$2': $(cat "$tmp/err")"
}
# hashes DIR: the sha256 of every file under DIR, sorted.
hashes() { (cd "$1" && find . -type f -exec sha256sum {} + | sort); }
# record OUT STEP: the metrics.jsonl line of step STEP's training record.
record() { grep "^{\"step\":$2,\"loss\"" "$1/metrics.jsonl"; }
