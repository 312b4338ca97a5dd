# Shared by the CLI tests. `source "$(dirname "$0")/cli_test_lib.sh" BIN` sets bin (the
# switchyard binary), tmp (a scratch directory removed on exit) and failures, and defines:
#   fail MESSAGE                        count a failure and print it
#   expect_ok NAME WANT ARGS...         exit 0, stdout exactly WANT, empty stderr
#   expect_usage_error NAME WANT ARGS...
#                                       exit 2, no stdout, exactly one stderr line that
#                                       starts "switchyard <ARGS[0]>: error: " (or
#                                       "switchyard: error: ") and contains WANT
#   err_one_line NAME WANT ARGS...      exit 1 and exactly one stderr line containing WANT
bin="$1"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

expect_ok() {
  local name="$1" want="$2"; shift 2
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc -eq 0 ]] || fail "$name: exit status $rc, want 0 ($(cat "$tmp/err"))"
  [[ "$(cat "$tmp/out")" == "$want" ]] || fail "$name: stdout differs:
--- got
$(cat "$tmp/out")
--- want
$want"
  [[ ! -s "$tmp/err" ]] || fail "$name: unexpected stderr: $(cat "$tmp/err")"
}

expect_usage_error() {
  local name="$1" want="$2"; shift 2
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc -eq 2 ]] || fail "$name: exit status $rc, want 2"
  [[ ! -s "$tmp/out" ]] || fail "$name: unexpected stdout: $(head -c 200 "$tmp/out")"
  local lines
  lines=$(wc -l <"$tmp/err")
  [[ $lines -eq 1 ]] || fail "$name: $lines stderr lines, want 1: $(cat "$tmp/err")"
  grep -Eq "^switchyard( ${1:-})?: error: " "$tmp/err" || fail "$name: bad prefix: $(cat "$tmp/err")"
  grep -qF -- "$want" "$tmp/err" || fail "$name: stderr lacks '$want': $(cat "$tmp/err")"
}

err_one_line() {  # NAME WANT ARGS...: exit 1 and one stderr line containing WANT
  local name="$1" want="$2"; shift 2
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc -eq 1 ]] || fail "$name: exit status $rc, want 1"
  [[ $(wc -l <"$tmp/err") -eq 1 ]] && grep -qF -- "$want" "$tmp/err" || fail "$name: stderr $(cat "$tmp/err")"
}
