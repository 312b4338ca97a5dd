#!/usr/bin/python3
"""The table of the load-balance study (scripts/study_load_balance.sh, docs/load-balance.md).

    /usr/bin/python3 scripts/study_summary.py --out PREFIX RUN [RUN ...]

Writes PREFIX.md (a Markdown table) and PREFIX.json (the same numbers) with one row per
training output directory:

  val loss        eval.json's loss (the study's evaluation of the final checkpoint on the
                  whole validation split), else the last validation loss in metrics.jsonl
  dropped (run)   dropped assignments / assignments over every step and MoE layer
  dropped (end)   the same over the last 10% of the steps
  max vio (end)   maximal violation (max load / mean load - 1, before dropping), mean over
                  the last 10% of the steps and the MoE layers
  cv (end)        coefficient of variation of the load, likewise
  lang MI         mutual information between a token's language and its expert (bits; mean
                  over the MoE layers; routing_by_language.json, the second half of the
                  run): 0 = no specialisation, log2(languages) = each language its own experts
  lang top        mean over languages of the share of its assignments its most-used expert gets
  tok/s           mean training throughput (a loaded machine makes it noisy)
"""
import argparse
import json
import math
import os
import sys


def label_specialisation(path):
    """(lang MI, lang top) of a routing_by_language.json (columns above), means over the MoE
    layers; (None, None) when no layer routed a labelled token. Shared with the experiment
    runner (scripts/experiments/measures.py)."""
    with open(path) as f:
        lang = json.load(f)
    mis, tops = [], []
    for table in lang["counts"]:
        rows = [r for r in table if sum(r)]
        total = sum(sum(r) for r in rows)
        if not total:
            continue
        col = [sum(r[e] for r in rows) for e in range(len(rows[0]))]
        m = 0.0
        for r in rows:
            rs = sum(r)
            for e, c in enumerate(r):
                if c:
                    m += c / total * math.log2(c * total / (rs * col[e]))
        mis.append(m)
        tops.append(sum(max(r) / sum(r) for r in rows) / len(rows))
    if not mis:
        return None, None
    return sum(mis) / len(mis), sum(tops) / len(tops)


def summarise(path):
    steps, val = [], None
    with open(os.path.join(path, "metrics.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if "moe" in d and "loss" in d:
                steps.append(d)
            elif "val_loss" in d:
                val = d["val_loss"]
    if not steps:
        raise ValueError("%s: no training steps in metrics.jsonl" % path)
    epath = os.path.join(path, "eval.json")
    if os.path.isfile(epath):
        with open(epath) as f:
            val = json.load(f)["loss"]
    tail = steps[-max(1, len(steps) // 10):]
    layers = len(steps[0]["moe"])

    def dropped(ss):
        a = sum(l["assignments"] for d in ss for l in d["moe"])
        return sum(l["dropped"] for d in ss for l in d["moe"]) / a if a else 0.0

    def mean(ss, key):
        vals = [l[key] for d in ss for l in d["moe"]]
        return sum(vals) / len(vals) if vals else 0.0

    mi = top = None
    lpath = os.path.join(path, "routing_by_language.json")
    if os.path.isfile(lpath) and layers:
        mi, top = label_specialisation(lpath)
    return {
        "run": os.path.basename(os.path.normpath(path)),
        "steps": len(steps),
        "val_loss": val,
        "dropped_run": dropped(steps),
        "dropped_end": dropped(tail),
        "max_violation_end": mean(tail, "max_violation"),
        "cv_end": mean(tail, "load_cv"),
        "lang_mi_bits": mi,
        "lang_top_share": top,
        "tokens_per_s": sum(d["tokens_per_s"] for d in steps) / len(steps),
    }


def fmt(v, f):
    return "-" if v is None else f % v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("runs", nargs="+")
    a = ap.parse_args()
    try:
        rows = [summarise(p) for p in a.runs]
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write("study_summary.py: error: %s\n" % e)
        return 1
    lines = ["| run | steps | val loss | dropped (run) | dropped (end) | max vio (end) | cv (end) | lang MI (bits) | lang top | tok/s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["run"], r["steps"], fmt(r["val_loss"], "%.4f"), fmt(100 * r["dropped_run"], "%.1f%%"),
            fmt(100 * r["dropped_end"], "%.1f%%"), fmt(r["max_violation_end"], "%.3f"),
            fmt(r["cv_end"], "%.3f"), fmt(r["lang_mi_bits"], "%.3f"),
            fmt(None if r["lang_top_share"] is None else 100 * r["lang_top_share"], "%.1f%%"),
            fmt(r["tokens_per_s"], "%.0f")))
    with open(a.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(a.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
