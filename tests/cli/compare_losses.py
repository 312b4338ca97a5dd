#!/usr/bin/env python3
"""Compares the per-step training losses of two metrics.jsonl files.

    compare_losses.py MODE GOT WANT FIRST LAST

MODE is "exact" (the loss text written to the file is the same string: the same double,
bit for bit) or a relative tolerance such as 1e-5 (|got - want| <= tol |want|; a training
loss is far from zero, so a relative bound means something there). GOT must hold exactly
the steps FIRST..LAST, each once; WANT must hold each of them. Prints one line on success;
exits non-zero with the first differing steps otherwise. Used by tests/cli/train_cli_test.sh
and scripts/multihost_test.sh.
"""
import re
import sys


def losses(path):
    """step -> the loss exactly as written (the JSON text) of each training line."""
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r'\{"step":(\d+),"loss":([^,]+),', line)
            if m:
                step = int(m.group(1))
                if step in out:
                    sys.exit(f"{path}: step {step} logged twice")
                out[step] = m.group(2)
    return out


def main(argv):
    if len(argv) != 6:
        sys.exit("usage: compare_losses.py exact|TOL GOT WANT FIRST LAST")
    cmd, got_path, want_path = argv[1], argv[2], argv[3]
    first, last = int(argv[4]), int(argv[5])
    got, want = losses(got_path), losses(want_path)
    steps = list(range(first, last + 1))
    if sorted(got) != steps:
        sys.exit(f"{got_path}: steps {sorted(got)}, want {first}..{last}")
    bad, worst = [], 0.0
    for s in steps:
        if s not in want:
            sys.exit(f"{want_path}: no step {s}")
        if cmd == "exact":
            if got[s] != want[s]:
                bad.append(f"step {s}: {got[s]} vs {want[s]}")
        else:
            a, b = float(got[s]), float(want[s])
            rel = abs(a - b) / abs(b)
            worst = max(worst, rel)
            if not rel <= float(cmd):
                bad.append(f"step {s}: {a} vs {b} (relative {rel:.2e})")
    if bad:
        sys.exit("; ".join(bad[:5]))
    print(f"steps {first}..{last}: " +
          ("identical" if cmd == "exact" else f"max relative {worst:.2e}"))


if __name__ == "__main__":
    main(sys.argv)
