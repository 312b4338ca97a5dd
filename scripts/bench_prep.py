#!/usr/bin/env python3
"""prep's throughput beside Debian's spm_encode, and prep's peak memory (scripts/bench_prep.sh).

Throughput, on a generated corpus of --throughput-size bytes (scripts/make_corpus.py):
  prep      `switchyard prep --tokenizer MODEL --threads N` (read, encode, write the shards)
  spm       N `spm_encode --model MODEL --output_format=id` processes at once, each on one
            1/N slice of the same file (cut at line boundaries), output discarded; spm_encode
            encodes line by line, prep whole documents (their "\n" included)
MB/s per core = corpus MB / wall seconds / N; both use the same model (trained once by prep
on its default sample) and the same file.

Memory: peak resident set (wait4's ru_maxrss) of a full `switchyard prep` (the tokenizer
trained on the default --tokenizer-sample-bytes, then encoding on N threads) for each of
--sizes, beside `switchyard prep --help` (the binary's start-up footprint).

Prints one table per part and writes --json. Timings are wall-clock on whatever machine it
runs on; on a shared machine they are indicative only.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def run(args, stdin=None, stdout=subprocess.DEVNULL):
    """Runs args; returns (wall seconds, peak RSS bytes); raises on failure."""
    start = time.monotonic()
    proc = subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench_prep: {' '.join(args)} failed: {err.decode()[-2000:]}")
    return seconds, usage.ru_maxrss * 1024


def make_corpus(make, path, size):
    if not os.path.exists(path):
        subprocess.run([sys.executable, make, path, str(size), "--seed", str(size)], check=True)
    return os.path.getsize(path)


def split(path, parts, tmp):
    """Cuts `path` into `parts` files of about equal size at line boundaries (after a
    blank line when one comes first); returns their paths."""
    size = os.path.getsize(path)
    out, paths = None, []
    with open(path, "rb") as f:
        for k in range(parts):
            name = f"{tmp}/slice-{k}.txt"
            paths.append(name)
            with open(name, "wb") as o:
                limit = size * (k + 1) // parts
                while f.tell() < limit or k == parts - 1:
                    line = f.readline()
                    if not line:
                        break
                    o.write(line)
                    if f.tell() >= limit and line == b"\n" and k < parts - 1:
                        break
    return paths


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--switchyard", default="build/bin/switchyard")
    p.add_argument("--make-corpus", default=os.path.join(os.path.dirname(__file__), "make_corpus.py"))
    p.add_argument("--throughput-size", type=float, default=1e9)
    p.add_argument("--sizes", default="2e8,1e9,2e9", help="memory: corpus sizes in bytes")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--work", default=None, help="folder for corpora (default: a temporary one)")
    p.add_argument("--json", default="runs/bench/prep.json")
    a = p.parse_args()
    n = a.threads
    tmp_holder = None if a.work else tempfile.TemporaryDirectory()
    work = a.work or tmp_holder.name
    os.makedirs(work, exist_ok=True)
    results = {"threads": n, "vocab": a.vocab, "throughput": [], "memory": []}

    # The model: prep on the throughput corpus with its default tokenizer sample.
    tsize = int(a.throughput_size)
    corpus = f"{work}/corpus-{tsize}.txt"
    nbytes = make_corpus(a.make_corpus, corpus, tsize)
    model_dir = f"{work}/model"
    if not os.path.exists(f"{model_dir}/tokenizer.model"):
        run([a.switchyard, "prep", "--out", model_dir, "--vocab", str(a.vocab), "--threads",
             str(n), "--force", corpus])
    model = f"{model_dir}/tokenizer.model"

    seconds, peak = run([a.switchyard, "prep", "--out", f"{work}/encoded", "--force",
                         "--tokenizer", model, "--threads", str(n), corpus])
    results["throughput"].append({"tool": "switchyard prep", "bytes": nbytes, "processes": 1,
                                  "threads": n, "seconds": seconds, "peak_rss": peak})
    slices = split(corpus, n, work)
    start = time.monotonic()
    procs = [subprocess.Popen(["spm_encode", "--model", model, "--output_format=id"],
                              stdin=open(s, "rb"), stdout=subprocess.DEVNULL) for s in slices]
    peaks = []
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            sys.exit("bench_prep: spm_encode failed")
        peaks.append(usage.ru_maxrss * 1024)
    seconds = time.monotonic() - start
    results["throughput"].append({"tool": "spm_encode", "bytes": nbytes, "processes": n,
                                  "threads": 1, "seconds": seconds, "peak_rss": max(peaks)})
    for s in slices:
        os.remove(s)

    print(f"throughput: {nbytes / 1e6:.1f} MB corpus, vocabulary {a.vocab}, {n} cores")
    print(f"{'tool':<18} {'seconds':>9} {'MB/s':>9} {'MB/s/core':>10} {'peak MiB':>9}")
    for r in results["throughput"]:
        r["mb_per_s"] = r["bytes"] / 1e6 / r["seconds"]
        r["mb_per_s_per_core"] = r["mb_per_s"] / n
        print(f"{r['tool']:<18} {r['seconds']:9.2f} {r['mb_per_s']:9.2f} "
              f"{r['mb_per_s_per_core']:10.2f} {r['peak_rss'] / 2**20:9.1f}")

    _, base = run([a.switchyard, "prep", "--help"])
    results["startup_rss"] = base
    print(f"\nmemory: full prep (tokenizer on the default sample, {n} threads); start-up "
          f"{base / 2**20:.1f} MiB")
    print(f"{'corpus MB':>10} {'seconds':>9} {'peak MiB':>9} {'prep own MiB':>13}")
    for size in [int(float(s)) for s in a.sizes.split(",")]:
        path = f"{work}/corpus-{size}.txt"
        sbytes = make_corpus(a.make_corpus, path, size)
        seconds, peak = run([a.switchyard, "prep", "--out", f"{work}/mem-{size}", "--force",
                             "--vocab", str(a.vocab), "--threads", str(n), path])
        results["memory"].append({"bytes": sbytes, "seconds": seconds, "peak_rss": peak,
                                  "above_startup": peak - base})
        print(f"{sbytes / 1e6:10.1f} {seconds:9.2f} {peak / 2**20:9.1f} {(peak - base) / 2**20:13.1f}")

    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nwrote {a.json}")


if __name__ == "__main__":
    main()
