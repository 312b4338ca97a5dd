#!/usr/bin/env bash
# Failure behaviour of `switchyard train` in jobs of several ranks (docs/failures.md), on
# the tiny model and corpus of failures_lib.sh (the one-process cases: failures_cli_test.sh):
#  - ranks launched with different command lines or configs (rank 1 with a flag more, a
#    relative path naming another file, another moe.top_k): exit 2 on every rank, one line
#    naming the argument or the key and both values, nothing written; prep under mpirun is
#    refused on every rank;
#  - SIGTERM to the job of `mpirun -np 2` run by scripts/mpirun_job.sh: status 75 (every
#    rank's too) and the step it stopped after saved;
#  - the collective watchdog: one rank of 2 stopped (SIGSTOP) mid-run with a 3 s
#    train.collective_timeout_s: the job ends with status 4 within 60 s, and rank 0's
#    line names the collective, its group and rank 1 as not arrived; the same under
#    pp 2: the line names rank 1 and its pipeline stage (and, when rank 0 waits in a
#    pipeline send or receive, the peer and both stages).
# Usage: failures_ranks_cli_test.sh path/to/switchyard path/to/scripts/mpirun_test.sh
set -u
bin="$1"
mpirun_wrapper="$2"
source "$(dirname "$0")/failures_lib.sh"

# ---- ranks with different command lines or configs ----------------------------------------
# An MPMD launch, or a wrapper that adds a flag on some ranks: every command that runs under
# mpirun compares each rank's command line with rank 0's before any work; the rank that
# differs names the first argument that does, one line, exit 2 on every rank, nothing written.
cat >"$tmp/other_rank.sh" <<'EOF'
#!/usr/bin/env bash
# other_rank.sh EXTRA BIN ARGS...: BIN ARGS, and on world rank 1 BIN ARGS EXTRA.
extra=$1; shift
[[ ${OMPI_COMM_WORLD_RANK:-0} == 1 ]] && exec "$@" "$extra"
exec "$@"
EOF
# other_dir.sh DIR BIN ARGS...: BIN ARGS in DIR/r<world rank> (a relative path then names
# another file on each rank, as on a node with another copy of the file).
cat >"$tmp/other_dir.sh" <<'EOF'
#!/usr/bin/env bash
cd "$1/r${OMPI_COMM_WORLD_RANK:-0}" && shift && exec "$@"
EOF
# other_flags NAME EXTRA WANT CMD ARGS...: CMD ARGS on 2 ranks, rank 1 with EXTRA added: exit 2
# on every rank and one "switchyard CMD: error:" line containing WANT.
other_flags() {
  local name=$1 extra=$2 want=$3 cmd=$4 n
  shift 4
  rm -rf "$tmp/rc" && mkdir -p "$tmp/rc"
  RC_DIR="$tmp/rc" timeout 300 bash "$mpirun_wrapper" 2 -x RC_DIR bash "$rank_rc" \
    bash "$tmp/other_rank.sh" "$extra" "$bin" "$cmd" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 2 ]] || fail "$name: mpirun exited $rc, want 2"
  every_rank "$name" 2 2
  n=$(grep -c "^switchyard $cmd: error: " "$tmp/err")
  [[ $n -eq 1 ]] || fail "$name: $n error lines, want 1: $(cat "$tmp/err")"
  grep -qF -- "$want" "$tmp/err" || fail "$name: stderr lacks '$want': $(cat "$tmp/err")"
}
out="$tmp/two_flags"
other_flags "train, --set on one rank" --set=moe.top_k=2 \
  "rank 1's command line differs from rank 0's: argument 9 is '--set=moe.top_k=2' here, absent on rank 0" \
  train "${two[@]}" --out "$out"
[[ ! -e "$out" ]] || fail "train, --set on one rank: $out was created"
# eval --verify on one rank aborted (MPI_ERR_TRUNCATE); another --checkpoint on one rank
# averaged two models' losses (exit 0). Both are refused before a checkpoint is read.
other_flags "eval, --verify on one rank" --verify \
  "rank 1's command line differs from rank 0's: argument 3 is '--verify' here, absent on rank 0" \
  eval --checkpoint "$tmp/no_checkpoint"
other_flags "eval, --batches on one rank" --batches=5 \
  "argument 3 is '--batches=5' here, absent on rank 0" eval --checkpoint "$tmp/no_checkpoint"
echo "--- ranks with different command lines: exit 2 on every rank, the argument named ($SECONDS s)"

# prep writes one folder: several ranks raced for --out (one wrote it, the others failed
# and left temporary folders). It runs on one rank: exit 2 on every rank, one line.
rm -rf "$tmp/rc" && mkdir -p "$tmp/rc"
RC_DIR="$tmp/rc" timeout 300 bash "$mpirun_wrapper" 2 -x RC_DIR bash "$rank_rc" \
  "$bin" prep --out "$tmp/pq" --vocab 128 "$tmp"/corpus/*.txt >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 2 ]] || fail "prep under mpirun: mpirun exited $rc, want 2"
every_rank "prep under mpirun" 2 2
[[ $(grep -c "^switchyard prep: error: runs on one rank (launch it without mpirun" "$tmp/err") -eq 1 ]] ||
  fail "prep under mpirun: $(cat "$tmp/err")"
ls -d "$tmp"/pq* >/dev/null 2>&1 && fail "prep under mpirun wrote $(ls -d "$tmp"/pq*)"
echo "--- prep under mpirun: refused on every rank ($SECONDS s)"
# upcycle too: one line (rank 0's), exit 2 on every rank, nothing written.
rm -rf "$tmp/rc" && mkdir -p "$tmp/rc"
RC_DIR="$tmp/rc" timeout 300 bash "$mpirun_wrapper" 2 -x RC_DIR bash "$rank_rc" \
  "$bin" upcycle --checkpoint "$tmp/none" --out "$tmp/uq" >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 2 ]] || fail "upcycle under mpirun: mpirun exited $rc, want 2"
every_rank "upcycle under mpirun" 2 2
[[ $(grep -c "error" "$tmp/err") -eq 1 ]] &&
  grep -q "^switchyard upcycle: error: runs on one rank (launch it without mpirun" "$tmp/err" ||
  fail "upcycle under mpirun: $(cat "$tmp/err")"
[[ ! -e "$tmp/uq" ]] || fail "upcycle under mpirun wrote $tmp/uq"

# The same command line but another config file behind it: train compares the resolved
# configs; the first key that differs, with both values.
mkdir -p "$tmp/r0" "$tmp/r1"
cp "$tmp/tiny.yaml" "$tmp/r0/cfg.yaml"
sed 's/top_k: 1/top_k: 2/' "$tmp/tiny.yaml" >"$tmp/r1/cfg.yaml"
out="$tmp/two_configs"
rm -rf "$tmp/rc" && mkdir -p "$tmp/rc"
RC_DIR="$tmp/rc" timeout 300 bash "$mpirun_wrapper" 2 -x RC_DIR bash "$rank_rc" \
  bash "$tmp/other_dir.sh" "$tmp" "$bin" train --config cfg.yaml "${two[@]:2}" --out "$out" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 2 ]] || fail "two configs: mpirun exited $rc, want 2"
every_rank "two configs" 2 2
one_error "two configs" "rank 1's config differs from rank 0's: moe.top_k is 2 here, 1 on rank 0"
[[ ! -e "$out" ]] || fail "two configs: $out was created"
echo "--- ranks with different configs: exit 2 on every rank, the key named ($SECONDS s)"

# ---- SIGTERM to a job under mpirun ----------------------------------------------------------
# A scheduler signals the job, not a rank: SIGTERM to scripts/mpirun_job.sh running
# `mpirun -np 2` (Open MPI's mpirun alone would kill the ranks and exit 1). The job's status
# must be 75, every rank's too, and the step it stopped after saved and verifying.
out="$tmp/preempt"
rm -rf "$tmp/rc" && mkdir -p "$tmp/rc"
RC_DIR="$tmp/rc" MPIRUN="bash $mpirun_wrapper" bash "$(dirname "$0")/../../scripts/mpirun_job.sh" 2 \
  -x RC_DIR bash "$rank_rc" "$bin" train "${two[@]}" --out "$out" \
  --set train.max_steps=1000000 --set train.checkpoint_every=0 >"$tmp/out" 2>"$tmp/err" &
pid=$!
running=$pid
wait_for_lines "$out/metrics.jsonl" 5 "$pid" 600
kill -TERM "$pid"
for ((i = 0; i < 1200; ++i)); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.05
done
if kill -0 "$pid" 2>/dev/null; then
  fail "SIGTERM under mpirun: the job still runs 60 s after SIGTERM"
  kill_tree "$pid"
fi
wait "$pid"
rc=$?
running=""
[[ $rc -eq 75 ]] || fail "SIGTERM under mpirun: the job exited $rc, want 75: $(grep -v '^\[' "$tmp/err" | head -5)"
every_rank "SIGTERM under mpirun" 2 75
k=$(sed -n 's/^stopped by signal 15 after step \([0-9]*\); resume with --resume .*/\1/p' "$tmp/out")
if [[ -z $k ]]; then
  fail "SIGTERM under mpirun: no 'stopped by signal' line: $(tail -3 "$tmp/out")"
else
  want_dir=$(printf 'step-%08d' $((k + 1)))
  [[ "$(cat "$out/latest" 2>/dev/null)" == "$want_dir" ]] ||
    fail "SIGTERM under mpirun: latest is '$(cat "$out/latest" 2>/dev/null)', want $want_dir"
  "$bin" checkpoint verify "$out" >/dev/null 2>&1 || fail "SIGTERM under mpirun: the checkpoint does not verify"
  echo "--- SIGTERM to the job under mpirun: status $rc, saved $want_dir ($SECONDS s)"
fi

# ---- the collective watchdog ----------------------------------------------------------------
# stall_rank_one NAME PATTERN: the job $pid runs; SIGSTOPs its rank 1 (the process matching
# PATTERN whose environment says OMPI_COMM_WORLD_RANK=1), waits up to 60 s for the job to
# end and sets rc to its status (empty when rank 1 was not found); the stopped process is
# resumed and killed after.
stall_rank_one() {
  local name=$1 pattern=$2 stopped="" p i
  rc=""
  for p in $(pgrep -f "$pattern"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1; then
      stopped=$p
    fi
  done
  if [[ -z $stopped ]]; then
    fail "$name: rank 1 not found"
    kill_tree "$pid"
    return
  fi
  kill -STOP "$stopped"
  for ((i = 0; i < 1200; ++i)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    fail "$name: the job still runs 60 s after rank 1 was stopped"
    kill -CONT "$stopped" 2>/dev/null
    kill_tree "$pid"
  fi
  wait "$pid"
  rc=$?
  running=""
  kill -CONT "$stopped" 2>/dev/null
  kill -KILL "$stopped" 2>/dev/null
}

# Two ranks (ep 2) train for a long time with a 3 s watchdog; once they run, rank 1 is
# stopped (SIGSTOP). Rank 0's next collective cannot complete: the job must end non-zero
# (status 4) well within 60 s, with rank 0's line naming the collective, the group and
# rank 1 as the one that has not arrived.
out="$tmp/watchdog"
RC_DIR="$tmp/rc" bash "$mpirun_wrapper" 2 "$bin" train "${two[@]}" --out "$out" \
  --set train.max_steps=1000000 --set train.checkpoint_every=0 \
  --set train.collective_timeout_s=3 >"$tmp/out" 2>"$tmp/err" &
pid=$!
running=$pid
wait_for_lines "$out/metrics.jsonl" 5 "$pid" 600
stall_rank_one watchdog "$bin train"
if [[ -n $rc ]]; then
  [[ $rc -eq 4 ]] || fail "watchdog: mpirun exited $rc, want 4"
  grep -Eq "^switchyard: rank 0: [a-z_]+ #[0-9]+ on group of world ranks \[0 1\] did not complete within 3 s \(train.collective_timeout_s\); not arrived: rank 1 \(no answer: stopped, hung or busy\)$" "$tmp/err" ||
    fail "watchdog: no line from rank 0 naming rank 1: $(grep -v '^\[' "$tmp/err" | head -5)"
  echo "--- watchdog: rank 1 stopped, the job ended with status $rc: $(grep '^switchyard: rank 0' "$tmp/err") ($SECONDS s)"
fi

# The same with two pipeline stages (pp 2, 4 micro-batches): rank 0 (stage 0) waits on
# stage 1 in a pipeline send or receive (or a collective after the step); either way its
# line names rank 1 and its stage as not arrived, and the job ends with status 4.
out="$tmp/watchdog-pp"
RC_DIR="$tmp/rc" bash "$mpirun_wrapper" 2 "$bin" train --config "$tmp/tiny.yaml" --out "$out" \
  --set parallel.pp=2 --set train.grad_accum=4 --set train.max_steps=1000000 \
  --set train.checkpoint_every=0 --set train.collective_timeout_s=3 >"$tmp/out" 2>"$tmp/err" &
pid=$!
running=$pid
wait_for_lines "$out/metrics.jsonl" 5 "$pid" 600
stall_rank_one "watchdog pp" "$bin train --config $tmp/tiny.yaml --out $out"
if [[ -n $rc ]]; then
  [[ $rc -eq 4 ]] || fail "watchdog pp: mpirun exited $rc, want 4"
  grep -Eq "^switchyard: rank 0: [a-z_]+ #[0-9]+ on group of world ranks \[0 1\]( with world rank 1)? did not complete within 3 s \(train.collective_timeout_s\)( \(pipeline stage 0 \(world rank 0\) (receiving from|sending to) stage 1 \(world rank 1\)\))?; not arrived: rank 1 \[pipeline stage 1\] \(no answer: stopped, hung or busy\)$" "$tmp/err" ||
    fail "watchdog pp: no line from rank 0 naming rank 1 and stage 1: $(grep -v '^\[' "$tmp/err" | head -5)"
  echo "--- watchdog pp: stage 1 stopped, the job ended with status $rc: $(grep '^switchyard: rank 0' "$tmp/err") ($SECONDS s)"
fi

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "failures (ranks): all cases passed ($SECONDS s)"
