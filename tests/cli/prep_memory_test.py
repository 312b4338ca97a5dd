#!/usr/bin/env python3
"""prep's peak memory does not grow with the corpus (docs/data.md, "Memory").

Generates a corpus of SMALL bytes and one ten times larger (scripts/make_corpus.py), runs
`switchyard prep` on each (the tokenizer trained on a 1 MB sample, 2 threads) and reads
each run's peak resident set from the kernel (wait4's ru_maxrss). Checks:
  - what prep adds to the binary's own start-up peak (`switchyard prep --help`, which
    maps the same libraries) stays within the documented bound
    64 MiB + 32 x tokenizer-sample-bytes + 8 MiB x threads + 4 x the largest document;
  - the larger corpus peaks at most 16 MiB above the smaller one;
  - training 2 steps on each prep output (the loader maps the shards and reads them once
    to verify them, then drops the pages) peaks at most 16 MiB higher on the larger one,
    whose tokens alone take far more as int32 (the earlier loader held them in memory).
usage: prep_memory_test.py path/to/switchyard path/to/make_corpus.py path/to/train-tiny.yaml
                           [SMALL_BYTES]
"""
import os
import subprocess
import sys
import tempfile

MIB = 1 << 20


def peak_rss(args):
    """Runs args with stdout discarded; returns (exit status, peak RSS in bytes)."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(err.decode())
    return proc.returncode, usage.ru_maxrss * 1024


def main():
    binary, make_corpus, tiny = sys.argv[1], sys.argv[2], sys.argv[3]
    small = int(sys.argv[4]) if len(sys.argv) > 4 else 3_000_000
    sample, threads = 1_000_000, 2
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        rc, base = peak_rss([binary, "prep", "--help"])
        assert rc == 0
        peaks = {}
        for size in (small, 10 * small):
            corpus = f"{tmp}/corpus-{size}.txt"
            subprocess.run([sys.executable, make_corpus, corpus, str(size), "--seed",
                            str(size)], check=True)
            largest = max(len(doc) for doc in open(corpus, encoding="utf-8").read().split("\n\n"))
            rc, peak = peak_rss([binary, "prep", "--out", f"{tmp}/out-{size}", "--vocab", "400",
                                 "--tokenizer-sample-bytes", str(sample), "--threads",
                                 str(threads), corpus])
            if rc != 0:
                print(f"FAIL: prep on {size} bytes exited with {rc}")
                return 1
            bound = 64 * MIB + 32 * sample + 8 * MIB * threads + 4 * largest
            added = peak - base
            print(f"{size / 1e6:7.1f} MB corpus: peak {peak / MIB:7.1f} MiB, start-up "
                  f"{base / MIB:7.1f} MiB, prep's own {added / MIB:6.1f} MiB "
                  f"(bound {bound / MIB:6.1f} MiB)")
            if added > bound:
                print(f"FAIL: prep used {added / MIB:.1f} MiB above start-up on {size} bytes, "
                      f"over the documented bound of {bound / MIB:.1f} MiB")
                failures += 1
            peaks[size] = peak
        growth = peaks[10 * small] - peaks[small]
        print(f"10x the corpus: peak grew by {growth / MIB:.1f} MiB")
        if growth > 16 * MIB:
            print(f"FAIL: the peak grew by {growth / MIB:.1f} MiB with a corpus 10x larger")
            failures += 1

        # The loader: training on each output.
        trained = {}
        for size in (small, 10 * small):
            rc, peak = peak_rss([binary, "train", "--config", tiny, "--out", f"{tmp}/run-{size}",
                                 "--set", f"data.dir={tmp}/out-{size}", "--set",
                                 "model.vocab_size=512", "--set", "train.max_steps=2"])
            if rc != 0:
                print(f"FAIL: train on the {size}-byte corpus exited with {rc}")
                return 1
            trained[size] = peak
            print(f"train on {size / 1e6:5.1f} MB of text: peak {peak / MIB:7.1f} MiB")
        growth = trained[10 * small] - trained[small]
        print(f"train, 10x the corpus: peak grew by {growth / MIB:.1f} MiB")
        if growth > 16 * MIB:
            print(f"FAIL: training's peak grew by {growth / MIB:.1f} MiB with 10x the tokens")
            failures += 1
    if failures:
        return 1
    print("prep memory checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
