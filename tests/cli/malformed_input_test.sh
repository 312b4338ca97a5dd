#!/usr/bin/env bash
# Malformed input through the `switchyard` command (docs/failures.md): every case exits
# with its documented status, prints exactly one "switchyard <command>: error:" line
# naming the file (or key, or flag) and what is wrong, and changes nothing on disk (the
# checksums of every file under the test's directories before and after).
#  - moe-layer inputs: a shape whose byte size overflows 64 bits, offsets outside the file,
#    a wrong dtype, truncated data, a tensor listed twice, a NaN and an Inf in an input tensor;
#  - checkpoints (one saved by `switchyard train` here): an index that is not JSON, an
#    index shape that overflows, a path in its files, a negative piece offset, a flipped
#    bit in a tensor file, a NaN written into tensor data (caught by the checksum; and with
#    the checksums removed, as an older build wrote them, by the value check), a trainer
#    state whose step is not its directory's, whose layout or data position is out of
#    range, through `switchyard checkpoint verify`, `eval --verify`, `eval` and `train
#    --resume`; a config.yaml value its config refuses (checksums matching), through every
#    reader of it (exit 1, the file named); a sound checkpoint verifies;
#  - configs and flags: duplicate YAML keys (both lines named), a non-scalar key, an empty
#    config file, a directory as --config, a NUL byte echoed (escaped), a required key
#    missing, --steps 0;
#  - randomized (a fixed seed): byte flips, overwrites and truncations of the moe-layer
#    input and of the checkpoint's files, each ending in exit 0 or a clean error (status
#    1 or 2, one error line), never a signal.
# Usage: malformed_input_test.sh path/to/switchyard
set -u
bin="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tool="$here/moe_layer_tool.py"
python=/usr/bin/python3
[[ -x $python ]] || python=python3
failures=0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
SECONDS=0

# tree_sum DIR...: one checksum over every file's path and bytes.
tree_sum() { find "$@" -type f -print0 | sort -z | xargs -0 -r sha256sum | sha256sum; }

# expect_error NAME RC WANT CMD...: exit RC, no stdout line with "wrote", exactly one stderr
# line "switchyard <cmd>: error: ..." containing WANT, and the inputs unchanged.
expect_error() {
  local name="$1" want_rc="$2" want="$3"; shift 3
  local before after
  before=$(tree_sum "$tmp/in" "$tmp/run")
  timeout 120 "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  after=$(tree_sum "$tmp/in" "$tmp/run")
  [[ $rc -eq $want_rc ]] || fail "$name: exit status $rc, want $want_rc ($(head -3 "$tmp/err"))"
  local lines
  lines=$(wc -l <"$tmp/err")
  [[ $lines -eq 1 ]] || fail "$name: $lines stderr lines, want 1: $(head -5 "$tmp/err")"
  grep -Eq "^switchyard [a-z-]+( verify)?: error: " "$tmp/err" || fail "$name: bad prefix: $(cat "$tmp/err")"
  grep -qF -- "$want" "$tmp/err" || fail "$name: stderr lacks '$want': $(cat "$tmp/err")"
  [[ "$before" == "$after" ]] || fail "$name: files on disk changed"
  [[ ! -e $tmp/out.safetensors ]] || fail "$name: an output file was written"
  rm -f "$tmp/out.safetensors"
}

mkdir -p "$tmp/in" "$tmp/run"

# ---- moe-layer inputs -------------------------------------------------------------------
cat >"$tmp/in/layer.yaml" <<'EOF'
model:
  d_model: 4
moe:
  num_experts: 2
  top_k: 1
  d_expert: 4
  activation: gelu
EOF
$python "$tool" make --out "$tmp/in/good.safetensors" --groups 1 --tokens 4 --d 4 --experts 2 \
  --hidden 4 --activation gelu || fail "moe_layer_tool make"
layer=(moe-layer --config "$tmp/in/layer.yaml" --out "$tmp/out.safetensors")
"$bin" "${layer[@]}" --input "$tmp/in/good.safetensors" >"$tmp/out" 2>"$tmp/err" ||
  fail "the good moe-layer input: $(cat "$tmp/err")"
rm -f "$tmp/out.safetensors"

# damage.py GOOD OUT KIND: a copy of a safetensors file damaged one way.
cat >"$tmp/damage.py" <<'EOF'
import json, math, struct, sys
good, out, kind = sys.argv[1], sys.argv[2], sys.argv[3]
raw = open(good, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = bytearray(raw[8 + n:])
def offset_of(name):
    return header[name]["data_offsets"][0]
if kind == "overflow":
    header["x"]["shape"] = [4294967296, 4294967296, 4]
elif kind == "outside":
    b, e = header["x"]["data_offsets"]
    header["x"]["data_offsets"] = [len(data) + 8, len(data) + 8 + (e - b)]
elif kind == "dtype":
    header["x"]["dtype"] = "I32"
elif kind == "truncate":
    data = data[:len(data) - 5]
elif kind == "nan":
    data[offset_of("x") + 12:offset_of("x") + 16] = struct.pack("<f", math.nan)
elif kind == "inf":
    data[offset_of("experts.w1"):offset_of("experts.w1") + 4] = struct.pack("<f", math.inf)
text = json.dumps(header).encode()
if kind == "dup":  # "x" twice: a JSON reader would keep one silently
    text = b'{"x": ' + json.dumps(header["x"]).encode() + b', ' + text[1:]
open(out, "wb").write(struct.pack("<Q", len(text)) + text + bytes(data))
EOF
for kind in overflow outside dtype truncate nan inf dup; do
  $python "$tmp/damage.py" "$tmp/in/good.safetensors" "$tmp/in/$kind.safetensors" "$kind"
done
in="$tmp/in"
expect_error "moe-layer: a shape that overflows" 1 \
  "do not hold f32 (4294967296, 4294967296, 4) (more bytes than fit) inside 416 bytes of data" \
  "${layer[@]}" --input "$in/overflow.safetensors"
expect_error "moe-layer: offsets outside the file" 1 "$in/outside.safetensors: tensor 'x' data_offsets" \
  "${layer[@]}" --input "$in/outside.safetensors"
expect_error "moe-layer: a wrong dtype" 1 \
  "$in/dtype.safetensors: tensor 'x': expected f32 (any shape), got i32 (1, 4, 4)" \
  "${layer[@]}" --input "$in/dtype.safetensors"
expect_error "moe-layer: truncated data" 1 "$in/truncate.safetensors: tensor '" \
  "${layer[@]}" --input "$in/truncate.safetensors"
expect_error "moe-layer: a tensor listed twice" 1 "$in/dup.safetensors: the header lists tensor 'x' twice" \
  "${layer[@]}" --input "$in/dup.safetensors"
expect_error "moe-layer: a NaN input" 1 \
  "$in/nan.safetensors: tensor 'x' holds a non-finite value (nan at flat index 3 of (1, 4, 4))" \
  "${layer[@]}" --input "$in/nan.safetensors"
expect_error "moe-layer: an Inf weight" 1 \
  "$in/inf.safetensors: tensor 'experts.w1' holds a non-finite value (inf at flat index 0" \
  "${layer[@]}" --input "$in/inf.safetensors"
echo "--- moe-layer inputs ($SECONDS s)"

# ---- a checkpoint -----------------------------------------------------------------------
mkdir -p "$tmp/corpus"
for i in $(seq 1 60); do
  printf 'the cat sat on the mat %d times\nand then it ran away\n%%\n' $((i % 7)) >>"$tmp/corpus/en.txt"
  printf 'le chat dort sur le tapis %d fois\net puis il court encore\n%%\n' $((i % 5)) >>"$tmp/corpus/fr.txt"
done
"$bin" prep --out "$tmp/data" --vocab 128 "$tmp"/corpus/*.txt >"$tmp/prep.log" 2>&1 ||
  { cat "$tmp/prep.log"; fail "prep"; exit 1; }
cat >"$tmp/in/tiny.yaml" <<EOF
model: {vocab_size: 128, seq_len: 8, d_model: 16, n_layers: 1, n_heads: 2, d_ff: 32}
moe: {num_experts: 2, top_k: 1, d_expert: 16}
train: {max_steps: 2, micro_batch_size: 2, eval_every: 0, eval_batches: 2}
data: {dir: $tmp/data}
EOF
"$bin" train --config "$tmp/in/tiny.yaml" --out "$tmp/run" >"$tmp/train.out" 2>&1 ||
  { cat "$tmp/train.out"; fail "train"; exit 1; }
step="$tmp/run/step-00000002"
"$bin" checkpoint verify "$tmp/run" >"$tmp/out" 2>"$tmp/err" || fail "verify of a sound checkpoint: $(cat "$tmp/err")"
grep -q "^$step: ok (step 2, .* tensors, 4 files, .* bytes, CRC-32 verified)$" "$tmp/out" ||
  fail "verify's report: $(cat "$tmp/out")"
cp -r "$step" "$tmp/good-step"
restore() { rm -rf "$step" "$tmp/run/step-00000005"; cp -r "$tmp/good-step" "$step"; }

# poke.py FILE KIND: damages a file of the step directory in place.
cat >"$tmp/poke.py" <<'EOF'
import json, math, struct, sys
path, kind = sys.argv[1], sys.argv[2]
raw = bytearray(open(path, "rb").read())
if kind == "flip":  # one bit of the last tensor's data
    raw[-3] ^= 0x10
elif kind == "nan":  # a NaN over the first four bytes of tensor data
    n = struct.unpack("<Q", raw[:8])[0]
    raw[8 + n:8 + n + 4] = struct.pack("<f", math.nan)
elif kind == "nojson":
    raw = raw[:len(raw) // 2]
elif kind == "overflow":
    index = json.loads(raw)
    name = sorted(index["tensors"])[0]
    index["tensors"][name]["shape"] = [4294967296] * 3
    raw = json.dumps(index).encode()
elif kind == "unchecked":  # the index of an older build: no checksums
    index = json.loads(raw)
    del index["files"]
    raw = json.dumps(index).encode()
elif kind == "pathname":  # a files entry that is a path
    index = json.loads(raw)
    index["files"]["../../etc/passwd"] = index["files"].pop("config.yaml")
    raw = json.dumps(index).encode()
elif kind == "negoffset":
    index = json.loads(raw)
    piece = index["tensors"][sorted(index["tensors"])[0]]["pieces"][0]
    piece["offset"] = [-1] + piece["offset"][1:]
    raw = json.dumps(index).encode()
elif kind in ("world0", "ep3", "nextstep"):  # trainer_state.json's layout, data position
    state = json.loads(raw)
    if kind == "world0": state["layout"]["world"] = 0
    if kind == "ep3": state["layout"]["ep"] = 3
    if kind == "nextstep": state["data_position"]["next_step"] = 2 ** 62
    raw = json.dumps(state).encode()
elif kind == "badlr":  # config.yaml with train.lr: -1, the index's checksums made to match
    import os, zlib
    raw = raw.replace(b"\n  lr: ", b"\n  lr: -1\n  old_lr: ", 1)
    raw = b"\n".join(l for l in raw.split(b"\n") if not l.startswith(b"  old_lr: "))
    open(path, "wb").write(bytes(raw))
    index_path = os.path.join(os.path.dirname(path), "model.safetensors.index.json")
    index = json.load(open(index_path))
    index["files"]["config.yaml"] = {"crc32": "%08x" % (zlib.crc32(raw) & 0xffffffff), "bytes": len(raw)}
    json.dump(index, open(index_path, "w"))
open(path, "wb").write(bytes(raw))
EOF
poke() { $python "$tmp/poke.py" "$1" "$2"; }
# checkpoint_case NAME WANT: the damaged checkpoint through every reader.
checkpoint_case() {
  local name="$1" want="$2"
  expect_error "$name: checkpoint verify" 1 "$want" checkpoint verify "$tmp/run"
  expect_error "$name: eval --verify" 1 "$want" eval --checkpoint "$tmp/run" --verify
  expect_error "$name: eval" 1 "$want" eval --checkpoint "$tmp/run"
  expect_error "$name: train --resume" 1 "$want" train --config "$tmp/in/tiny.yaml" \
    --out "$tmp/run" --resume "$tmp/run" --set train.max_steps=3
  restore
}
poke "$step/model.safetensors" flip
checkpoint_case "a flipped bit" "$step/model.safetensors: checksum mismatch (crc32 "
poke "$step/model.safetensors" nan
checkpoint_case "a NaN in tensor data" "$step/model.safetensors: checksum mismatch (crc32 "
poke "$step/model.safetensors" nan
poke "$step/model.safetensors.index.json" unchecked
checkpoint_case "a NaN in an older checkpoint without checksums" "holds a non-finite value (nan at element 0"
poke "$step/model.safetensors.index.json" nojson
checkpoint_case "an index that is not JSON" "$step/model.safetensors.index.json: not a safetensors index"
poke "$step/model.safetensors.index.json" overflow
checkpoint_case "an index shape that overflows" "$step/model.safetensors.index.json: tensor '"
poke "$step/model.safetensors.index.json" pathname
checkpoint_case "a path in the index's files" \
  "$step/model.safetensors.index.json: files: '../../etc/passwd' is not a file name"
poke "$step/model.safetensors.index.json" negoffset
checkpoint_case "a negative piece offset" \
  "piece 0: offset is [-1,0], not a list of non-negative integers"
poke "$step/trainer_state.json" world0
checkpoint_case "layout.world 0" "$step/trainer_state.json: layout.world=0 must be an integer in [1, 131072]"
poke "$step/trainer_state.json" ep3
checkpoint_case "layout.ep 3 of world 1" "$step/trainer_state.json: layout.world=1 but tp 1 x cp 1"
poke "$step/trainer_state.json" nextstep
checkpoint_case "data_position.next_step 2^62" \
  "$step/trainer_state.json: data_position.next_step=4611686018427387904 must be an integer in [0, "
# config.yaml with a value its config refuses (its checksum matching): a damaged checkpoint
# for every command that reads it, exit 1 naming the file.
poke "$step/config.yaml" badlr
want_lr="$step/config.yaml: train.lr=-1 must be > 0"
expect_error "config.yaml train.lr -1: checkpoint verify" 1 "$want_lr" checkpoint verify "$tmp/run"
expect_error "config.yaml train.lr -1: eval" 1 "$want_lr" eval --checkpoint "$tmp/run"
expect_error "config.yaml train.lr -1: route" 1 "$want_lr" route --checkpoint "$tmp/run" --text "the cat"
expect_error "config.yaml train.lr -1: upcycle" 1 "$want_lr" upcycle --checkpoint "$tmp/run" \
  --out "$tmp/upcycled"
expect_error "config.yaml train.lr -1: export" 1 "$want_lr" export --format hf-mixtral "$tmp/run" "$tmp/hf"
expect_error "config.yaml train.lr -1: train --resume" 1 "$want_lr" train --config "$tmp/in/tiny.yaml" \
  --out "$tmp/run" --resume "$tmp/run" --set train.max_steps=3
[[ ! -e $tmp/upcycled && ! -e $tmp/hf ]] || fail "config.yaml train.lr -1: an output was written"
restore
poke "$step/optimizer.safetensors" flip
expect_error "a flipped bit in the optimizer: verify" 1 "$step/optimizer.safetensors: checksum mismatch" \
  checkpoint verify "$step"
restore
mv "$step" "$tmp/run/step-00000005"
echo step-00000005 >"$tmp/run/latest"
expect_error "a step that is not its directory's: verify" 1 \
  "$tmp/run/step-00000005/trainer_state.json: step 2 but its directory is step-00000005" \
  checkpoint verify "$tmp/run"
expect_error "a step that is not its directory's: resume" 1 "step 2 but its directory is step-00000005" \
  train --config "$tmp/in/tiny.yaml" --out "$tmp/run" --resume "$tmp/run" --set train.max_steps=3
echo step-00000002 >"$tmp/run/latest"
restore
# An older checkpoint (no checksums) still loads, and says so.
poke "$step/model.safetensors.index.json" unchecked
"$bin" checkpoint verify "$step" >"$tmp/out" 2>"$tmp/err" || fail "verify of an older checkpoint: $(cat "$tmp/err")"
grep -q "no checksums: saved by an older build, files not verified" "$tmp/out" || fail "older: $(cat "$tmp/out")"
restore
echo "--- checkpoints ($SECONDS s)"

# ---- configs and flags ------------------------------------------------------------------
printf 'model:\n  d_model: 16\n  n_layers: 1\n  d_model: 32\n' >"$tmp/in/dup.yaml"
expect_error "a duplicate key" 2 "$tmp/in/dup.yaml: 'model.d_model' is set twice, on lines 2 and 4; keep one" \
  train --config "$tmp/in/dup.yaml" --out "$tmp/run"
printf 'model:\n  ? [a]\n  : 1\n' >"$tmp/in/key.yaml"
expect_error "a non-scalar key" 2 "$tmp/in/key.yaml: a key of section 'model' (line 2) must be a plain word" \
  train --config "$tmp/in/key.yaml" --out "$tmp/run"
: >"$tmp/in/empty.yaml"
expect_error "an empty config" 2 "$tmp/in/empty.yaml: the config file is empty (0 bytes)" \
  train --config "$tmp/in/empty.yaml" --out "$tmp/run"
expect_error "a directory as --config" 2 "$tmp/in: is a directory, not a file" \
  train --config "$tmp/in" --out "$tmp/run"
printf 'model:\n  norm: "\\\0"\n' >"$tmp/in/nul.yaml"
expect_error "a NUL byte in a config" 2 "$tmp/in/nul.yaml:2: YAML syntax error: unknown escape character: \x00" \
  train --config "$tmp/in/nul.yaml" --out "$tmp/run"
LC_ALL=C grep -q '[[:cntrl:]]' <(tr -d '\n' <"$tmp/err") && fail "a NUL byte in a config: a raw control byte printed"
sed 's/ seq_len: 8,//' "$tmp/in/tiny.yaml" >"$tmp/in/noseq.yaml"
expect_error "a required key missing" 2 "model.seq_len is required (docs/config.md)" \
  train --config "$tmp/in/noseq.yaml" --out "$tmp/run"
expect_error "--steps 0" 2 "--steps=0 must be >= 1 (leave it out to train to train.max_steps)" \
  train --config "$tmp/in/tiny.yaml" --out "$tmp/run" --steps 0
expect_error "checkpoint without a subcommand" 2 "expected a subcommand: verify DIR" checkpoint
expect_error "checkpoint verify without DIR" 2 "verify needs a checkpoint directory" checkpoint verify
echo "--- configs and flags ($SECONDS s)"

# ---- randomized -------------------------------------------------------------------------
# random_case FILE SEED: FILE damaged (a seeded flip, overwrite or truncation) in place.
cat >"$tmp/fuzz_one.py" <<'EOF'
import random, sys
path, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
raw = bytearray(open(path, "rb").read())
kind = rng.randrange(3)
if kind == 0:
    for _ in range(rng.randint(1, 4)):
        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
elif kind == 1:
    raw[rng.randrange(len(raw))] = rng.choice(b'0123456789-.e[]{}:,"')
else:
    raw = raw[:rng.randrange(len(raw))]
open(path, "wb").write(bytes(raw))
EOF
# clean_exit NAME: the last command ended in 0, or 1/2 with one error line; never a signal.
clean_exit() {
  local name="$1" rc="$2"
  if [[ $rc -ge 128 || $rc -gt 2 ]]; then
    fail "$name: exit status $rc (a signal or crash): $(tail -3 "$tmp/err")"
  elif [[ $rc -ne 0 && $(wc -l <"$tmp/err") -ne 1 ]]; then
    fail "$name: exit status $rc with $(wc -l <"$tmp/err") stderr lines: $(head -3 "$tmp/err")"
  fi
}
cases=0
for seed in $(seq 1 60); do
  cp "$in/good.safetensors" "$tmp/case.safetensors"
  $python "$tmp/fuzz_one.py" "$tmp/case.safetensors" "$seed"
  timeout 60 "$bin" "${layer[@]}" --input "$tmp/case.safetensors" >"$tmp/out" 2>"$tmp/err"
  clean_exit "moe-layer random case $seed" $?
  rm -f "$tmp/out.safetensors"
  cases=$((cases + 1))
done
files=(model.safetensors optimizer.safetensors model.safetensors.index.json trainer_state.json config.yaml)
for seed in $(seq 1 60); do
  restore
  f="${files[seed % ${#files[@]}]}"
  $python "$tmp/fuzz_one.py" "$step/$f" "$((seed + 1000))"
  timeout 60 "$bin" checkpoint verify "$tmp/run" >"$tmp/out" 2>"$tmp/err"
  clean_exit "checkpoint random case $seed ($f)" $?
  cases=$((cases + 1))
done
restore
echo "--- $cases randomized cases ($SECONDS s)"

if [[ $failures -ne 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "malformed input: all cases passed ($SECONDS s)"
