#!/usr/bin/env bash
# scripts/make_code_corpus.py on a small source tree made here (no apt, no network): each
# typed file becomes its label's documents, whose parts put together are the file byte for
# byte, each part within --chunk-kb; links, NUL bytes, invalid UTF-8, files over
# --max-file-kb and empty files are left out and counted, untyped and hidden ones left out; prep's
# index holds exactly these labels and documents with tokens; a second run (other threads)
# gives the same JSONL, shards and tokenizer; --cap keeps the files with the smallest
# sha256(path) that fit; --max-mb bounds the total; bad arguments are one line.
# Usage: code_corpus_test.sh path/to/switchyard path/to/scripts/make_code_corpus.py
set -u
source "$(dirname "$0")/cli_test_lib.sh" "$1"
script="$2"
src="$tmp/src"

# The tree: text generated from a seed, so the files are the same on every run.
python3 - "$src" <<'EOF' || { echo "FAIL: fixture"; exit 1; }
import os, random, sys
root = sys.argv[1]
rng = random.Random(7)
words = ["int", "return", "struct", "static", "void", "if", "for", "config", "bool", "the",
         "device", "driver", "lock", "unsigned", "long", "default", "help", "select"]
def text(lines):
    return "".join(" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) + ";\n"
                   for _ in range(lines))
files = {
    "Makefile": text(5), "Kconfig": text(8), "kernel/Kbuild": text(3),
    "kernel/Kconfig.debug": text(6), "scripts/rules.mk": text(4),
    "arch/x/boot/head.S": text(20), "arch/x/boot/board.dts": text(12),
    "arch/x/boot/soc.dtsi": text(9), "include/linux/list.h": text(30),
    "include/linux/sched.h": text(25), "Documentation/intro.rst": text(15),
    "Documentation/notes.txt": text(10), "scripts/check.sh": text(7),
    "scripts/tool.py": text(11), "kernel/big.c": text(150),
    # One 3000-byte line of 3-byte characters: cut inside the line, at character boundaries.
    "lib/wide.c": "\u20ac" * 1000 + "\n" + text(3),
}
for i in range(6):
    files["kernel/f%d.c" % i] = text(10 + 10 * i)
bad = {"lib/blob.c": b"int x;\0\n", "lib/latin1.c": b"caf\xe9;\n", "include/huge.h":
       text(1000).encode(), "include/empty.h": b"", "tools/data.json": b"{}\n",
       "lib/.hidden.c": b"int h;\n", ".git/x.c": b"int g;\n"}
for rel, body in list(files.items()) + list(bad.items()):
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(body.encode() if isinstance(body, str) else body)
os.symlink("f0.c", os.path.join(root, "kernel/link.c"))
EOF

run_script() {  # run_script NAME ARGS...: exit 0 or a failure with the tail of the output
  local name="$1"; shift
  python3 "$script" --source "$src" --bin "$bin" --chunk-kb 1 --max-file-kb 16 "$@" \
    >"$tmp/$name.out" 2>&1 || { fail "$name: $(tail -3 "$tmp/$name.out")"; return 1; }
}
run_script first --out "$tmp/a/code" --vocab 400 --threads 1
run_script second --out "$tmp/b/code" --vocab 400 --threads 2

check=$(python3 - "$src" "$tmp/a" <<'EOF' 2>&1
import glob, json, os, sys
src, out = sys.argv[1], sys.argv[2]
labels = {"Makefile": "make", "Kconfig": "kconfig", "kernel/Kbuild": "make",
          "kernel/Kconfig.debug": "kconfig", "scripts/rules.mk": "make",
          "arch/x/boot/head.S": "asm", "arch/x/boot/board.dts": "dts",
          "arch/x/boot/soc.dtsi": "dts", "include/linux/list.h": "h",
          "include/linux/sched.h": "h", "Documentation/intro.rst": "doc",
          "Documentation/notes.txt": "doc", "scripts/check.sh": "sh", "scripts/tool.py": "py",
          "kernel/big.c": "c", "lib/wide.c": "c"}
labels.update({"kernel/f%d.c" % i: "c" for i in range(6)})
errs, docs, keys = [], [], set()
for shard in sorted(glob.glob(out + "/code-jsonl/code-*.jsonl")):
    for line in open(shard, encoding="utf-8"):
        d = json.loads(line)
        keys.add(tuple(d))
        docs.append(d)
if keys != {("text", "type", "path", "part")}: errs.append("keys %r" % keys)
if [(d["path"], d["part"]) for d in docs] != sorted((d["path"], d["part"]) for d in docs):
    errs.append("documents not in path order")
got = {}
for d in docs:
    if len(d["text"].encode()) > 1024: errs.append("%s part %d over 1 KiB" % (d["path"], d["part"]))
    if labels.get(d["path"]) != d["type"]: errs.append("%s labelled %s" % (d["path"], d["type"]))
    got.setdefault(d["path"], []).append(d["text"])
if set(got) != set(labels): errs.append("paths %r" % sorted(set(got) ^ set(labels)))
for path, texts in got.items():
    if "".join(texts).encode() != open(os.path.join(src, path), "rb").read():
        errs.append("%s: the parts are not the file" % path)
if len(got.get("kernel/big.c", [])) < 3 or len(got.get("lib/wide.c", [])) < 3:
    errs.append("big files not cut into parts")
manifest = json.load(open(out + "/code-jsonl/manifest.json"))
if manifest["skipped"] != {"symlink": 1, "too_large": 1, "nul_byte": 1, "not_utf8": 1, "empty": 1}:
    errs.append("skipped %r" % manifest["skipped"])
per_label = {}
for d in docs: per_label[d["type"]] = per_label.get(d["type"], 0) + 1
if {k: v["documents"] for k, v in manifest["labels"].items()} != per_label:
    errs.append("manifest labels %r" % manifest["labels"])
index = json.load(open(out + "/code/index.json"))
if index["labels"] != sorted(set(labels.values())): errs.append("index labels %r" % index["labels"])
for label, t in index["totals"].items():
    if t["train"]["documents"] + t["val"]["documents"] != per_label.get(label):
        errs.append("%s: %r documents in the index, %r in the JSONL" % (label, t, per_label.get(label)))
    if not (t["train"]["tokens"] + t["val"]["tokens"] > 0 and t["train"]["tokens"] > 0):
        errs.append("%s: tokens %r" % (label, t))
if manifest["prep"]["totals"] != index["totals"]: errs.append("manifest's prep totals")
print("; ".join(errs) if errs else "ok")
EOF
)
[[ "$check" == ok ]] || fail "outputs: $check"

# The second run (2 threads, another folder) writes the same bytes.
for f in code-jsonl/code-00000.jsonl code/tokenizer.model code/train-00000.bin code/val-00000.bin; do
  cmp -s "$tmp/a/$f" "$tmp/b/$f" || fail "second run: $f differs"
done
(cd "$tmp/a" && ls code-jsonl code) >"$tmp/ls_a" 2>&1
(cd "$tmp/b" && ls code-jsonl code) >"$tmp/ls_b" 2>&1
cmp -s "$tmp/ls_a" "$tmp/ls_b" || fail "second run: other files $(diff "$tmp/ls_a" "$tmp/ls_b")"

# --cap c=0.003 (3000 bytes): the c files in sha256(path) order while they fit.
run_script cap --out "$tmp/c/code" --cap c=0.003 --no-prep
[[ ! -e "$tmp/c/code" ]] || fail "--no-prep ran prep"
check=$(python3 - "$src" "$tmp/c/code-jsonl" <<'EOF' 2>&1
import glob, hashlib, json, os, sys
src, out = sys.argv[1], sys.argv[2]
c_files = sorted(["kernel/big.c", "lib/wide.c"] + ["kernel/f%d.c" % i for i in range(6)],
                 key=lambda p: hashlib.sha256(p.encode()).digest())
want, total = set(), 0
for p in c_files:
    size = os.path.getsize(os.path.join(src, p))
    if total + size > 3000: break
    want.add(p); total += size
got = {json.loads(l)["path"] for s in glob.glob(out + "/code-*.jsonl") for l in open(s)
       if json.loads(l)["type"] == "c"}
others = {json.loads(l)["type"] for s in glob.glob(out + "/code-*.jsonl") for l in open(s)}
errs = []
if not 0 < len(want) < len(c_files) - 2: errs.append("the cap keeps %d of the c files" % len(want))
if got != want: errs.append("c files %r, want %r" % (sorted(got), sorted(want)))
if len(others) != 9: errs.append("labels %r" % others)
print("; ".join(errs) if errs else "ok")
EOF
)
[[ "$check" == ok ]] || fail "--cap: $check"

# --max-mb 0.004: at most 4000 bytes in all, in proportion (some labels may lose every file).
run_script maxmb --out "$tmp/d/code" --max-mb 0.004 --no-prep
total=$(python3 -c "import json; m = json.load(open('$tmp/d/code-jsonl/manifest.json'))
print(sum(v['bytes'] for v in m['labels'].values()))")
[[ $total -gt 0 && $total -le 4000 ]] || fail "--max-mb 0.004 kept $total bytes"

# An existing output without --force is refused; bad arguments are one line, exit 2.
python3 "$script" --source "$src" --bin "$bin" --out "$tmp/a/code" >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] && grep -q -- "--force" "$tmp/err" ||
  fail "existing output: exit $rc, $(cat "$tmp/err")"
for bad in "--cap rust=3" "--cap c=x" "--vocab 0" "--chunk-kb 32" "--source $tmp/none" "--bogus"; do
  python3 "$script" $bad --out "$tmp/e/code" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [[ $rc -eq 2 && $(wc -l <"$tmp/err") -eq 1 && ! -e "$tmp/e" ]] ||
    fail "$bad: exit $rc, stderr $(cat "$tmp/err")"
done
python3 "$script" --source "$src" --bin "$tmp/none" --out "$tmp/e/code" >"$tmp/out" 2>"$tmp/err"
rc=$?
[[ $rc -eq 1 && $(wc -l <"$tmp/err") -eq 1 ]] && grep -q -- "--bin" "$tmp/err" ||
  fail "--bin missing: exit $rc, $(cat "$tmp/err")"

[[ $failures -eq 0 ]] && echo "code corpus: ok"
exit $((failures > 0))
