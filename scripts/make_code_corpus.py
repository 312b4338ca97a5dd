#!/usr/bin/env python3
"""Builds the code corpus (docs/experiments/corpus.md): source files and documentation from
Debian packages as labelled JSONL, then `switchyard prep --label-key type`.

usage: make_code_corpus.py [--out DIR] [--vocab N] [--source DIR] [--max-mb N] [--bin PATH]
                           [--jsonl-dir DIR] [--cache DIR] [--cap LABEL=MB ...]
                           [--chunk-kb N] [--max-file-kb N] [--shard-mb N] [--threads N]
                           [--kernel-version V] [--python-version V] [--no-prep] [--force]

Inputs (without --source): the Linux kernel source of Debian's `linux-source-6.1`
(/usr/src/linux-source-6.1.tar.xz, installed with apt-get when missing, extracted once into
the cache), and Python 3.11's standard library, test suite and reStructuredText docs
(`libpython3.11-minimal`, `libpython3.11-stdlib`, `libpython3.11-testsuite`,
`python3.11-doc`, fetched with `apt-get download` into the cache and unpacked there; the
system's Python is not touched). With --source DIR only DIR is read: no apt, no network.

A file's label is its type, from its name (file_type): c, h, asm, dts, kconfig, make, sh,
py, doc. Files of other types and names starting with "." are not read; symbolic links,
files over --max-file-kb (generated register maps and tables), empty files and files holding
a NUL byte or invalid UTF-8 are skipped and counted in the manifest. A label over its byte
cap (--cap; c and h have defaults) keeps its files in increasing sha256(path) order while
they fit, a sample spread over the whole tree that depends only on the paths; --max-mb then
scales every label down in proportion. Each kept file is one
document, or several consecutive parts of at most --chunk-kb (cut after a line end) when it
is larger. Documents are written in sorted path order as JSONL lines
{"text", "type", "path", "part"} to shards code-NNNNN.jsonl of at most --shard-mb in
--jsonl-dir (default OUT-jsonl), with manifest.json (package versions, counts, sha256).
The same inputs and flags give the same bytes.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

KERNEL_PACKAGE = "linux-source-6.1"
KERNEL_TARBALL = "/usr/src/linux-source-6.1.tar.xz"
PYTHON_PACKAGES = ["libpython3.11-minimal", "libpython3.11-stdlib", "libpython3.11-testsuite",
                   "python3.11-doc"]
# Per-label byte caps in MB (10^6 bytes) unless --cap overrides them; other labels: all.
DEFAULT_CAPS_MB = {"c": 100, "h": 50}
# SentencePiece 0.1.97's BPE trainer (Debian 12) crashes (SIGSEGV in Trainer::ComputeFreq) on
# a training text holding a run of more than 32767 characters without a space (it shifts a
# character's position 16 bits left in a signed int). Parts of at most 31 KiB cannot hold one.
MAX_CHUNK_KB = 31
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LABELS = ["asm", "c", "doc", "dts", "h", "kconfig", "make", "py", "sh"]


def file_type(name):
    """The label of a file named `name` (no folder), or None for a type the corpus skips."""
    if name.startswith("Kconfig"):
        return "kconfig"
    if name.startswith("Makefile") or name == "Kbuild" or name.endswith(".mk"):
        return "make"
    ext = name.rsplit(".", 1)[1] if "." in name else ""
    return {"c": "c", "h": "h", "S": "asm", "s": "asm", "asm": "asm", "dts": "dts",
            "dtsi": "dts", "rst": "doc", "txt": "doc", "py": "py", "sh": "sh"}.get(ext)


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints the usage otherwise)
        print("make_code_corpus: error: %s" % message, file=sys.stderr)
        sys.exit(2)


def parse_args(argv):
    p = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(REPO, "data", "code"),
                   help="prep's output folder (default data/code in the repository)")
    p.add_argument("--vocab", type=int, default=8192, help="BPE vocabulary size (default 8192)")
    p.add_argument("--source", help="read this extracted tree instead of the Debian packages")
    p.add_argument("--max-mb", type=float, default=0,
                   help="at most this many MB of text in all, labels scaled in proportion")
    p.add_argument("--bin", help="the switchyard binary (default build/bin/switchyard in the "
                   "repository, else switchyard on the PATH)")
    p.add_argument("--jsonl-dir", help="where the JSONL shards go (default OUT-jsonl)")
    p.add_argument("--cache", help="where packages are unpacked "
                   "(default $XDG_CACHE_HOME or ~/.cache, then switchyard/code-corpus)")
    p.add_argument("--cap", action="append", default=[], metavar="LABEL=MB",
                   help="byte cap of a label in MB; 0 removes a cap (defaults: c=100, h=50)")
    p.add_argument("--chunk-kb", type=int, default=MAX_CHUNK_KB,
                   help="a larger file is cut into parts of at most this many KiB (default and "
                   "most %d)" % MAX_CHUNK_KB)
    p.add_argument("--max-file-kb", type=int, default=1024,
                   help="larger files are skipped as generated (default 1024)")
    p.add_argument("--shard-mb", type=int, default=64, help="MiB per JSONL shard (default 64)")
    p.add_argument("--threads", type=int, default=0, help="prep's encoding threads (0: all)")
    p.add_argument("--kernel-version", help="install this version of %s" % KERNEL_PACKAGE)
    p.add_argument("--python-version", help="download this version of the Python packages")
    p.add_argument("--no-prep", action="store_true", help="write the JSONL only")
    p.add_argument("--force", action="store_true", help="replace earlier outputs")
    args = p.parse_args(argv)
    caps = dict(DEFAULT_CAPS_MB)
    for item in args.cap:
        label, _, mb = item.partition("=")
        if label not in LABELS:
            p.error("--cap %s: unknown label %r (labels: %s)" % (item, label, ", ".join(LABELS)))
        try:
            caps[label] = float(mb)
        except ValueError:
            p.error("--cap %s: %r is not a number of MB" % (item, mb))
        if caps[label] < 0:
            p.error("--cap %s: a cap is >= 0" % item)
    args.caps = {k: int(v * 1e6) for k, v in caps.items() if v > 0}
    for name in ("vocab", "chunk_kb", "max_file_kb", "shard_mb"):
        if getattr(args, name) <= 0:
            p.error("--%s %d: must be positive" % (name.replace("_", "-"), getattr(args, name)))
    if args.chunk_kb > MAX_CHUNK_KB:
        p.error("--chunk-kb %d: at most %d (switchyard prep's SentencePiece trainer crashes on "
                "a run of more than 32767 characters without a space)" % (args.chunk_kb,
                                                                          MAX_CHUNK_KB))
    if args.max_mb < 0 or args.threads < 0:
        p.error("--max-mb and --threads are >= 0")
    if args.source and not os.path.isdir(args.source):
        p.error("--source %s: not a folder" % args.source)
    return args


def log(message):
    print("make_code_corpus: %s" % message, flush=True)


def run(cmd, cwd=None):
    """Runs cmd; a failure ends the script with one line naming the command."""
    done = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    if done.returncode != 0:
        tail = done.stdout.strip().splitlines()[-1:] or ["no output"]
        raise UsageError("%s failed (exit %d): %s" % (" ".join(cmd), done.returncode, tail[0]))
    return done.stdout


def installed_version(package):
    out = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", package],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout
    return out.split()[-1] if out.startswith("install ok installed") else None


def apt_prefix():
    return [] if os.geteuid() == 0 else ["sudo"]


def kernel_tree(cache, want):
    """Installs linux-source-6.1 when needed and extracts it once; returns (root, version)."""
    version = installed_version(KERNEL_PACKAGE)
    if version is None or (want and version != want):
        log("installing %s with apt-get" % KERNEL_PACKAGE)
        run(apt_prefix() + ["apt-get", "update", "-qq"])
        run(apt_prefix() + ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y",
                            "-q", KERNEL_PACKAGE + ("=" + want if want else "")])
        version = installed_version(KERNEL_PACKAGE)
    dest = os.path.join(cache, "%s_%s" % (KERNEL_PACKAGE, version))
    if not os.path.exists(os.path.join(dest, ".complete")):
        log("extracting %s into %s" % (KERNEL_TARBALL, dest))
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        run(["tar", "-xJf", KERNEL_TARBALL, "-C", dest])
        open(os.path.join(dest, ".complete"), "w").close()
    return os.path.join(dest, KERNEL_PACKAGE), version


def candidate_version(package):
    """The version apt would fetch now (its package lists), or None."""
    out = subprocess.run(["apt-cache", "policy", package], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            return None if version == "(none)" else version
    return None


def python_trees(cache, want):
    """Downloads and unpacks the Python packages (one source package, one version) into
    cache/python3.11_VERSION; returns ([(root, prefix, labels)], {package: version})."""
    version = want or candidate_version(PYTHON_PACKAGES[0])
    if version is None:
        run(apt_prefix() + ["apt-get", "update", "-qq"])
        version = candidate_version(PYTHON_PACKAGES[0])
        if version is None:
            raise UsageError("apt knows no %s (is this Debian 12?)" % PYTHON_PACKAGES[0])
    dest = os.path.join(cache, "python3.11_%s" % version)
    marker = os.path.join(dest, ".complete")
    if not os.path.exists(marker):
        log("downloading %s %s with apt-get download" % (" ".join(PYTHON_PACKAGES), version))
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(os.path.join(dest, "debs"))
        run(["apt-get", "download", "-q"] + ["%s=%s" % (p, version) for p in PYTHON_PACKAGES],
            cwd=os.path.join(dest, "debs"))
        versions = {}
        for deb in sorted(os.listdir(os.path.join(dest, "debs"))):
            path = os.path.join(dest, "debs", deb)
            package = run(["dpkg-deb", "-f", path, "Package"]).strip()
            versions[package] = run(["dpkg-deb", "-f", path, "Version"]).strip()
            run(["dpkg-deb", "-x", path, os.path.join(dest, "root")])
        with open(marker, "w") as f:
            json.dump(versions, f, sort_keys=True)
    with open(marker) as f:
        versions = json.load(f)
    root = os.path.join(dest, "root")
    return [(os.path.join(root, "usr/lib/python3.11"), "python3.11/lib", {"py"}),
            (os.path.join(root, "usr/share/doc/python3.11/html/_sources"), "python3.11/doc",
             {"doc"})], versions


def candidates(root, prefix, labels):
    """(path in the corpus, absolute path, label) of every typed regular file, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")
                       and not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            label = file_type(name)
            full = os.path.join(dirpath, name)
            if name.startswith(".") or label is None or label not in labels:
                continue
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            found.append((prefix + "/" + rel if prefix else rel, full, label))
    return sorted(found)


def scan(sources, max_file_bytes):
    """Reads every candidate once; returns the kept files and the skip counts by reason."""
    kept, skipped = [], {"symlink": 0, "too_large": 0, "nul_byte": 0, "not_utf8": 0,
                         "empty": 0}
    for root, prefix, labels in sources:
        for rel, full, label in candidates(root, prefix, labels):
            if os.path.islink(full) or not os.path.isfile(full):
                skipped["symlink"] += 1
                continue
            size = os.path.getsize(full)
            if size > max_file_bytes:
                skipped["too_large"] += 1
                continue
            with open(full, "rb") as f:
                data = f.read()
            if not data:
                skipped["empty"] += 1
            elif b"\0" in data:
                skipped["nul_byte"] += 1
            elif not is_utf8(data):
                skipped["not_utf8"] += 1
            else:
                kept.append((rel, full, label, len(data)))
    return sorted(kept), skipped


def is_utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def select(files, caps, max_bytes):
    """Applies the label caps, then --max-mb in proportion; returns the kept files, sorted."""
    def capped(files, caps):
        out = []
        for label in LABELS:
            mine = [f for f in files if f[2] == label]
            if label in caps:
                mine.sort(key=lambda f: hashlib.sha256(f[0].encode()).digest())
                total, take = 0, []
                for f in mine:
                    if total + f[3] > caps[label]:
                        break
                    total += f[3]
                    take.append(f)
                mine = take
            out += mine
        return sorted(out)
    kept = capped(files, caps)
    total = sum(f[3] for f in kept)
    if max_bytes and total > max_bytes:
        scale = max_bytes / total
        caps = {label: int(sum(f[3] for f in kept if f[2] == label) * scale) for label in LABELS}
        kept = capped(kept, caps)
    return kept


def parts(text, limit):
    """Cuts text into consecutive parts of at most `limit` UTF-8 bytes, after a line end
    where there is one (a longer line is cut at a character boundary)."""
    data = text.encode("utf-8")
    out, start = [], 0
    while len(data) - start > limit:
        cut = data.rfind(b"\n", start, start + limit) + 1
        if cut <= start:
            cut = start + limit
            while data[cut] & 0xC0 == 0x80:  # not inside a multi-byte character
                cut -= 1
        out.append(data[start:cut].decode("utf-8"))
        start = cut
    out.append(data[start:].decode("utf-8"))
    return out


def write_jsonl(files, dest, chunk_bytes, shard_bytes):
    """Writes the documents into dest/code-NNNNN.jsonl; returns the per-label counts and the
    shards' names. A shard is closed before a line that would take it past shard_bytes."""
    counts = {label: {"files": 0, "documents": 0, "bytes": 0} for label in LABELS}
    shards, out, size = [], None, 0
    for rel, full, label, _ in files:
        with open(full, "rb") as f:
            text = f.read().decode("utf-8")
        pieces = parts(text, chunk_bytes)
        counts[label]["files"] += 1
        counts[label]["documents"] += len(pieces)
        counts[label]["bytes"] += len(text.encode("utf-8"))
        for k, piece in enumerate(pieces):
            line = (json.dumps({"text": piece, "type": label, "path": rel, "part": k},
                               ensure_ascii=False) + "\n").encode("utf-8")
            if out is None or (size and size + len(line) > shard_bytes):
                if out:
                    out.close()
                shards.append("code-%05d.jsonl" % len(shards))
                out, size = open(os.path.join(dest, shards[-1]), "wb"), 0
            out.write(line)
            size += len(line)
    if out:
        out.close()
    return {k: v for k, v in counts.items() if v["files"]}, shards


def sha256_of(paths):
    h = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def default_bin():
    built = os.path.join(REPO, "build", "bin", "switchyard")
    return built if os.path.exists(built) else shutil.which("switchyard")


def replaceable(path, force, what):
    """Refuses an existing output unless --force; removes it with --force."""
    if os.path.exists(path):
        if not force:
            raise UsageError("%s %s exists (pass --force to replace it)" % (what, path))
        if what == "--jsonl-dir" and not os.path.exists(os.path.join(path, "manifest.json")):
            raise UsageError("--jsonl-dir %s holds no manifest.json: not replaced" % path)


def prep(args, jsonl_dir, shards):
    """Runs switchyard prep on the shards; returns its index.json totals and vocabulary."""
    cmd = [args.bin, "prep", "--out", args.out, "--vocab", str(args.vocab), "--label-key",
           "type", "--format", "jsonl", "--strict", "--threads", str(args.threads)]
    if args.force:
        cmd.append("--force")
    cmd += [os.path.join(jsonl_dir, s) for s in shards]
    log(" ".join(cmd))
    if subprocess.run(cmd).returncode != 0:
        raise UsageError("switchyard prep failed (its message is above)")
    with open(os.path.join(args.out, "index.json")) as f:
        index = json.load(f)
    hashes = {name: sha256_of([os.path.join(args.out, name)]) for name in
              ["tokenizer.model"] + [s["name"] for s in index["shards"]]}
    return {"vocab_size": index["vocab_size"], "totals": index["totals"], "sha256": hashes}


def build(args):
    started = time.time()
    args.bin = args.bin or default_bin()
    if not args.no_prep and (not args.bin or not os.access(args.bin, os.X_OK)):
        raise UsageError("--bin %s: no switchyard binary there (build it: bash scripts/setup.sh)"
                         % (args.bin or "build/bin/switchyard"))
    jsonl_dir = args.jsonl_dir or args.out.rstrip("/") + "-jsonl"
    replaceable(jsonl_dir, args.force, "--jsonl-dir")
    if not args.no_prep and os.path.exists(os.path.join(args.out, "index.json")):
        replaceable(args.out, args.force, "--out")
    packages = {}
    if args.source:
        sources = [(os.path.abspath(args.source), "", set(LABELS))]
    else:
        cache = args.cache or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                           os.path.expanduser("~/.cache"), "switchyard",
                                           "code-corpus")
        kernel, packages[KERNEL_PACKAGE] = kernel_tree(cache, args.kernel_version)
        python, versions = python_trees(cache, args.python_version)
        packages.update(versions)
        sources = [(kernel, "linux", set(LABELS))] + python
    files, skipped = scan(sources, args.max_file_kb * 1024)
    kept = select(files, args.caps, int(args.max_mb * 1e6))
    log("%d typed files readable (%.1f MB), %d kept (%.1f MB) in %.1f s" % (
        len(files), sum(f[3] for f in files) / 1e6, len(kept), sum(f[3] for f in kept) / 1e6,
        time.time() - started))
    tmp = jsonl_dir.rstrip("/") + ".tmp-%d" % os.getpid()
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    counts, shards = write_jsonl(kept, tmp, args.chunk_kb * 1024, args.shard_mb << 20)
    manifest = {"packages": packages, "source": args.source and os.path.abspath(args.source),
                "flags": {"caps_bytes": args.caps, "max_bytes": int(args.max_mb * 1e6),
                          "chunk_bytes": args.chunk_kb * 1024,
                          "max_file_bytes": args.max_file_kb * 1024},
                "labels": counts, "skipped": skipped, "shards": shards,
                "sha256": {s: sha256_of([os.path.join(tmp, s)]) for s in shards},
                "sha256_all": sha256_of([os.path.join(tmp, s) for s in shards])}
    with open(os.path.join(tmp, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    shutil.rmtree(jsonl_dir, ignore_errors=True)
    os.rename(tmp, jsonl_dir)
    log("wrote %d documents (%.1f MB) in %d shards to %s in %.1f s, sha256 %s" % (
        sum(c["documents"] for c in counts.values()),
        sum(c["bytes"] for c in counts.values()) / 1e6, len(shards), jsonl_dir,
        time.time() - started, manifest["sha256_all"]))
    if args.no_prep:
        return
    manifest["prep"] = prep(args, jsonl_dir, shards)
    manifest["prep"]["vocab_flag"] = args.vocab
    with open(os.path.join(jsonl_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    log("done in %.1f s: %s, %s/manifest.json" % (time.time() - started, args.out, jsonl_dir))


def main(argv):
    args = parse_args(argv)
    try:
        build(args)
    except UsageError as e:
        print("make_code_corpus: error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
