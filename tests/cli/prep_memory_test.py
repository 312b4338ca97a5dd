#!/usr/bin/env python3
"""prep's peak memory does not grow with the corpus (docs/data.md, "Memory").

Generates a corpus of SMALL bytes and one ten times larger (scripts/make_corpus.py), runs
`switchyard prep` on each (the tokenizer trained on a 1 MB sample, 2 threads) and reads
each run's peak resident set from the kernel (wait4's ru_maxrss). Checks:
  - what prep adds to the binary's own start-up peak (`switchyard prep --help`, which
    maps the same libraries) stays within the documented bound
    64 MiB + 32 x tokenizer-sample-bytes + 8 MiB x threads + 4 x the largest document;
  - the larger corpus peaks at most 16 MiB above the smaller one.
usage: prep_memory_test.py path/to/switchyard path/to/make_corpus.py [SMALL_BYTES]
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
    binary, make_corpus = sys.argv[1], sys.argv[2]
    small = int(sys.argv[3]) if len(sys.argv) > 3 else 3_000_000
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
    if failures:
        return 1
    print("prep memory checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
