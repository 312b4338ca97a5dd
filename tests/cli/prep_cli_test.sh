#!/usr/bin/env bash
# `switchyard prep` on a small two-language corpus: the summary table and the files, two
# runs giving identical bytes, --force, and errors (one line on stderr, nothing on stdout;
# exit status 2 for bad flags, 1 for a failed run).
# Usage: prep_cli_test.sh path/to/switchyard
set -u
bin="$1"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# A tiny corpus: en.txt in fortune format, de.txt in paragraphs.
mkdir -p "$tmp/corpus"
for i in $(seq 1 30); do
  printf 'the cat %d sat on the mat\nand the dog ran away\n%%\n' "$i" >>"$tmp/corpus/en.txt"
  printf 'der hund %d lief weit weg\nund die katze schlief\n\n' "$i" >>"$tmp/corpus/de.txt"
done
corpus=("$tmp/corpus/en.txt" "$tmp/corpus/de.txt")

# expect_error NAME STATUS MESSAGE_SUBSTRING ARGS...: that exit status, exactly one
# stderr line starting with "switchyard prep: error: ", and no stdout unless the run got
# past reading the corpus (STATUS 1 after progress lines: set ALLOW_PROGRESS=1).
expect_error() {
  local name="$1" want_rc="$2" want="$3"; shift 3
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [[ $rc -eq $want_rc ]] || fail "$name: exit status $rc, want $want_rc ($(cat "$tmp/err"))"
  if [[ "${ALLOW_PROGRESS:-0}" == 1 ]]; then
    grep -qv '^prep: ' "$tmp/out" && fail "$name: unexpected stdout: $(head -c 300 "$tmp/out")"
  else
    [[ ! -s "$tmp/out" ]] || fail "$name: unexpected stdout: $(head -c 300 "$tmp/out")"
  fi
  local lines
  lines=$(wc -l <"$tmp/err")
  [[ $lines -eq 1 ]] || fail "$name: $lines stderr lines, want 1: $(cat "$tmp/err")"
  grep -q '^switchyard prep: error: ' "$tmp/err" || fail "$name: bad prefix: $(cat "$tmp/err")"
  grep -qF -- "$want" "$tmp/err" || fail "$name: stderr lacks '$want': $(cat "$tmp/err")"
}

# A run: exit 0, the summary on stdout, the files in --out.
"$bin" prep --out "$tmp/a" --vocab 100 --val-fraction 0.2 --seed 3 "${corpus[@]}" \
  >"$tmp/summary" 2>"$tmp/err"
rc=$?
[[ $rc -eq 0 ]] || fail "prep: exit status $rc ($(cat "$tmp/err"))"
[[ ! -s "$tmp/err" ]] || fail "prep: unexpected stderr: $(cat "$tmp/err")"
grep -Eq '^label +train docs +train tokens +val docs +val tokens$' "$tmp/summary" ||
  fail "summary lacks its header: $(cat "$tmp/summary")"
for label in en de all; do
  grep -Eq "^$label +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+$" "$tmp/summary" ||
    fail "summary lacks row $label"
done
# 30 documents per label, split between train and val.
for label in en de; do
  docs=$(awk -v l="$label" '$1 == l { print $2 + $4 }' "$tmp/summary")
  [[ "$docs" == 30 ]] || fail "$label: $docs documents, want 30"
done
grep -q "wrote $tmp/a" "$tmp/summary" || fail "summary lacks the output folder"
for file in index.json tokenizer.model train-00000.bin val-00000.bin; do
  [[ -f "$tmp/a/$file" ]] || fail "missing $file"
done
[[ "$(head -c 8 "$tmp/a/train-00000.bin")" == "SYTOKENS" ]] || fail "shard magic"
grep -q '"labels": \["de","en"\]' "$tmp/a/index.json" || fail "index labels"

# Not a terminal: no progress line rewritten in place, a plain summary line instead.
grep -q $'\r' "$tmp/summary" && fail "carriage returns in piped output"
grep -Eq '^prep: encoded 60 documents \([0-9.]+ MB\) in [0-9.]+ s, [0-9.]+ MB/s on [0-9]+ threads$' \
  "$tmp/summary" || fail "summary lacks the encoding line: $(cat "$tmp/summary")"
# A terminal (script(1) gives one): the progress line with bytes, documents, MB/s and ETA.
if command -v script >/dev/null; then
  script -qec "$bin prep --out $tmp/tty --vocab 100 --threads 1 ${corpus[*]}" /dev/null >"$tmp/tty.out" 2>&1
  grep -Eq $'\rprep: encoded [0-9.]+ of [0-9.]+ MB, 60 documents, [0-9.]+ MB/s, ETA [0-9]+ s' \
    "$tmp/tty.out" || fail "no progress line on a terminal: $(cat -A "$tmp/tty.out" | head -5)"
fi

# The same inputs give the same bytes; flags and files may come in any order.
"$bin" prep "${corpus[@]}" --seed=3 --vocab=100 --out "$tmp/b" --val-fraction 0.2 >/dev/null 2>&1 ||
  fail "second run failed"
for file in "$tmp"/a/*; do
  cmp -s "$file" "$tmp/b/$(basename "$file")" || fail "$(basename "$file") differs between runs"
done

# An existing output is replaced only with --force; a failed run leaves it alone.
expect_error "no --force" 1 "already holds a prep output (index.json); pass --force" \
  prep --out "$tmp/a" --vocab 100 --seed 4 "${corpus[@]}"
cmp -s "$tmp/a/index.json" "$tmp/b/index.json" || fail "a refused run changed the output"
"$bin" prep --out "$tmp/a" --vocab 100 --seed 4 --force "${corpus[@]}" >/dev/null 2>&1 ||
  fail "--force run failed"
cmp -s "$tmp/a/index.json" "$tmp/b/index.json" && fail "--force did not replace the output"
ls -d "$tmp"/a.* >/dev/null 2>&1 && fail "temporary folders left behind: $(ls -d "$tmp"/a.*)"

mkdir -p "$tmp/mine" && echo keep >"$tmp/mine/notes.txt"
expect_error "unrelated folder" 1 "is not empty and holds no prep output" \
  prep --out "$tmp/mine" --force --vocab 100 "${corpus[@]}"
expect_error "missing fortunes" 1 "bash scripts/setup.sh" \
  prep --out "$tmp/c" --fortunes "$tmp/no-fortunes"
expect_error "missing file" 1 "$tmp/nope.txt: no such file" prep --out "$tmp/c" "$tmp/nope.txt"
ALLOW_PROGRESS=1 expect_error "vocabulary too small" 1 "distinct characters" \
  prep --out "$tmp/c" --vocab 10 "${corpus[@]}"
[[ ! -e "$tmp/c" ]] || fail "a failed run created its output folder"

# Bad inputs: one line naming the file, and no output folder.
printf 'ELF\0binary' >"$tmp/a.out"
ALLOW_PROGRESS=1 expect_error "binary file" 1 "$tmp/a.out: binary data (a NUL byte at uncompressed offset 3)" \
  prep --out "$tmp/c" "$tmp/a.out"
: >"$tmp/empty.txt"
expect_error "empty corpus" 1 "the corpus holds no documents (1 files read)" \
  prep --out "$tmp/c" "$tmp/empty.txt"
gzip -c "$tmp/corpus/en.txt" | head -c 100 >"$tmp/cut.txt.gz"
expect_error "truncated gzip" 1 "$tmp/cut.txt.gz: truncated gzip data" \
  prep --out "$tmp/c" "$tmp/cut.txt.gz"
printf '{"text": "a"}\n{oops\n' >"$tmp/bad.jsonl"
expect_error "--strict" 1 "$tmp/bad.jsonl:2: not valid JSON" prep --out "$tmp/c" --strict "$tmp/bad.jsonl"
expect_error "bad format" 2 '--format must be auto, text or jsonl, got "csv"' \
  prep --out "$tmp/c" --format csv
expect_error "bad threads" 2 "--threads must be in [0, 4096] (0: every core), got -2" \
  prep --out "$tmp/c" --threads -2
[[ ! -e "$tmp/c" ]] || fail "a failed run created its output folder"
ls -d "$tmp"/c.* >/dev/null 2>&1 && fail "temporary folders left behind: $(ls -d "$tmp"/c.*)"

# Flags that would be ignored or read a file twice: usage errors (exit 2), nothing written.
expect_error "same file twice" 2 "$tmp/corpus/../corpus/en.txt is given twice (also as $tmp/corpus/en.txt)" \
  prep --out "$tmp/c" --vocab 100 "$tmp/corpus/en.txt" "$tmp/corpus/../corpus/en.txt"
expect_error "a file and its folder" 2 "is given twice" \
  prep --out "$tmp/c" --vocab 100 "$tmp/corpus" "$tmp/corpus/de.txt"
expect_error "--vocab with --tokenizer" 2 "--vocab 50 and --tokenizer $tmp/a/tokenizer.model are both given" \
  prep --out "$tmp/c" --tokenizer "$tmp/a/tokenizer.model" --vocab 50 "${corpus[@]}"
ln "$tmp/corpus/en.txt" "$tmp/en-hardlink.txt"
expect_error "a file and its hard link" 2 "$tmp/en-hardlink.txt is given twice (also as $tmp/corpus/en.txt)" \
  prep --out "$tmp/c" --vocab 100 "$tmp/corpus/en.txt" "$tmp/en-hardlink.txt"
expect_error "--label with --label-key" 2 "--label x and --label-key lang are both given" \
  prep --out "$tmp/c" --label x --label-key lang "${corpus[@]}"
expect_error "empty --label" 2 "--label is empty" prep --out "$tmp/c" --label "" "${corpus[@]}"
expect_error "--label with a space" 2 '--label "a b" is not a label (non-empty, no whitespace)' \
  prep --out "$tmp/c" --label "a b" "${corpus[@]}"
# An --out that cannot be created is named as given (not prep's temporary folder), before
# the corpus is read.
echo f >"$tmp/afile"
expect_error "--out under a file" 1 "--out $tmp/afile/sub: cannot create it ($tmp/afile: Not a directory)" \
  prep --out "$tmp/afile/sub" --vocab 100 "${corpus[@]}"
[[ ! -e "$tmp/c" ]] || fail "a refused run created its output folder"
ls -d "$tmp"/afile* "$tmp"/c.* 2>/dev/null | grep -qv "^$tmp/afile$" && fail "temporary folders left behind"
# An --out that is a symbolic link: refused before any work (the rename would replace the
# link, not fill its target); the link and its target stay as they were.
mkdir -p "$tmp/target" && echo keep >"$tmp/target/note" && ln -s "$tmp/target" "$tmp/link"
expect_error "--out a symbolic link" 1 "--out $tmp/link is a symbolic link (to $tmp/target)" \
  prep --out "$tmp/link/" --vocab 100 "${corpus[@]}"
[[ -L "$tmp/link" && $(cat "$tmp/target/note") == keep ]] || fail "a refused --out link was changed"
# A staging folder left by a killed run (its process gone) is removed by the next run; a
# live process's is left alone.
mkdir -p "$tmp/stale.tmp-999999999" "$tmp/stale.tmp-$$"
"$bin" prep --out "$tmp/stale" --vocab 100 "${corpus[@]}" >"$tmp/out" 2>&1 || fail "prep --out stale: $(cat "$tmp/out")"
[[ ! -e "$tmp/stale.tmp-999999999" ]] || fail "a dead run's staging folder was left behind"
[[ -d "$tmp/stale.tmp-$$" ]] || fail "a live process's staging folder was removed"
rmdir "$tmp/stale.tmp-$$"

# Documents of one 120 KB line each (long JSONL records, minified text): SentencePiece
# skips sentences over 64 KiB and failed with its internal "!sentences_.empty()"; the
# tokenizer's copy of a long text is cut into pieces.
py_long='import random; random.seed(1); w = ["alpha", "beta", "gamma"]
for d in range(3): print(" ".join(random.choice(w) for _ in range(20000)) + "\n")'
python3 -c "$py_long" >"$tmp/long.txt"
"$bin" prep --out "$tmp/long" --vocab 60 "$tmp/long.txt" >"$tmp/out" 2>&1 ||
  fail "documents over 64 KiB: $(tail -2 "$tmp/out")"
grep -q "trained the tokenizer: [0-9]* pieces on 3 of 3 training documents" "$tmp/out" ||
  fail "documents over 64 KiB: $(grep tokenizer "$tmp/out")"

ALLOW_PROGRESS=1 expect_error "tokenizer sample too small" 1 \
  "no training document fits in --tokenizer-sample-bytes 10 (the tokenizer trains on whole documents); raise it" \
  prep --out "$tmp/c" --vocab 100 --tokenizer-sample-bytes 10 "${corpus[@]}"

# --val-fraction 0: no validation split. Training without validation (eval_every 0, with
# eval_batches 2) takes it; eval says the data has none (exit 1).
"$bin" prep --out "$tmp/noval" --vocab 100 --val-fraction 0 "${corpus[@]}" >/dev/null 2>&1 ||
  fail "prep --val-fraction 0"
"$bin" train --config "$(dirname "$0")/../data/train-tiny.yaml" --set "data.dir=$tmp/noval" \
  --set train.eval_every=0 --set train.eval_batches=2 --set train.max_steps=2 --out "$tmp/noval_run" \
  >"$tmp/out" 2>"$tmp/err" || fail "train on data without a validation split: $(cat "$tmp/err")"
"$bin" eval --checkpoint "$tmp/noval_run" --data "$tmp/noval" >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 1 ]] || fail "eval on data without a validation split: not exit 1"
[[ $(wc -l <"$tmp/err") -eq 1 ]] && grep -qF "$tmp/noval: the data has no validation split" "$tmp/err" ||
  fail "eval on data without a validation split: $(cat "$tmp/err")"

# The data's vocabulary larger than model.vocab_size: training refuses at the start.
config="$(dirname "$0")/../data/train-tiny.yaml"
"$bin" train --config "$config" --set "data.dir=$tmp/a" --set model.vocab_size=64 \
  --set train.max_steps=2 >"$tmp/out" 2>"$tmp/err"
[[ $? -ne 0 ]] || fail "train with a small model.vocab_size succeeded"
grep -q "model.vocab_size=64 is smaller than the [0-9]* tokens of the tokenizer in $tmp/a" "$tmp/err" ||
  fail "vocab check: $(cat "$tmp/err")"
[[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "vocab check: $(wc -l <"$tmp/err") stderr lines: $(cat "$tmp/err")"

expect_error "unknown flag" 2 "unknown flag --vocabulary" prep --out "$tmp/c" --vocabulary 100
expect_error "missing --out" 2 "--out is required" prep "${corpus[@]}"
expect_error "bad fraction" 2 "--val-fraction must be in [0, 1), got 1.5" \
  prep --out "$tmp/c" --val-fraction 1.5
expect_error "not a number" 2 '--val-fraction expects a number, got "lots"' \
  prep --out "$tmp/c" --val-fraction lots
expect_error "bad seed" 2 '--seed expects a non-negative integer, got "-1"' \
  prep --out "$tmp/c" --seed=-1
expect_error "missing value" 2 "--vocab needs a value" prep --out "$tmp/c" --vocab

"$bin" --help >"$tmp/out" 2>&1 && grep -q "prep" "$tmp/out" || fail "--help does not list prep"
"$bin" prep --help >"$tmp/out" 2>&1 && grep -q -- "--val-fraction" "$tmp/out" || fail "prep --help"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all switchyard prep checks passed"
