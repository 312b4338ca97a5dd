#!/usr/bin/env bash
# `switchyard prep --tokenizer FILE`: with a SentencePiece model trained by Debian's
# spm_train, the shards hold exactly the ids Debian's spm_encode gives for the same text
# (then </s> per document), the model is copied unchanged; a 70000-piece model gives u32
# shards that the loader reads (the same check through spm_encode); a file that is not a
# model is one error line.
# Usage: prep_tokenizer_test.sh path/to/switchyard
set -u
bin="$1"
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
for tool in spm_train spm_encode python3; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is missing (bash scripts/setup.sh)"; exit 1; }
done

# One-line documents separated by blank lines, so each document is one spm_encode line.
python3 - "$tmp" <<'EOF'
import random, sys
r = random.Random(3)
tmp = sys.argv[1]
small = ["the", "cat", "sat", "on", "mat", "der", "Hund", "über", "naïve", "café", "42", "x-ray"]
letters = "abcdefghijklmnopqrstuvwxyz"
big = ["".join(r.choice(letters) for _ in range(7)) for _ in range(75000)]
with open(f"{tmp}/small.txt", "w") as f, open(f"{tmp}/small.lines", "w") as g:
    for _ in range(400):
        line = " ".join(r.choice(small) for _ in range(r.randint(1, 12)))
        f.write(line + "\n\n")
        g.write(line + "\n")
with open(f"{tmp}/big.train", "w") as f:
    for i in range(0, len(big), 15):
        f.write(" ".join(big[i:i + 15]) + "\n")
with open(f"{tmp}/big.txt", "w") as f, open(f"{tmp}/big.lines", "w") as g:
    for _ in range(300):
        line = " ".join(r.choice(big) for _ in range(r.randint(1, 10)))
        f.write(line + "\n\n")
        g.write(line + "\n")
EOF

# compare NAME MODEL TEXT LINES: prep with MODEL, then the shard against spm_encode.
compare() {
  local name="$1" model="$2" text="$3" lines="$4"
  "$bin" prep --out "$tmp/$name" --tokenizer "$model" --val-fraction 0 --threads 2 "$text" \
    >"$tmp/$name.out" 2>&1 || { fail "$name: prep failed: $(cat "$tmp/$name.out")"; return; }
  cmp -s "$model" "$tmp/$name/tokenizer.model" || fail "$name: tokenizer.model is not the model"
  spm_encode --model "$model" --output_format=id <"$lines" >"$tmp/$name.ids" ||
    { fail "$name: spm_encode failed"; return; }
  python3 - "$tmp/$name" "$tmp/$name.ids" <<'EOF' || fail "$name: ids differ from spm_encode"
import json, struct, sys
out, ids_path = sys.argv[1], sys.argv[2]
index = json.load(open(f"{out}/index.json"))
width = {"u16": 2, "u32": 4}[index["dtype"]]
tokens = []
for shard in index["shards"]:
    data = open(f"{out}/{shard['name']}", "rb").read()
    assert data[:8] == b"SYTOKENS" and struct.unpack("<I", data[12:16])[0] == width
    tokens += struct.unpack(f"<{len(data[32:]) // width}{'H' if width == 2 else 'I'}", data[32:])
want = []
for line in open(ids_path):
    want += [int(x) for x in line.split()] + [index["eos_id"]]
if tokens != want:
    first = next(i for i in range(min(len(tokens), len(want))) if tokens[i] != want[i]) \
        if any(a != b for a, b in zip(tokens, want)) else min(len(tokens), len(want))
    print(f"{len(tokens)} tokens vs {len(want)}; first difference at {first}")
    sys.exit(1)
print(f"{index['dtype']} vocab {index['vocab_size']}: {len(tokens)} tokens equal spm_encode's, "
      f"max id {max(tokens)}")
EOF
}

# A BPE model with Debian's defaults (NFKC normalisation, a dummy prefix).
spm_train --input="$tmp/small.lines" --model_prefix="$tmp/small" --vocab_size=60 \
  --model_type=bpe --minloglevel=2 >/dev/null 2>&1 || fail "spm_train (bpe) failed"
compare small "$tmp/small.model" "$tmp/small.txt" "$tmp/small.lines"
grep -q '"dtype": "u16"' "$tmp/small/index.json" || fail "small: not u16"

# 70000 pieces: ids above 65535, stored as u32.
spm_train --input="$tmp/big.train" --model_prefix="$tmp/big" --vocab_size=70000 \
  --model_type=word --minloglevel=2 >/dev/null 2>&1 || fail "spm_train (word) failed"
compare big "$tmp/big.model" "$tmp/big.txt" "$tmp/big.lines"
grep -q '"dtype": "u32"' "$tmp/big/index.json" || fail "big: not u32"
grep -q '"vocab_size": 70000' "$tmp/big/index.json" || fail "big: vocab_size"

# A file that is not a model: one line naming it.
"$bin" prep --out "$tmp/bad" --tokenizer "$tmp/small.txt" "$tmp/small.txt" >"$tmp/out" 2>"$tmp/err"
[[ $? -eq 1 ]] || fail "bad model: exit status"
[[ $(wc -l <"$tmp/err") -eq 1 ]] || fail "bad model: $(cat "$tmp/err")"
grep -q "^switchyard prep: error: $tmp/small.txt: not a SentencePiece model" "$tmp/err" ||
  fail "bad model: $(cat "$tmp/err")"
"$bin" prep --out "$tmp/bad" --tokenizer "$tmp/nope.model" "$tmp/small.txt" >"$tmp/out" 2>"$tmp/err"
grep -q "^switchyard prep: error: $tmp/nope.model: cannot open the tokenizer model" "$tmp/err" ||
  fail "missing model: $(cat "$tmp/err")"
[[ ! -e "$tmp/bad" ]] || fail "a failed run created its output folder"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all prep --tokenizer checks passed"
