# Shared by the CLI tests that start whole training runs in the background
# (train_cli_test.sh, and the failure tests through failures_lib.sh). Source it after setting tmp (a scratch
# directory) and running (the pid of a run in flight, or empty); it defines:
#   kill_tree PID   SIGCONT then SIGKILL PID and every process under it (a hung or stopped run)
#   fail MESSAGE    count a failure (in failures) and print it
#   wait_for_lines FILE N PID TRIES
#                   poll every 50 ms, at most TRIES times, until FILE has N lines or PID ends
# and, on exit, kills the run in flight and removes tmp.
kill_tree() {
  local child
  for child in $(pgrep -P "$1"); do kill_tree "$child"; done
  kill -CONT "$1" 2>/dev/null
  kill -KILL "$1" 2>/dev/null
}
cleanup() {
  [[ -z $running ]] || kill_tree "$running"
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
wait_for_lines() {
  local i
  for ((i = 0; i < $4; ++i)); do
    [[ -f $1 && $(wc -l <"$1") -ge $2 ]] && return
    kill -0 "$3" 2>/dev/null || return
    sleep 0.05
  done
}
