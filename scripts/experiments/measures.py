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
    hd = m.get("head_dim") or d // heads
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


def resolved_config_path(run_dir):
    """The path of the config the run trained with (its latest checkpoint's config.yaml),
    or None when the run left no checkpoint."""
    steps = sorted(d for d in os.listdir(run_dir) if d.startswith("step-")) if os.path.isdir(run_dir) else []
    for d in reversed(steps):
        p = os.path.join(run_dir, d, "config.yaml")
        if os.path.isfile(p):
            return p
    return None


def resolved_config(run_dir):
    """The config the run trained with (resolved_config_path's, parsed), or None."""
    import yaml
    p = resolved_config_path(run_dir)
    if p is None:
        return None
    with open(p) as f:
        return yaml.safe_load(f)


def dropped(recs):
    """Dropped assignments / all assignments over metrics.jsonl step records and their MoE
    layers; None without assignments."""
    a = sum(l["assignments"] for d in recs for l in d["moe"])
    return sum(l["dropped"] for d in recs for l in d["moe"]) / a if a else None


def split_startup(recs, frac=0.1):
    """(the first max(1, floor(frac x n)) records, the rest): the start-up transient and the
    steady state of a run's steps (capacity's dropped_start / dropped_steady)."""
    k = max(1, int(len(recs) * frac)) if recs else 0
    return recs[:k], recs[k:]


def label_mi_normalised(counts):
    """(mean over MoE layers of I(label; expert) / min(H(label), log2 E), mean of that
    ceiling in bits) of routing_by_language.json's counts (per layer: labels x experts).
    I <= H(label) and I <= H(expert) <= log2 E, so the ratio lies in [0, 1]; H(label) comes
    from the same counts (the label mix the layer routed). Layers with no labelled token or
    a zero ceiling (one label, or one expert) are left out; (None, None) when none is left."""
    norms, ceilings = [], []
    for table in counts:
        rows = [r for r in table if sum(r)]
        total = sum(sum(r) for r in rows)
        if not total:
            continue
        experts = len(rows[0])
        col = [sum(r[e] for r in rows) for e in range(experts)]
        mi = h = 0.0
        for r in rows:
            rs = sum(r)
            h -= rs / total * math.log2(rs / total)
            for e, c in enumerate(r):
                if c:
                    mi += c / total * math.log2(c * total / (rs * col[e]))
        ceiling = min(h, math.log2(experts))
        if ceiling <= 0:
            continue
        norms.append(min(1.0, max(0.0, mi / ceiling)))
        ceilings.append(ceiling)
    if not norms:
        return None, None
    return sum(norms) / len(norms), sum(ceilings) / len(ceilings)


def paired_delta_curve(base_curve, run_curve):
    """A run's validation curve minus the baseline run's (same seed) at the steps both
    evaluated: [[step, run - base]] over the run's steps (moe_vs_dense's dense runs train
    twice as long: their later steps have no pair)."""
    base = dict((s, v) for s, v in base_curve if v is not None)
    return [[s, v - base[s]] for s, v in run_curve if v is not None and s in base]


def delta_band(curves, alpha=0.05):
    """Mean over seeds of paired Δ curves ([[step, Δ]] each) at the steps every curve has,
    with the two-sided (1 - alpha) t interval mean ± t_{1 - alpha/2, n - 1} x sd / sqrt(n):
    [[step, mean, lo, hi]], lo and hi None with one seed."""
    import stats
    if not curves:
        return []
    maps = [dict((s, v) for s, v in c) for c in curves]
    common = sorted(set.intersection(*[set(m) for m in maps]))
    n = len(maps)
    q = stats.t_ppf(1 - alpha / 2, n - 1) if n > 1 else None
    out = []
    for s in common:
        vs = [m[s] for m in maps]
        mean = sum(vs) / n
        if n > 1:
            half = q * statistics.stdev(vs) / math.sqrt(n)
            out.append([s, mean, mean - half, mean + half])
        else:
            out.append([s, mean, None, None])
    return out


def cumulative_shares(counts):
    """Expert counts -> (fractions of experts 0, 1/E, ..., 1; cumulative share of the
    assignments held by the busiest experts first, 0 ... 1): a Lorenz curve read from the
    top, which is the diagonal for a uniform load."""
    total = sum(counts)
    xs, ys, acc = [0.0], [0.0], 0
    for i, c in enumerate(sorted(counts, reverse=True)):
        acc += c
        xs.append((i + 1) / len(counts))
        ys.append(acc / total if total else 0.0)
    return xs, ys


def routing_tail_counts(recs, frac=0.1):
    """Per MoE layer, each expert's assignments (before dropping) summed over the last
    max(1, floor(frac x n)) of routing.jsonl's n records: [[count per expert] per layer]."""
    if not recs:
        return []
    tail = recs[-max(1, int(len(recs) * frac)):]
    return [[sum(d["tokens_per_expert"][li][e] for d in tail) for e in range(len(tail[0]["tokens_per_expert"][li]))]
            for li in range(len(tail[0]["layers"]))]


def router_curves(metrics_path):
    """From a run's metrics.jsonl: [[step, mean over MoE layers of the logged z (the
    z-loss, coef x mean over tokens of logsumexp(router logits)^2: 0 when the coefficient
    is 0), mean router entropy (nats), mean over MoE layers of router_lse_sq (the mean
    over tokens of logsumexp(router logits)^2 whatever the coefficient; None in logs
    written before the engine kept it)]] per training step. logsumexp lies between the
    largest logit and it plus ln E, so router_lse_sq measures the logits' size."""
    out = []
    for d in read_jsonl(metrics_path):
        if "loss" in d and d.get("moe"):
            out.append([d["step"], _mean([l["z"] for l in d["moe"]]),
                        _mean([l["router_entropy"] for l in d["moe"]]),
                        _mean([l.get("router_lse_sq") for l in d["moe"]])])
    return out


def bias_curves(routing_path):
    """From a run's routing.jsonl: (steps, layers, biases) where biases[l][e] is MoE layer
    l's expert e bias at each logged step (routing.jsonl's expert_bias, logged every
    logging.routing_every steps); None when the run logs no bias."""
    steps, per_step, layers = [], [], None
    for d in read_jsonl(routing_path):
        if "expert_bias" not in d:
            continue
        steps.append(d["step"])
        per_step.append(d["expert_bias"])
        layers = d.get("layers", layers)
    if not per_step:
        return None
    n_layers, n_experts = len(per_step[0]), len(per_step[0][0])
    biases = [[[s[l][e] for s in per_step] for e in range(n_experts)] for l in range(n_layers)]
    return steps, layers or list(range(n_layers)), biases


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

    head, rest = split_startup(recs)

    ce = [(d["step"], d.get("ce_loss")) for d in recs]
    warmup = cfg["train"].get("warmup_steps", 0) if cfg else 0
    spikes, worst, worst_step = find_spikes(ce, warmup)
    diverged = status["status"] == "diverged"
    fpt = flops_per_token(cfg) if cfg else None
    tps = tokens_per_step(cfg) if cfg else None
    mi = top = mi_norm = mi_ceiling = None
    lpath = os.path.join(run_dir, "routing_by_language.json")
    if moe and os.path.isfile(lpath):
        mi, top = label_specialisation(lpath)
        with open(lpath) as f:
            mi_norm, mi_ceiling = label_mi_normalised(json.load(f)["counts"])
    evl = ev["moe"] if ev else []
    return {
        "status": status["status"],
        "seed": status["seed"],
        "steps": len(recs),
        "num_experts": cfg["moe"]["num_experts"] if cfg and moe else None,
        "val_loss": ev["loss"] if ev else None,
        "perplexity": ev["perplexity"] if ev else None,
        "maxvio_global": _mean([l["max_violation"] for l in evl]) if evl else None,
        "maxvio_global_max": max(l["max_violation"] for l in evl) if evl else None,
        "maxvio_batch": _mean([l["max_violation"] for d in tail for l in d["moe"]]) if moe else None,
        "dropped_run": dropped(recs) if moe else None,
        "dropped_end": dropped(tail) if moe else None,
        "dropped_start": dropped(head) if moe else None,
        "dropped_steady": dropped(rest) if moe else None,
        "step_s": statistics.median(d["step_s"] for d in recs) if recs else None,
        "flops_per_token": fpt,
        "tokens_per_step": tps,
        "train_flops": fpt * tps * len(recs) if fpt else None,
        "lang_mi_bits": mi,
        "lang_top_share": top,
        "lang_mi_norm": mi_norm,
        "lang_mi_ceiling": mi_ceiling,
        "lr": cfg["train"]["lr"] if cfg else None,
        "z_loss_coef": cfg["moe"].get("z_loss_coef") if cfg else None,
        "aux_loss_coef": cfg["moe"].get("aux_loss_coef") if cfg else None,
        "expert_bias_rate": cfg["moe"].get("expert_bias_rate") if cfg else None,
        "expert_bias_update": cfg["moe"].get("expert_bias_update") if cfg else None,
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


# The per-run numbers averaged over seeds (summary.json's "metrics", summary.md's columns;
# "speedup" is added by summarise_setting, with its censored seeds).
METRICS = ["val_loss", "perplexity", "maxvio_global", "maxvio_global_max", "maxvio_batch",
           "dropped_run", "dropped_end", "dropped_start", "dropped_steady", "step_s", "flops_per_token", "train_flops",
           "lang_mi_bits", "lang_mi_norm", "lang_top_share", "delta_val_loss", "delta_curve_end"]


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


def curve_at(curve, step):
    """A validation curve [[step, loss]]'s value at `step`, linear between evaluations; None
    outside the curve's steps."""
    for i, (s, v) in enumerate(curve):
        if s == step:
            return v
        if s > step:
            if i == 0:
                return None
            s0, v0 = curve[i - 1]
            return v0 + (v - v0) * (step - s0) / (s - s0)
    return None


def mean_curve(curves):
    """Mean and sample std over runs at the steps every run has: [[step, mean, std]]."""
    common = set.intersection(*[set(s for s, v in c if v is not None) for c in curves]) if curves else set()
    out = []
    for s in sorted(common):
        vs = [dict((a, b) for a, b in c)[s] for c in curves]
        out.append([s, sum(vs) / len(vs), statistics.stdev(vs) if len(vs) > 1 else 0.0])
    return out


def speedup_same_seed(base_curve, run_curve):
    """The speed-up of one run over the baseline run of the same seed (moe_vs_dense: the
    dense run of seed s against the MoE run of seed s), from their validation curves
    [[step, loss]]: the step at which the baseline's curve first reaches the run's final
    loss (linear between evaluations) divided by the run's last step. Below 1 when the run
    ends worse than the baseline was at that step. When the baseline never reaches it
    within its run the value is censored: the speed-up is more than the baseline's last
    step / the run's, which is returned with censored True (a lower bound, not a value).
    None when either curve is empty."""
    if not base_curve or not run_curve or not run_curve[-1][0]:
        return None
    steps, target = run_curve[-1]
    c = crossing_step(base_curve, target)
    if c is None:
        return {"speedup": base_curve[-1][0] / steps, "censored": True, "target": target,
                "base_steps": None, "steps": steps}
    return {"speedup": c / steps, "censored": False, "target": target, "base_steps": c,
            "steps": steps}


def speedup_summary(results):
    """Per-seed speed-ups (speedup_same_seed of each run; None left out) over a setting:
    mean_std of the uncensored values plus "censored" (how many seeds only give a lower
    bound), "bound" (the smallest such bound) and "median" over all seeds with the censored
    ones ranked above every value (None when the median falls on a censored seed: then it
    is above "bound")."""
    rs = [r for r in results if r is not None]
    m = mean_std([r["speedup"] for r in rs if not r["censored"]])
    cens = [r["speedup"] for r in rs if r["censored"]]
    m["censored"] = len(cens)
    m["bound"] = min(cens) if cens else None
    m["seeds"] = len(rs)
    ranked = sorted(r["speedup"] for r in rs if not r["censored"]) + [math.inf] * len(cens)
    med = statistics.median(ranked) if ranked else None
    m["median"] = med if med is not None and math.isfinite(med) else None
    return m


def summarise_setting(name, overrides, runs, baseline_runs=None):
    """One setting over its seeds. runs: run_measures of every seed. baseline_runs: the
    baseline setting's runs (None for the baseline itself and when the experiment has
    none); each run's delta_val_loss is its val loss minus the baseline's of the same seed
    (same initial draw and data order, so most seed noise cancels), and its speed-up the
    same-seed speedup_same_seed on the two runs' validation curves; delta_curve_end is its
    validation curve's last value minus the baseline run's curve at that step."""
    ok = [r for r in runs if r["status"] == "ok"]
    speed = []
    if baseline_runs is not None:
        base = {r["seed"]: r for r in baseline_runs if r["status"] == "ok"}
        for r in ok:
            b = base.get(r["seed"])
            bv = b["val_loss"] if b else None
            r["delta_val_loss"] = r["val_loss"] - bv if bv is not None and r["val_loss"] is not None else None
            r["speedup"] = speedup_same_seed(b["curve_val"], r["curve_val"]) if b else None
            speed.append(r["speedup"])
            # At equal steps when the baseline trains longer (moe_vs_dense: dense 2x): the
            # run's last curve point minus the baseline's curve at that step.
            at = curve_at(b["curve_val"], r["curve_val"][-1][0]) if b and r["curve_val"] else None
            r["delta_curve_end"] = r["curve_val"][-1][1] - at if at is not None else None
            # The paired Δ over the steps both evaluated (delta_steps.png).
            r["curve_delta"] = paired_delta_curve(b["curve_val"], r["curve_val"]) if b else []
    metrics = {k: mean_std([r.get(k) for r in ok]) for k in METRICS}
    metrics["speedup"] = speedup_summary(speed)
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
        # Mean paired Δ over the seeds with its 95% t interval (with a baseline).
        "curve_delta": delta_band([r["curve_delta"] for r in ok if r.get("curve_delta")]),
    }


def _cells(runs_by_setting, baseline, key):
    """{setting: {seed: value}} of the finished runs for stats.blocked_paired_t. key
    "val_loss": each run's final validation loss. "curve_end": each run's validation curve's
    last value, and the baseline's curve at that step, which must be one step for every
    setting (moe_vs_dense: the dense baseline trains twice as long); None otherwise."""
    ok = {n: [r for r in runs if r["status"] == "ok"] for n, runs in runs_by_setting.items()}
    if key == "val_loss":
        return {n: {r["seed"]: r["val_loss"] for r in rs} for n, rs in ok.items()}
    ends = {r["curve_val"][-1][0] for n, rs in ok.items() if n != baseline for r in rs if r["curve_val"]}
    if len(ends) != 1 or baseline not in ok:
        return None
    step = ends.pop()
    cells = {n: {r["seed"]: r["curve_val"][-1][1] for r in rs if r["curve_val"]}
             for n, rs in ok.items() if n != baseline}
    cells[baseline] = {r["seed"]: curve_at(r["curve_val"], step) for r in ok[baseline]}
    return cells


def paired_tests(runs_by_setting, baseline, alpha=0.05, key="val_loss"):
    """stats.blocked_paired_t of every setting against the baseline on the runs' key (see
    _cells); None without a baseline or with fewer than two settings."""
    import stats
    if not baseline or baseline not in runs_by_setting or len(runs_by_setting) < 2:
        return None
    cells = _cells(runs_by_setting, baseline, key)
    return stats.blocked_paired_t(cells, baseline, alpha) if cells else None


def trend_in_experts(runs_by_setting, names, baseline):
    """stats.blocked_trend of the named settings' effects on log2 E (moe.num_experts), in the
    two-way fit of every setting's final validation loss (the baseline's and the others'
    runs give the residual variance). None when fewer than 3 runs or one E."""
    import stats
    xs = {}
    for n in names:
        experts = {r["num_experts"] for r in runs_by_setting.get(n, []) if r["status"] == "ok" and r.get("num_experts")}
        if len(experts) == 1:
            xs[n] = math.log2(experts.pop())
    cells = _cells(runs_by_setting, baseline, "val_loss") if baseline else None
    return stats.blocked_trend(cells, xs) if cells and xs else None
