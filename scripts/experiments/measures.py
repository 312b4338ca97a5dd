"""What the experiment runner (runner.py) measures in one run, and how runs of a setting are
summarised over seeds. No plotting, no processes: files in, numbers out (tested alone by
tests/cli/experiments_measures_test.py).

One run's directory (a `switchyard train --out`) holds metrics.jsonl, routing.jsonl,
routing_by_language.json, step-*/config.yaml, and the runner's own run.json (how the
training ended) and eval.json (`switchyard eval --json --batches 0`: the final checkpoint on
the whole validation split).
"""
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from study_summary import label_specialisation  # noqa: E402  (scripts/study_summary.py)

# Loss spikes (docs/experiments/README.md, "Stability"), after the warmup: the mean training
# cross-entropy of the last SPIKE_WINDOW steps above SPIKE_RATIO times the lowest such mean
# before it (a sustained rise), or one step's loss above STEP_RATIO times the mean of the
# SPIKE_WINDOW steps before it (a sharp one); a non-finite loss is always a spike. Stable
# pilot runs reached 1.07 and 1.37 on the code corpus, whose batches vary from 2.5 to 5 nats.
SPIKE_WINDOW = 50
SPIKE_RATIO = 1.2
STEP_RATIO = 2.0


def flops_per_token(cfg):
    """Training FLOPs per token of a resolved config (a step-*/config.yaml as a dict): the
    formula of `switchyard train --dry-run` (engine/plan/dry_run.h):
      6 x (matrix parameters one token multiplies by: attention q, k, v, o; dense MLPs; per
           MoE layer the router d x E, k routed experts and the shared experts; the head
           d x V; embedding lookups, biases and norms excluded)
      + 12 x L x S x n_heads x head_dim (attention scores and values, causal mask ignored).
    A dense model (no MoE layer) and a top-1 MoE whose d_expert is the dense d_ff differ by
    the router only; top-k counts k experts."""
    m, e = cfg["model"], cfg["moe"]
    d, L, S, V = m["d_model"], m["n_layers"], m["seq_len"], m["vocab_size"]
    heads = m["n_heads"]
    hd = d // heads
    kv = (m.get("n_kv_heads") or heads) * hd
    d_ff = m.get("d_ff") or 4 * d
    mlp_mats = lambda act: 3 if act == "swiglu" else 2  # noqa: E731
    attn = d * heads * hd + 2 * d * kv + heads * hd * d
    f = e.get("layer_freq", 2)
    matmul = d * V
    for i in range(L):
        matmul += attn
        if i % f == f - 1:
            matmul += d * e["num_experts"]
            matmul += e["top_k"] * mlp_mats(e.get("activation", "gelu")) * d * e["d_expert"]
            shared = e.get("num_shared_experts", 0)
            if shared:
                ds = e.get("d_shared") or e["d_expert"]
                matmul += shared * mlp_mats(e.get("activation", "gelu")) * d * ds
        else:
            matmul += mlp_mats(m.get("activation", "gelu")) * d * d_ff
    return 6.0 * matmul + 12.0 * L * S * heads * hd


def tokens_per_step(cfg):
    t = cfg["train"]
    return t["micro_batch_size"] * t.get("grad_accum", 1) * cfg["model"]["seq_len"]


def find_spikes(ce, warmup, window=SPIKE_WINDOW, ratio=SPIKE_RATIO, step_ratio=STEP_RATIO):
    """ce: [(step, loss or None)] in step order. Returns (spike steps, the largest ratio of a
    window mean to the lowest earlier one, the largest ratio of a step to the mean of the
    window before it; both after the warmup). Consecutive spike steps are one spike: the
    list holds each spike's first step."""
    spikes, worst, worst_step, best, prev_spike = [], 0.0, 0.0, math.inf, False
    ok = lambda x: x is not None and math.isfinite(x)  # noqa: E731
    for i, (step, v) in enumerate(ce):
        spike = not ok(v)
        if not spike and i >= window:
            before = [x for _, x in ce[i - window:i]]
            if all(ok(x) for x in before) and step >= warmup:
                r = v / (sum(before) / window)
                worst_step = max(worst_step, r)
                spike = r > step_ratio
        if ok(v) and i + 1 >= window:
            w = [x for _, x in ce[i + 1 - window:i + 1]]
            if all(ok(x) for x in w):
                mean = sum(w) / window
                if step >= warmup and best < math.inf:
                    worst = max(worst, mean / best)
                    spike = spike or mean > ratio * best
                best = min(best, mean)
        if spike and not prev_spike:
            spikes.append(step)
        prev_spike = spike
    return spikes, worst, worst_step


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def resolved_config(run_dir):
    """The config the run trained with (its latest checkpoint's config.yaml), or None."""
    import yaml
    steps = sorted(d for d in os.listdir(run_dir) if d.startswith("step-")) if os.path.isdir(run_dir) else []
    for d in reversed(steps):
        p = os.path.join(run_dir, d, "config.yaml")
        if os.path.isfile(p):
            with open(p) as f:
                return yaml.safe_load(f)
    return None


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def run_measures(run_dir, cfg):
    """One run's numbers. cfg: its resolved config (or a sibling seed's when this run left
    no checkpoint). Keys with None are what this run cannot give (no MoE layer, diverged)."""
    with open(os.path.join(run_dir, "run.json")) as f:
        status = json.load(f)
    steps, val = {}, {}
    mpath = os.path.join(run_dir, "metrics.jsonl")  # absent when a run stopped before step 0
    for d in read_jsonl(mpath) if os.path.isfile(mpath) else []:
        if "loss" in d and "moe" in d:
            steps[d["step"]] = d
        elif "val_loss" in d:
            val[d["step"]] = d["val_loss"]
    recs = [steps[s] for s in sorted(steps)]
    tail = recs[-max(1, len(recs) // 10):]
    moe = bool(recs) and bool(recs[0]["moe"])
    ev = None
    epath = os.path.join(run_dir, "eval.json")
    if os.path.isfile(epath):
        with open(epath) as f:
            ev = json.load(f)

    def dropped(rs):
        a = sum(l["assignments"] for d in rs for l in d["moe"])
        return sum(l["dropped"] for d in rs for l in d["moe"]) / a if a else None

    ce = [(d["step"], d.get("ce_loss")) for d in recs]
    warmup = cfg["train"].get("warmup_steps", 0) if cfg else 0
    spikes, worst, worst_step = find_spikes(ce, warmup)
    diverged = status["status"] == "diverged"
    fpt = flops_per_token(cfg) if cfg else None
    tps = tokens_per_step(cfg) if cfg else None
    mi = top = None
    lpath = os.path.join(run_dir, "routing_by_language.json")
    if moe and os.path.isfile(lpath):
        mi, top = label_specialisation(lpath)
    evl = ev["moe"] if ev else []
    return {
        "status": status["status"],
        "seed": status["seed"],
        "steps": len(recs),
        "val_loss": ev["loss"] if ev else None,
        "perplexity": ev["perplexity"] if ev else None,
        "maxvio_global": _mean([l["max_violation"] for l in evl]) if evl else None,
        "maxvio_global_max": max(l["max_violation"] for l in evl) if evl else None,
        "maxvio_batch": _mean([l["max_violation"] for d in tail for l in d["moe"]]) if moe else None,
        "dropped_run": dropped(recs) if moe else None,
        "dropped_end": dropped(tail) if moe else None,
        "step_s": statistics.median(d["step_s"] for d in recs) if recs else None,
        "flops_per_token": fpt,
        "tokens_per_step": tps,
        "train_flops": fpt * tps * len(recs) if fpt else None,
        "lang_mi_bits": mi,
        "lang_top_share": top,
        "diverged": diverged,
        "spikes": spikes,
        "spiked": bool(spikes),
        "stable": not diverged and not spikes,
        "worst_window_ratio": worst,
        "worst_step_ratio": worst_step,
        # Curves for the plots: validation (train.eval_batches micro-batches every
        # train.eval_every steps), training cross-entropy, per-batch MaxVio and dropped
        # fraction (means over the MoE layers) per step.
        "curve_val": [[s, val[s]] for s in sorted(val)],
        "curve_ce": ce,
        "curve_maxvio": [[d["step"], _mean([l["max_violation"] for l in d["moe"]])] for d in recs] if moe else [],
        "curve_dropped": [[d["step"], _mean([l["dropped_frac"] for l in d["moe"]])] for d in recs] if moe else [],
    }


# The per-run numbers averaged over seeds (summary.json's "metrics", summary.md's columns).
METRICS = ["val_loss", "perplexity", "maxvio_global", "maxvio_global_max", "maxvio_batch",
           "dropped_run", "dropped_end", "step_s", "flops_per_token", "train_flops",
           "lang_mi_bits", "lang_top_share", "speedup", "delta_val_loss"]


def mean_std(values):
    """{"mean", "std" (sample, n - 1; None for one value), "n", "values"} of the finite
    values; mean None when there is none."""
    xs = [v for v in values if v is not None and math.isfinite(v)]
    return {"mean": sum(xs) / len(xs) if xs else None,
            "std": statistics.stdev(xs) if len(xs) > 1 else None,
            "n": len(xs), "values": xs}


def crossing_step(curve, target):
    """The first step at which a validation curve [[step, loss]] reaches target (linear
    between evaluations), or None."""
    for i, (s, v) in enumerate(curve):
        if v <= target:
            if i == 0:
                return float(s)
            s0, v0 = curve[i - 1]
            return s0 + (s - s0) * (v0 - target) / (v0 - v)
    return None


def mean_curve(curves):
    """Mean and sample std over runs at the steps every run has: [[step, mean, std]]."""
    common = set.intersection(*[set(s for s, v in c if v is not None) for c in curves]) if curves else set()
    out = []
    for s in sorted(common):
        vs = [dict((a, b) for a, b in c)[s] for c in curves]
        out.append([s, sum(vs) / len(vs), statistics.stdev(vs) if len(vs) > 1 else 0.0])
    return out


def summarise_setting(name, overrides, runs, baseline=None, baseline_runs=None):
    """One setting over its seeds. runs: run_measures of every seed. baseline: (loss, steps),
    the baseline setting's mean validation curve at its last evaluation and that step; each
    run's speed-up is steps / the step at which its own validation curve first reaches loss
    (None when it never does). baseline_runs: the baseline setting's runs; each run's
    delta_val_loss is its val loss minus the baseline's of the same seed (same initial
    draw and data order, so most seed noise cancels)."""
    ok = [r for r in runs if r["status"] == "ok"]
    if baseline_runs is not None:
        base = {r["seed"]: r["val_loss"] for r in baseline_runs if r["val_loss"] is not None}
        for r in ok:
            r["delta_val_loss"] = r["val_loss"] - base[r["seed"]] if r["seed"] in base and r["val_loss"] is not None else None
    if baseline is not None:
        loss, at = baseline
        for r in ok:
            c = crossing_step(r["curve_val"], loss)
            r["speedup_steps"] = c
            r["speedup"] = at / c if c else None
    metrics = {k: mean_std([r.get(k) for r in ok]) for k in METRICS}
    return {
        "name": name,
        "overrides": overrides,
        "runs": len(runs),
        "ok": len(ok),
        "diverged": sum(r["diverged"] for r in runs),
        "spiked": sum(r["spiked"] and not r["diverged"] for r in runs),
        "stable": sum(r["stable"] for r in runs),
        "seeds": [r["seed"] for r in runs],
        "metrics": metrics,
        "curve_val": mean_curve([r["curve_val"] for r in ok]),
    }
