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
#  - what is not a regular file (a FIFO, /dev/zero, a directory) in place of any file read:
#    refused at once, never a hang; `latest` echoed escaped and cut short; a checksum table
#    without config.yaml or trainer_state.json, an index without its metadata;
#  - route: a --file over its 1 MiB limit (exit 2); moe-layer: --out the --config file;
#  - export/import: empty paths (exit 2), an export failing on a file-size limit (nothing
#    left, a retry works), under mpirun (exit 2); an imported NaN, a sharded directory whose
#    weight_map disagrees with its shards (exit 1, naming the tensor);
#  - configs and flags: duplicate YAML keys (both lines named), a non-scalar key, an empty
#    config file, a directory as --config, a NUL byte echoed (escaped), a required key
#    missing, --steps 0;
#  - randomized (a fixed seed): byte flips, overwrites and truncations of the moe-layer
#    input and of the checkpoint's files, each ending in exit 0 or a clean error (status
#    1 or 2, one error line), never a signal.
# Usage: malformed_input_test.sh path/to/switchyard [path/to/scripts/mpirun_test.sh]
set -u
bin="$1"
mpirun_sh="${2:-}"
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
mkfifo "$tmp/fifo"
expect_error "moe-layer: a FIFO as --input" 1 "$tmp/fifo: is a FIFO (named pipe), not a regular file" \
  "${layer[@]}" --input "$tmp/fifo"
expect_error "moe-layer: /dev/zero as --input" 1 "/dev/zero: is a character device, not a regular file" \
  "${layer[@]}" --input /dev/zero
expect_error "moe-layer: a directory as --input" 1 "$tmp/in: is a directory, not a file" \
  "${layer[@]}" --input "$tmp/in"
expect_error "moe-layer: --out the --config file" 2 "--out $tmp/in/layer.yaml is the --config file" \
  moe-layer --config "$tmp/in/layer.yaml" --input "$tmp/in/good.safetensors" --out "$tmp/in/layer.yaml"
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
elif kind == "bignumber":  # a number no double holds: the JSON parser throws out_of_range
    raw = raw.replace(b'"format_version":', b'"format_version": 1e999, "x":', 1)
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
elif kind in ("nosum", "nometadata", "bogusformat", "version0", "uppercrc"):
    index = json.loads(raw)
    if kind == "nosum": del index["files"]["config.yaml"]
    if kind == "nometadata": del index["metadata"]
    if kind == "bogusformat": index["metadata"]["format"] = "bogus"
    if kind == "version0": index["metadata"]["format_version"] = 0
    if kind == "uppercrc":
        for sum in index["files"].values(): sum["crc32"] = sum["crc32"].upper()
    raw = json.dumps(index).encode()
elif kind in ("world0", "ep3", "nextstep"):  # trainer_state.json's layout, data position
    state = json.loads(raw)
    if kind == "world0": state["layout"]["world"] = 0
    if kind == "ep3": state["layout"]["ep"] = 3
    if kind == "nextstep": state["data_position"]["next_step"] = 2 ** 62
    raw = json.dumps(state).encode()
elif kind in ("negstep", "negsq"):  # optimizer.step -5, or a second moment -1
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    name = "optimizer.step" if kind == "negstep" else sorted(
        k for k in header if k.startswith("optimizer.exp_avg_sq."))[0]
    at = 8 + n + header[name]["data_offsets"][0]
    value = struct.pack("<q", -5) if kind == "negstep" else struct.pack("<f", -1.0)
    raw[at:at + len(value)] = value
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
checkpoint_case "an index that is not JSON" "$step/model.safetensors.index.json: not JSON (line "
poke "$step/model.safetensors.index.json" bignumber
checkpoint_case "an index with a number beyond a double" \
  "$step/model.safetensors.index.json: not JSON (number overflow parsing '1e999')"
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
# Optimizer state no run writes, in a checkpoint without checksums (an older build's): a
# negative update count (the learning-rate schedule's step) or second moment (a square root
# of it divides the update). Refused by verify and by the resume; eval reads none of it.
for kind in negstep negsq; do
  poke "$step/optimizer.safetensors" "$kind"
  poke "$step/model.safetensors.index.json" unchecked
  if [[ $kind == negstep ]]; then
    want="$step: tensor 'optimizer.step' is -5, outside [0, "
  else
    want="' holds -1 at element 0 of the piece read, where a mean of squares is >= 0"
  fi
  expect_error "$kind: checkpoint verify" 1 "$want" checkpoint verify "$tmp/run"
  expect_error "$kind: train --resume" 1 "$want" train --config "$tmp/in/tiny.yaml" \
    --out "$tmp/run" --resume "$tmp/run" --set train.max_steps=3
  restore
done
# The checksum table covers every file read; the index's metadata is what format 2 writes.
poke "$step/model.safetensors.index.json" nosum
checkpoint_case "no checksum for config.yaml" \
  "$step/model.safetensors.index.json: \"files\" has no checksum for config.yaml"
poke "$step/model.safetensors.index.json" nometadata
checkpoint_case "an index without metadata" "$step/model.safetensors.index.json: no \"metadata\" object"
poke "$step/model.safetensors.index.json" bogusformat
checkpoint_case "an index of another format" "metadata.format is \"bogus\", not \"switchyard-checkpoint\""
poke "$step/model.safetensors.index.json" version0
checkpoint_case "format_version 0" "metadata.format_version is 0, not a format version (1 to 2)"
# Checksums in upper case (written in lower case): read.
poke "$step/model.safetensors.index.json" uppercrc
"$bin" checkpoint verify "$tmp/run" >"$tmp/out" 2>"$tmp/err" || fail "upper-case checksums: $(cat "$tmp/err")"
restore
# A FIFO (or any file that is not a regular one) in place of a file of the checkpoint: refused
# at once by every reader, never a hang (expect_error's timeout would end one).
for f in trainer_state.json config.yaml model.safetensors optimizer.safetensors model.safetensors.index.json; do
  rm "$step/$f" && mkfifo "$step/$f"
  checkpoint_case "a FIFO as $f" "$step/$f: is a FIFO (named pipe), not a regular file"
done
rm "$tmp/run/latest" && mkfifo "$tmp/run/latest"
checkpoint_case "a FIFO as latest" "$tmp/run/latest: is a FIFO (named pipe), not a regular file"
rm "$tmp/run/latest"
# latest's bytes echoed escaped and cut to 80; what a valid one holds said.
printf 'step-00000002\nstep-00000003\n\033[31mred\n' >"$tmp/run/latest"
expect_error "latest of several lines" 1 \
  "$tmp/run/latest: expected one line naming the step directory saved last, like step-00000100, got 'step-00000002\nstep-00000003\n\x1b[31mred'" \
  checkpoint verify "$tmp/run"
LC_ALL=C grep -q '[[:cntrl:]]' <(tr -d '\n' <"$tmp/err") && fail "latest of several lines: a raw control byte printed"
head -c 300 /dev/zero | tr '\0' a >"$tmp/run/latest"
expect_error "a long latest" 1 "got 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'... (300 bytes)" \
  checkpoint verify "$tmp/run"
head -c 10000000 /dev/zero | tr '\0' a >"$tmp/run/latest"
expect_error "a 10 MB latest" 1 "$tmp/run/latest: 10000000 bytes; expected one line naming" checkpoint verify "$tmp/run"
[[ $(wc -c <"$tmp/err") -lt 300 ]] || fail "a 10 MB latest: a $(wc -c <"$tmp/err")-byte error"
echo step-00000002 >"$tmp/run/latest"
rm -r "$step" && echo x >"$step"
checkpoint_case "a step directory that is a file" "$tmp/run/latest names step-00000002, which is not a directory"
# route's --file: a regular file of at most 1 MiB.
expect_error "route: a FIFO as --file" 1 "$tmp/fifo: is a FIFO (named pipe), not a regular file" \
  route --checkpoint "$tmp/run" --file "$tmp/fifo"
expect_error "route: /dev/zero as --file" 1 "/dev/zero: is a character device, not a regular file" \
  route --checkpoint "$tmp/run" --file /dev/zero
head -c 1048577 /dev/zero | tr '\0' a >"$tmp/big.txt"
expect_error "route: a --file over 1 MiB" 2 "--file $tmp/big.txt: 1048577 bytes, more than the 1 MiB route takes" \
  route --checkpoint "$tmp/run" --file "$tmp/big.txt"
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

# ---- export and import (the Hugging Face bridge) -----------------------------------------
expect_error "export: an empty OUT" 2 "OUT is empty; it needs a path" export --format hf-mixtral "$tmp/run" ""
expect_error "export: an empty CHECKPOINT" 2 "CHECKPOINT is empty; it needs a path" \
  export --format hf-mixtral "" "$tmp/hf"
expect_error "import: an empty DIR" 2 "DIR is empty; it needs a path" import --format hf-mixtral "" "$tmp/hf"
cat >"$tmp/in/mix.yaml" <<EOF
model: {vocab_size: 128, seq_len: 8, d_model: 16, n_layers: 1, n_heads: 2, norm: rmsnorm, position: rope, activation: swiglu, bias: false}
moe: {num_experts: 2, layer_freq: 1, top_k: 2, d_expert: 8, activation: swiglu, normalize_gates: true, capacity_factor: 0, eval_capacity_factor: 0}
train: {max_steps: 1, micro_batch_size: 2, eval_every: 0, eval_batches: 1}
data: {dir: $tmp/data}
EOF
"$bin" train --config "$tmp/in/mix.yaml" --out "$tmp/mix" >"$tmp/train.out" 2>&1 ||
  { cat "$tmp/train.out"; fail "train the Mixtral-style model"; exit 1; }
# An export that fails part way (a file-size limit: EFBIG, as a full disk's ENOSPC) leaves
# neither OUT nor its temporary, and names OUT; a retry then works.
(ulimit -f 4; exec "$bin" export --format hf-mixtral "$tmp/mix" "$tmp/hf") >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] || fail "export past a file-size limit: exit $rc, $(cat "$tmp/err")"
grep -qF "switchyard export: error: $tmp/hf/model.safetensors: write failed (File too large)" "$tmp/err" ||
  fail "export past a file-size limit: $(cat "$tmp/err")"
ls -d "$tmp"/hf* >/dev/null 2>&1 && fail "export past a file-size limit left $(ls -d "$tmp"/hf*)"
"$bin" export --format hf-mixtral "$tmp/mix" "$tmp/hf" >"$tmp/out" 2>"$tmp/err" ||
  fail "export after a failed one: $(cat "$tmp/err")"
if [[ -n $mpirun_sh ]]; then
  bash "$mpirun_sh" 2 "$bin" export --format hf-mixtral "$tmp/mix" "$tmp/hf2" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 2 && $(grep -c "^switchyard export: error: runs on one rank" "$tmp/err") -eq 1 ]] ||
    fail "export under mpirun -np 2: exit $rc, $(cat "$tmp/err")"
  [[ ! -e $tmp/hf2 ]] || fail "export under mpirun -np 2 wrote its output"
fi
# hf.py SRC DST KIND: a copy of the export SRC in DST, damaged: a NaN in the first tensor, or
# sharded in two files with an index whose weight_map (or total_size) disagrees with them, or
# its config.json or index cut in half.
# Prints the name of the tensor damaged or moved.
cat >"$tmp/hf.py" <<'EOF'
import json, math, os, shutil, struct, sys
src, dst, kind = sys.argv[1:]
os.makedirs(dst)
shutil.copy(os.path.join(src, "config.json"), dst)
raw = open(os.path.join(src, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
header.pop("__metadata__", None)
names = sorted(header)
if kind == "config":  # config.json cut in half
    text = open(os.path.join(src, "config.json")).read()
    open(os.path.join(dst, "config.json"), "w").write(text[:len(text) // 2])
    shutil.copy(os.path.join(src, "model.safetensors"), dst)
    print("config.json")
    sys.exit()
if kind == "nan":
    first = min(names, key=lambda k: header[k]["data_offsets"][0])
    at = header[first]["data_offsets"][0]
    data = data[:at] + struct.pack("<f", math.nan) + data[at + 4:]
    open(os.path.join(dst, "model.safetensors"), "wb").write(raw[:8 + n] + data)
    print(first)
    sys.exit()
shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
          "model-00002-of-00002.safetensors": names[len(names) // 2:]}
weight_map, total = {}, 0
for file, part in shards.items():
    head, body = {}, b""
    for k in part:
        b, e = header[k]["data_offsets"]
        head[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"],
                   "data_offsets": [len(body), len(body) + e - b]}
        body += data[b:e]
        weight_map[k] = file
        total += e - b
    text = json.dumps(head).encode()
    open(os.path.join(dst, file), "wb").write(struct.pack("<Q", len(text)) + text + body)
moved = names[0]  # in the first shard
if kind == "wrongshard": weight_map[moved] = "model-00002-of-00002.safetensors"
if kind == "missing": del weight_map[moved]
if kind == "extra": weight_map["model.bogus"] = "model-00001-of-00002.safetensors"
if kind == "number": weight_map[moved] = 1
if kind == "total": total += 4
text = json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
if kind == "cutindex": text = text[:len(text) // 2]
open(os.path.join(dst, "model.safetensors.index.json"), "w").write(text)
print(moved)
EOF
hf_case() {  # KIND WANT...: the import of hf.py's KIND, exit 1 with WANT (%s: the tensor's name)
  local kind="$1" want="$2" name
  name=$($python "$tmp/hf.py" "$tmp/hf" "$tmp/in/hf-$kind" "$kind") || { fail "hf.py $kind"; return; }
  expect_error "import: $kind" 1 "${want//%s/$name}" import --format hf-mixtral "$tmp/in/hf-$kind" "$tmp/imported"
  [[ ! -e $tmp/imported ]] || fail "import: $kind: wrote its output"
}
index=model.safetensors.index.json
shard1=model-00001-of-00002.safetensors
hf_case nan "$tmp/in/hf-nan/model.safetensors: tensor '%s' holds a non-finite value (nan at flat index 0 of ("
hf_case wrongshard "$tmp/in/hf-wrongshard/$shard1: holds '%s', which $tmp/in/hf-wrongshard/$index's weight_map puts in model-00002-of-00002.safetensors"
hf_case missing "$tmp/in/hf-missing/$shard1: holds '%s', which $tmp/in/hf-missing/$index's weight_map does not list"
hf_case extra "$tmp/in/hf-extra/$index: weight_map puts 'model.bogus' in $shard1, which does not hold it"
hf_case number "$tmp/in/hf-number/$index: weight_map maps '%s' to 1, not the name of a file beside it"
hf_case total "$tmp/in/hf-total/$index: metadata.total_size is "
hf_case config "$tmp/in/hf-config/config.json: not JSON (line "
hf_case cutindex "$tmp/in/hf-cutindex/$index: not JSON (line 1, column "
$python "$tmp/hf.py" "$tmp/hf" "$tmp/in/hf-sharded" good >/dev/null
"$bin" import --format hf-mixtral "$tmp/in/hf-sharded" "$tmp/imported" >"$tmp/out" 2>"$tmp/err" ||
  fail "import of a sound sharded directory: $(cat "$tmp/err")"
echo "--- export and import ($SECONDS s)"

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
printf '# only a comment\n' >"$tmp/in/comment.yaml"
expect_error "a config of only a comment" 2 "$tmp/in/comment.yaml: the config file is empty (no keys)" \
  train --config "$tmp/in/comment.yaml" --out "$tmp/run"
printf ',\n' >"$tmp/in/comma.yaml"
expect_error "a config that is a comma" 2 "$tmp/in/comma.yaml:1: YAML syntax error: unexpected ',' where a value starts" \
  train --config "$tmp/in/comma.yaml" --out "$tmp/run"
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
