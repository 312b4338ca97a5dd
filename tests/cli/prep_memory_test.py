#!/usr/bin/env python3
"""prep's peak memory does not grow with the corpus (docs/data.md, "Memory").

Generates a corpus of SMALL bytes and one ten times larger (scripts/make_corpus.py), runs
`switchyard prep` on each (the tokenizer trained on a 1 MB sample, 2 threads) from a small
starter process and reads each run's peak resident set from the kernel (ru_maxrss) and its
peak anonymous memory (RssAnon, sampled every 10 ms: prep's own heap, which the start-up
footprint of a CUDA build cannot hide). Checks:
  - what prep adds to the binary's own start-up peak (`switchyard prep --help`, which
    maps the same libraries) stays within the documented bound
    64 MiB + 32 x tokenizer-sample-bytes + 8 MiB x threads + 4 x the largest document;
  - so does its anonymous memory above that of `prep --help`;
  - the larger corpus peaks at most 16 MiB above the smaller one, in RSS and in anonymous
    memory;
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


# Starts the command from a fresh, small interpreter and prints its exit status, its peak
# RSS (wait4's ru_maxrss, KiB), the starter's own peak RSS, and the command's peak
# anonymous memory (RssAnon, KiB) sampled every 10 ms. Linux keeps the high-water mark of
# the memory a process replaces by exec (fork copies the parent's), so ru_maxrss never
# reads below the RSS of the process that forked: this script, after it read a 30 MB corpus
# whole, once made prep's "peak" its own 74 MiB. RssAnon is the command's own heap and
# stacks, without the libraries mapped at start-up (the ~220 MiB of CUDA libraries of a CUDA
# build), so memory that grows with the corpus shows in it whatever the start-up footprint.
STARTER = """
import os, resource, subprocess, sys, time
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
anon = 0
while proc.poll() is None:
    try:
        with open('/proc/%d/status' % proc.pid) as f:
            for line in f:
                if line.startswith('RssAnon:'):
                    anon = max(anon, int(line.split()[1]))
    except OSError:
        pass
    time.sleep(0.01)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(proc.returncode, usage.ru_maxrss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, anon)
"""


def peak_rss(args):
    """Runs args with its output discarded; returns (exit status, peak RSS in bytes, peak
    anonymous RSS in bytes) of the command (see STARTER). The peak RSS reads at least the
    starter's own (printed when it does)."""
    proc = subprocess.run([sys.executable, "-c", STARTER, *args], capture_output=True, check=True)
    rc, peak, starter, anon = (int(x) for x in proc.stdout.split())
    if starter >= peak:
        print(f"  (the peak RSS of {peak / 1024:.1f} MiB is the starter's floor of "
              f"{starter / 1024:.1f} MiB: the command used no more)")
    return rc, peak * 1024, anon * 1024


def largest_document(path):
    """The largest document (paragraphs apart by a blank line), read a line at a time so
    that this process stays small."""
    largest = size = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line == "\n":
                largest, size = max(largest, size), 0
            else:
                size += len(line)
    return max(largest, size)


def main():
    binary, make_corpus, tiny = sys.argv[1], sys.argv[2], sys.argv[3]
    small = int(sys.argv[4]) if len(sys.argv) > 4 else 3_000_000
    sample, threads = 1_000_000, 2
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        rc, base, base_anon = peak_rss([binary, "prep", "--help"])
        assert rc == 0
        peaks, anons = {}, {}
        for size in (small, 10 * small):
            corpus = f"{tmp}/corpus-{size}.txt"
            subprocess.run([sys.executable, make_corpus, corpus, str(size), "--seed",
                            str(size)], check=True)
            largest = largest_document(corpus)
            rc, peak, anon = peak_rss([binary, "prep", "--out", f"{tmp}/out-{size}", "--vocab", "400",
                                 "--tokenizer-sample-bytes", str(sample), "--threads",
                                 str(threads), corpus])
            if rc != 0:
                print(f"FAIL: prep on {size} bytes exited with {rc}")
                return 1
            bound = 64 * MIB + 32 * sample + 8 * MIB * threads + 4 * largest
            added = peak - base
            print(f"{size / 1e6:7.1f} MB corpus: peak {peak / MIB:7.1f} MiB, start-up "
                  f"{base / MIB:7.1f} MiB, prep's own {added / MIB:6.1f} MiB "
                  f"(bound {bound / MIB:6.1f} MiB); anonymous {anon / MIB:6.1f} MiB "
                  f"(start-up {base_anon / MIB:.1f} MiB)")
            if added > bound:
                print(f"FAIL: prep used {added / MIB:.1f} MiB above start-up on {size} bytes, "
                      f"over the documented bound of {bound / MIB:.1f} MiB")
                failures += 1
            if anon - base_anon > bound:
                print(f"FAIL: prep's anonymous memory grew {(anon - base_anon) / MIB:.1f} MiB "
                      f"above start-up on {size} bytes, over the bound of {bound / MIB:.1f} MiB")
                failures += 1
            peaks[size], anons[size] = peak, anon
        growth = peaks[10 * small] - peaks[small]
        anon_growth = anons[10 * small] - anons[small]
        print(f"10x the corpus: peak grew by {growth / MIB:.1f} MiB, anonymous memory by "
              f"{anon_growth / MIB:.1f} MiB")
        if growth > 16 * MIB or anon_growth > 16 * MIB:
            print(f"FAIL: prep's memory grew with a corpus 10x larger (peak "
                  f"{growth / MIB:.1f} MiB, anonymous {anon_growth / MIB:.1f} MiB)")
            failures += 1

        # The loader: training on each output.
        trained = {}
        for size in (small, 10 * small):
            rc, peak, _ = peak_rss([binary, "train", "--config", tiny, "--out", f"{tmp}/run-{size}",
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
