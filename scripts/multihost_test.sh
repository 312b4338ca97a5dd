#!/usr/bin/env bash
# A multi-host run on one machine: `switchyard train` launched by one mpirun across network
# namespaces that stand in for hosts, the path a user takes across nodes.
#
#   scripts/multihost_test.sh path/to/switchyard path/to/scripts/mpirun_test.sh
#
# What it builds (docs/multinode.md has the picture): one namespace per host (symh-PID-h1,
# -h2), each with its own UTS hostname, loopback and one veth into a bridge that lives in a
# third namespace (symh-PID-sw). Addresses (10.213.0.0/24) exist only inside the host
# namespaces; the root namespace gains no interface, route or address. mpirun runs inside
# host 1; Open MPI's rsh launcher reaches host 2 through a launcher agent (no sshd) that
# enters that namespace and starts orted there. Point-to-point traffic goes through ob1 and
# the tcp BTL on the veth subnet only (btl tcp,self; no vader, UCX or libfabric), so nothing
# crosses between "hosts" through shared memory.
#
# What it checks, for 2 hosts x 2 ranks in two layouts (ep 4: the expert all-to-all spans
# the hosts; ep 2 x edp 2: the expert gradients are summed across them; dp 4 in both):
#  - ranks 0, 1 run on host 1 and ranks 2, 3 on host 2 (their hostname and namespace), and
#    Open MPI counts 2 ranks per node (OMPI_COMM_WORLD_LOCAL_SIZE, what MPI's shared-memory
#    split uses to find nodes); if the engine prints its nodes, it prints 2;
#  - every step's loss equals, bit for bit, the same layout on loopback (scripts/
#    mpirun_test.sh, shared memory): the transport changes no number;
#  - every step's loss is within a relative 1e-5 of one rank with the same global batch
#    (the promise of the layout tests, tests/dist/trainer_test.cc LayoutInvariance);
#  - the traffic really crossed the veths: each host received at least the bytes the dense
#    gradient sum needs (steps x 4 bytes x the dense parameters of a rank: a host's sum
#    depends on every value the other host contributed);
#  - mpirun leaves no process in either namespace, and the teardown leaves no namespace.
# It then prints the wall time of the same 4-rank ep 4 run on loopback (shared memory, then
# tcp) and across the namespaces; not asserted.
#
# Prints "SKIP: <reason>" and exits 77 (ctest's SKIP_RETURN_CODE) where namespaces, veths, a
# bridge or a UTS namespace cannot be created (not root, no CAP_NET_ADMIN / CAP_SYS_ADMIN)
# or a tool is missing. Everything it creates (namespaces, with their veths and bridge,
# processes inside them, the scratch directory) is removed on exit, failure, SIGINT, SIGTERM
# and SIGHUP; names carry the script's pid, so two runs can go on at once, and a run that
# was SIGKILLed is cleaned up by the next one (its pid is gone). Each launch has a time
# limit, all of them together well under ctest's.
set -u
bin="${1:?usage: multihost_test.sh path/to/switchyard path/to/mpirun_test.sh}"
mpirun_sh="${2:?usage: multihost_test.sh path/to/switchyard path/to/mpirun_test.sh}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
compare="$root/tests/cli/compare_losses.py"
hosts=2 per_host=2
np=$((hosts * per_host))
subnet=10.213.0
prefix="symh-$$"
steps=8
failures=0
tmp=""
child=""  # the pid of the command in flight (run in the background so a signal is handled at once)

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# remove_ns NS: kill whatever still runs in NS (up to 5 s for it to go), then delete NS and
# with it its interfaces.
remove_ns() {
  local pids k
  for ((k = 0; k < 50; ++k)); do
    pids=$(ip netns pids "$1" 2>/dev/null)
    [[ -n $pids ]] || break
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null
    sleep 0.1
  done
  ip netns del "$1" 2>/dev/null
}

# kill_tree PID: SIGKILL PID and everything under it.
kill_tree() {
  local c
  for c in $(pgrep -P "$1"); do kill_tree "$c"; done
  kill -KILL "$1" 2>/dev/null
}

teardown() {
  local ns
  [[ -z $child ]] || kill_tree "$child"
  child=""
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-"); do
    remove_ns "$ns"
  done
  [[ -z $tmp ]] || rm -rf "$tmp"
  tmp=""
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
trap 'exit 141' PIPE

# alive PID: PID is a run of this script (not a pid reused by something else).
alive() { grep -qs multihost_test "/proc/$1/cmdline"; }

# What an earlier run killed by SIGKILL (its pid no longer a run of this script) left behind.
reap_stale() {
  local ns dir pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^symh-[0-9]+-'); do
    pid=${ns#symh-}
    pid=${pid%%-*}
    alive "$pid" || { echo "removing $ns (its run, pid $pid, is gone)"; remove_ns "$ns"; }
  done
  for dir in "${TMPDIR:-/tmp}"/symh-*.*; do
    [[ -d $dir ]] || continue
    pid=${dir##*/symh-}
    pid=${pid%%.*}
    alive "$pid" || rm -rf "$dir"
  done
}

# bg LIMIT CMD...: CMD under `timeout LIMIT`, in the background, waited for (so a trapped
# signal interrupts the wait); sets rc (124: timed out).
bg() {
  local limit="$1"; shift
  timeout -k 5 "$limit" "$@" &
  child=$!
  wait "$child"
  rc=$?
  child=""
}

# ---- can this machine do it? --------------------------------------------------------------
for tool in ip unshare timeout mpirun python3 pgrep; do
  command -v "$tool" >/dev/null || skip "$tool not found"
done
[[ -x $bin ]] || { echo "FAIL: $bin is not an executable"; exit 1; }
reap_stale
tmp="$(mktemp -d "${TMPDIR:-/tmp}/symh-$$.XXXXXX")"
sw="$prefix-sw"
msg=$(ip netns add "$sw" 2>&1) || skip "cannot create a network namespace (ip netns add: $msg)"
msg=$(ip -n "$sw" link add br0 type bridge 2>&1) || skip "cannot create a bridge (ip link add type bridge: $msg)"
msg=$(ip netns exec "$sw" unshare --uts true 2>&1) || skip "cannot create a UTS namespace (unshare --uts: $msg)"

# ---- the hosts ------------------------------------------------------------------------------
# Host i: namespace $prefix-hi, hostname symh-hi, eth0 at $subnet.i, its peer pi on br0.
if ! { ip -n "$sw" link set lo up && ip -n "$sw" link set br0 up; }; then
  echo "FAIL: cannot bring the bridge up"
  exit 1
fi
for ((i = 1; i <= hosts; ++i)); do
  ns="$prefix-h$i"
  { ip netns add "$ns" &&
    ip -n "$ns" link set lo up &&
    ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$sw" &&
    ip -n "$ns" addr add "$subnet.$i/24" dev eth0 &&
    ip -n "$ns" link set eth0 up &&
    ip -n "$sw" link set "p$i" master br0 up; } 2>"$tmp/net.err" ||
    skip "cannot set up host $i (veth, address): $(cat "$tmp/net.err")"
  echo "$subnet.$i slots=$per_host max_slots=$per_host" >>"$tmp/hostfile"
done
echo "hosts: $(ip netns list | awk '{print $1}' | grep "^$prefix-h" | sort | tr '\n' ' ')joined by br0 in $sw"

# The launcher agent: Open MPI's rsh launcher runs `AGENT [options] HOST COMMAND...` as it
# would ssh; this enters HOST's namespace with its own hostname and runs COMMAND (orted)
# there through a shell, as sshd would.
cat >"$tmp/agent.sh" <<EOF
#!/usr/bin/env bash
while [[ \${1:-} == -* ]]; do shift; done
host="\${1:-}"; shift
case "\$host" in
$(for ((i = 1; i <= hosts; ++i)); do echo "  $subnet.$i) i=$i ;;"; done)
  *) echo "agent.sh: unknown host '\$host'" >&2; exit 1 ;;
esac
exec ip netns exec "$prefix-h\$i" unshare --uts \\
  sh -c 'echo "\$0" >/proc/sys/kernel/hostname && eval "\$1"' "symh-h\$i" "\$*"
EOF
# Each rank notes where it runs, then becomes switchyard.
mkdir -p "$tmp/place"
cat >"$tmp/rank.sh" <<EOF
#!/usr/bin/env bash
r=\${OMPI_COMM_WORLD_RANK:-x}
echo "\$(cat /proc/sys/kernel/hostname) \$(ip netns identify \$\$) \${OMPI_COMM_WORLD_LOCAL_SIZE:-x}" >"\$PLACE/\$r"
exec "\$@"
EOF
chmod +x "$tmp/agent.sh" "$tmp/rank.sh"

# across_hosts ARGS...: mpirun in host 1 (hostname symh-h1), np ranks over the hostfile.
# The two "hosts" share this machine's cores: no binding (each orted would bind its ranks to
# the same cores) and ranks yield while they wait, as --oversubscribe does on loopback.
# shellcheck disable=SC2054  # the commas are Open MPI's
mpi=(-np "$np" --hostfile "$tmp/hostfile" --map-by slot --bind-to none --mca mpi_yield_when_idle 1
     --mca plm rsh --mca plm_rsh_agent "$tmp/agent.sh" --mca plm_rsh_no_tree_spawn 1
     --mca pml ob1 --mca btl tcp,self --mca osc '^ucx'
     --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24")
if [[ $(id -u) -eq 0 ]]; then
  mpi+=(--allow-run-as-root)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # orted on host 2 too
fi
# Open MPI's session directories (named by hostname) and PMIx's files go under $tmp, so
# that a killed run leaves none in /tmp.
mpi+=(--mca orte_tmpdir_base "$tmp")
across_hosts() {
  # shellcheck disable=SC2016  # $0 and $@ are the inner shell's
  TMPDIR="$tmp" bg 100 ip netns exec "$prefix-h1" unshare --uts \
    sh -c 'echo "$0" >/proc/sys/kernel/hostname && exec "$@"' symh-h1 \
    mpirun "${mpi[@]}" -x PLACE="$tmp/place" bash "$tmp/rank.sh" "$@"
}

# ---- data and the runs ------------------------------------------------------------------------
mkdir -p "$tmp/corpus"
for i in $(seq 1 600); do
  printf 'the cat %d sat on the mat and the dog ran away from it\n%%\n' "$i" >>"$tmp/corpus/en.txt"
  printf 'der hund %d lief weit weg und die katze schlief im haus\n%%\n' "$i" >>"$tmp/corpus/de.txt"
done
bg 60 "$bin" prep --out "$tmp/data" --vocab 120 --val-fraction 0.1 "$tmp"/corpus/*.txt \
  >"$tmp/prep.log" 2>&1
[[ $rc -eq 0 ]] || { cat "$tmp/prep.log"; echo "FAIL: prep"; exit 1; }

# switch-tiny, smaller: 2 layers (layer 1 MoE, 8 experts), global batch 16 x 32 tokens
# (micro-batches of 4: grad_accum 4 on one rank, 1 on four).
cfg=(--config "$root/configs/switch-tiny.yaml" --set "data.dir=$tmp/data"
     --set model.vocab_size=128 --set model.seq_len=32 --set model.d_model=32
     --set model.n_layers=2 --set model.d_ff=64 --set moe.d_expert=32
     --set train.micro_batch_size=4 --set "train.max_steps=$steps" --set train.warmup_steps=2
     --set train.eval_every=0 --set train.checkpoint_every=0)
SECONDS=0
wall() { python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.2f}")' "$1"; }

bg 120 "$bin" train "${cfg[@]}" --set train.grad_accum=4 --out "$tmp/one" >"$tmp/one.out" 2>&1
[[ $rc -eq 0 ]] || { tail -5 "$tmp/one.out"; echo "FAIL: one rank: exit status $rc"; exit 1; }
echo "--- one rank, grad_accum 4 ($SECONDS s)"

# check_placement NAME: ranks 0..per_host-1 on host 1, and so on; per_host ranks per node.
check_placement() {
  local r want got
  for ((r = 0; r < np; ++r)); do
    want="symh-h$((r / per_host + 1)) $prefix-h$((r / per_host + 1)) $per_host"
    got=$(cat "$tmp/place/$r" 2>/dev/null)
    [[ $got == "$want" ]] || fail "$1: rank $r ran on '$got', want '$want' (hostname, namespace, ranks on its node)"
  done
  echo "    $1: ranks by host: $(for ((r = 0; r < np; ++r)); do printf '%s:%s ' "$r" "$(cut -d' ' -f1 "$tmp/place/$r" 2>/dev/null)"; done)"
  # The engine's own view of the nodes, where it prints one ("N nodes").
  local nodes
  nodes=$(grep -oiE '\b[0-9]+ nodes\b' "$tmp/$2.out" | head -1)
  if [[ -n $nodes ]]; then
    [[ ${nodes%% *} -eq $hosts ]] || fail "$1: the engine found '$nodes', want $hosts nodes"
    echo "    $1: the engine: $(grep -iE '\b[0-9]+ nodes\b' "$tmp/$2.out" | head -1)"
  fi
}

# rx_bytes HOST: bytes host HOST's eth0 received so far.
rx_bytes() { ip netns exec "$prefix-h$1" cat /sys/class/net/eth0/statistics/rx_bytes; }

# no_leftovers NAME: nothing runs in the host namespaces once mpirun returned (orted
# daemonizes on host 2 and exits when told; give it 10 s).
no_leftovers() {
  local i k pids
  for ((i = 1; i <= hosts; ++i)); do
    for ((k = 0; k < 100; ++k)); do
      pids=$(ip netns pids "$prefix-h$i")
      [[ -n $pids ]] || break
      sleep 0.1
    done
    [[ -z $pids ]] || fail "$1: processes left in host $i: $(ps -o pid=,comm= -p "${pids//$'\n'/,}" | tr '\n' ' ')"
  done
}

# layout NAME EP: the layout on loopback (shared memory) and across the hosts; compare.
layout() {
  local name="$1" ep="$2" tag="ep$2" i dense after t0
  local -a before
  local run=("${cfg[@]}" --set train.grad_accum=1 --set "parallel.ep=$ep")
  t0=$(date +%s.%N)
  bg 100 bash "$mpirun_sh" "$np" "$bin" train "${run[@]}" --out "$tmp/loop-$tag" >"$tmp/loop-$tag.out" 2>&1
  [[ $rc -eq 0 ]] || { fail "$name on loopback: exit status $rc: $(grep -m3 -i error "$tmp/loop-$tag.out")"; return; }
  wall "$t0" >"$tmp/loop-$tag.wall"
  echo "--- $name on loopback ($SECONDS s)"

  for ((i = 1; i <= hosts; ++i)); do before[i]=$(rx_bytes "$i"); done
  rm -f "$tmp"/place/*
  t0=$(date +%s.%N)
  across_hosts "$bin" train "${run[@]}" --out "$tmp/hosts-$tag" >"$tmp/hosts-$tag.out" 2>&1
  wall "$t0" >"$tmp/hosts-$tag.wall"
  if [[ $rc -ne 0 ]]; then
    fail "$name across $hosts hosts: exit status $rc$([[ $rc -eq 124 ]] && echo ' (timed out)')"
    tail -20 "$tmp/hosts-$tag.out"
    return
  fi
  echo "--- $name across $hosts hosts ($SECONDS s)"
  grep -q "^world $np: .* ep $ep " "$tmp/hosts-$tag.out" ||
    fail "$name: no 'world $np ... ep $ep' line: $(grep -m1 '^world' "$tmp/hosts-$tag.out")"
  check_placement "$name" "hosts-$tag"
  no_leftovers "$name"

  local msg
  if msg=$(python3 "$compare" exact "$tmp/hosts-$tag/metrics.jsonl" "$tmp/loop-$tag/metrics.jsonl" 0 $((steps - 1)) 2>&1); then
    echo "    $name: across hosts vs loopback: $msg"
  else
    fail "$name: across hosts vs loopback: $msg"
  fi
  if msg=$(python3 "$compare" 1e-5 "$tmp/hosts-$tag/metrics.jsonl" "$tmp/one/metrics.jsonl" 0 $((steps - 1)) 2>&1); then
    echo "    $name: across hosts vs one rank: $msg"
  else
    fail "$name: across hosts vs one rank: $msg"
  fi

  # The dense parameters of a rank (every rank holds them all under tp 1, pp 1), from the
  # dry-run's table; each step sums their gradients over dp = 4 ranks on both hosts.
  dense=$(timeout 30 "$bin" train "${run[@]}" --dry-run --world "$np" 2>/dev/null |
          sed -n 's/^ *\[0, 1, 2, 3\] *\([0-9][0-9]*\) .*/\1/p' | head -1)
  [[ $dense =~ ^[0-9]+$ ]] || { fail "$name: no dense parameter count in the dry run"; return; }
  for ((i = 1; i <= hosts; ++i)); do
    after=$(rx_bytes "$i")
    local got=$((after - before[i])) need=$((steps * 4 * dense))
    [[ $got -ge $need ]] || fail "$name: host $i received $got bytes on its veth, want >= $need ($steps steps x 4 x $dense dense parameters)"
    echo "    $name: host $i received $got bytes on its veth (>= $need)"
  done
}

layout "ep 4 (dp 4)" 4
layout "ep 2 x edp 2 (dp 4)" 2

# ---- timing (not asserted) ------------------------------------------------------------------
# The ep 4 run once more on loopback over tcp (no shared memory), beside the two above.
t0=$(date +%s.%N)
# shellcheck disable=SC2054
loop_tcp=(--oversubscribe -np "$np" --mca pml ob1 --mca btl tcp,self --mca osc '^ucx'
          --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo)
[[ $(id -u) -ne 0 ]] || loop_tcp+=(--allow-run-as-root)
bg 100 mpirun "${loop_tcp[@]}" "$bin" train "${cfg[@]}" --set train.grad_accum=1 --set parallel.ep=4 --out "$tmp/tcp-ep4" \
  >"$tmp/tcp-ep4.out" 2>&1
tcp_wall=$(wall "$t0")
[[ $rc -eq 0 ]] || fail "ep 4 on loopback over tcp: exit status $rc: $(grep -m3 -i error "$tmp/tcp-ep4.out")"
# step_ms DIR: the median step time of steps 1.. (step 0 warms up), in ms.
step_ms() {
  python3 -c '
import json, statistics, sys
t = [json.loads(l)["step_s"] for l in open(sys.argv[1]) if l.startswith("{\"step\":")][1:]
print(f"{1e3 * statistics.median(t):.2f}" if t else "?")' "$1/metrics.jsonl" 2>/dev/null || echo "?"
}
echo "timing, $np ranks, ep 4, $steps steps (not asserted; this machine has $(nproc) cores):"
printf '  %-40s %10s %12s\n' "transport" "wall s" "median step ms"
printf '  %-40s %10s %12s\n' "loopback, scripts/mpirun_test.sh (vader)" "$(cat "$tmp/loop-ep4.wall" 2>/dev/null)" "$(step_ms "$tmp/loop-ep4")"
printf '  %-40s %10s %12s\n' "loopback, tcp" "$tcp_wall" "$(step_ms "$tmp/tcp-ep4")"
printf '  %-40s %10s %12s\n' "$hosts namespaces, tcp over veth + bridge" "$(cat "$tmp/hosts-ep4.wall" 2>/dev/null)" "$(step_ms "$tmp/hosts-ep4")"

# ---- teardown ---------------------------------------------------------------------------------
teardown
left=$(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$prefix-")
[[ -z $left ]] || fail "namespaces left after teardown: $left"
if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s) ($SECONDS s)"
  exit 1
fi
echo "PASS ($SECONDS s)"
