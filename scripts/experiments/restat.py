#!/usr/bin/python3
"""Recomputes a published experiment's tests with the current stats.py (docs/experiments/
README.md, "Publishing"): reads DIR/summary.json (every run's numbers and validation curves
stay in it when published), recomputes its tests (runner.tests_of: each setting against the
baseline in the table setting x seed, the trend, the seed counts for power) and rewrites
DIR/summary.json and DIR/summary.md with the same columns. No run is read or trained.

    /usr/bin/python3 scripts/experiments/restat.py DIR [DIR ...]
"""
import json
import os
import sys

import runner
import summary_md


def columns_of(summary, md_path):
    """summary.md's columns: summary.json's since they are stored there, else read back from
    the old summary.md's header (the Δ columns' headers of before the two-way test too)."""
    if summary.get("columns") is not None:
        return summary["columns"], summary["stability"]
    with open(md_path) as f:
        head = [h.strip() for h in f.readline().strip().strip("|").split("|")]
    by_header = {v[0]: k for k, v in summary_md.COLUMNS.items()}
    cols = []
    for h in head[3:]:
        if h in ("stable", "spiked", "diverged"):
            continue
        key = by_header.get(h.replace("(± pooled SE; p)", "(± SE; p, setting x seed)"))
        if key is None:
            raise ValueError("%s: column '%s' is not one the runner writes" % (md_path, h))
        cols.append(key)
    return cols, "stable" in head


def restat(folder):
    path = os.path.join(folder, "summary.json")
    with open(path) as f:
        summary = json.load(f)
    cols, stability = columns_of(summary, os.path.join(folder, "summary.md"))
    trend = (summary.get("trend") or {}).get("settings")
    effects = list((summary.get("power") or {}).get("seeds", {}))
    summary.update(runner.tests_of(summary["settings"], summary["runs"], summary.get("baseline"),
                                   trend, effects))
    summary["columns"], summary["stability"] = cols, stability
    with open(path, "w") as f:
        json.dump(summary, f, indent=1, allow_nan=False)
    with open(os.path.join(folder, "summary.md"), "w") as f:
        f.write(summary_md.markdown(summary, cols, stability))
    print("%s: tests recomputed (%s)" % (folder, ", ".join(k for k in ("paired_test", "trend", "power")
                                                          if summary.get(k)) or "no tests"))


def main(argv):
    if not argv or any(a.startswith("-") for a in argv):
        sys.stderr.write("usage: restat.py DIR [DIR ...] (folders holding a published summary.json)\n")
        return 2
    for folder in argv:
        try:
            restat(folder)
        except (OSError, ValueError, KeyError) as e:
            sys.stderr.write("restat.py: error: %s: %s\n" % (folder, e))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
