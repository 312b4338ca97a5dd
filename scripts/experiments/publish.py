#!/usr/bin/python3
"""Copies an experiment's evidence from its output directory into a docs folder
(docs/experiments/README.md, "Publishing"):

    /usr/bin/python3 scripts/experiments/publish.py OUT DIR   (or the runner's --publish DIR)

copies OUT/summary.md, OUT/per_seed.csv, OUT/configs/*.yaml and OUT/*.png into DIR, and
OUT/summary.json without the runs' per-step training curves (curve_ce, curve_maxvio,
curve_dropped: a few MB on a full grid; every number, the validation curves and the
paired Δ curves stay; the figures drawn from the dropped curves are copied), and writes
DIR/runs.tar.xz, the runs' own records (runs_archive.py: metrics, routing, eval, resolved
configs; about 0.2 MB a 1200-step run; only when OUT holds finished runs), from which the
runner summarises or finishes the experiment on another machine (--restore). No checkpoint
weights, logs or report.html. Files of DIR that OUT also names are replaced; others are
left alone. Prints what it wrote and the bytes.
"""
import glob
import json
import os
import shutil
import sys

import runs_archive

# Per-step curves of every run that publish leaves out of summary.json.
STEP_CURVES = ("curve_ce", "curve_maxvio", "curve_dropped")


def compact_summary(summary):
    """summary.json's content without the runs' per-step training curves (a copy), with
    "published" naming what was left out and where the full file is."""
    out = dict(summary)
    out["runs"] = {n: [{k: v for k, v in r.items() if k not in STEP_CURVES} for r in runs]
                   for n, runs in summary["runs"].items()}
    out["published"] = {"left_out": list(STEP_CURVES),
                        "note": "per-step training curves of every run: in the run's own summary.json"}
    return out


def publish(out, dest):
    """Copies the evidence of OUT into dest; returns [(relative path, bytes)]."""
    src = os.path.join(out, "summary.json")
    if not os.path.isfile(src):
        raise ValueError("%s has no summary.json (run the experiment first)" % out)
    os.makedirs(os.path.join(dest, "configs"), exist_ok=True)
    written = []
    with open(src) as f:
        summary = json.load(f)
    with open(os.path.join(dest, "summary.json"), "w") as f:
        json.dump(compact_summary(summary), f, indent=1, allow_nan=False)
        f.write("\n")
    written.append("summary.json")
    names = ["summary.md", "per_seed.csv"]
    names += [os.path.relpath(p, out) for p in sorted(glob.glob(os.path.join(out, "configs", "*.yaml")))]
    names += sorted(os.path.basename(p) for p in glob.glob(os.path.join(out, "*.png")))
    for n in names:
        if os.path.isfile(os.path.join(out, n)):
            shutil.copyfile(os.path.join(out, n), os.path.join(dest, n))
            written.append(n)
    if runs_archive.run_dirs(out):  # a summary rebuilt elsewhere may come without its runs
        runs_archive.pack(out, os.path.join(dest, "runs.tar.xz"))
        written.append("runs.tar.xz")
    return [(n, os.path.getsize(os.path.join(dest, n))) for n in written]


def main(argv):
    if len(argv) != 2 or argv[0].startswith("-"):
        sys.stderr.write("usage: publish.py OUT DIR (an experiment's output directory and a docs folder)\n")
        return 2
    try:
        files = publish(argv[0], argv[1])
    except (OSError, ValueError) as e:
        sys.stderr.write("publish.py: error: %s\n" % e)
        return 1
    for n, b in files:
        print("%9d  %s" % (b, os.path.join(argv[1], n)))
    print("%9d  bytes in %d files" % (sum(b for _, b in files), len(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
