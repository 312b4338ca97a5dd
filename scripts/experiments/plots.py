"""The experiment runner's figures (PNG, matplotlib's Agg backend), from summary.json's
content and each run's routing files. write_all returns the files it wrote:

  val_loss_steps.png    validation loss against steps, per setting the mean over seeds with
                        a ± one standard deviation band (the runs' own validation: the
                        config's train.eval_batches micro-batches every train.eval_every steps)
  val_loss_flops.png    the same against training FLOPs (steps x tokens per step x FLOPs
                        per token, measures.flops_per_token)
  train_loss_runs.png   every run's training cross-entropy (moving mean of 10 steps), one
                        colour per setting, each detected spike a dot, a diverged run's end a cross
  maxvio_steps.png      per-batch MaxVio (mean over the MoE layers; moving mean of 1/50 of
                        the run) per setting, mean over seeds and a ± std band
  dropped_steps.png     the dropped fraction likewise (only when some setting drops), the
                        start-up transient (the first 10% of the steps: dropped_start) shaded
                        apart from the steady state (the rest: dropped_steady)
  load_heatmaps.png     one seed per setting, each MoE layer: every expert's share of the
                        assignments (before dropping) over the logged steps
  specialisation.png    label/expert mutual information per setting normalised by its
                        ceiling min(H(label), log2 E) (0..1; mean ± std over seeds, each
                        setting's ceiling in bits under its name) and, for one seed per
                        setting, each label's share of its assignments sent to its
                        most-used expert (mean over MoE layers)
  delta_steps.png       (with a baseline) per non-baseline setting the paired Δ validation
                        loss (the run minus the baseline run of the same seed, at the steps
                        both evaluated: the run's own steps when the baseline trains longer)
                        against steps: one thin line per seed, the mean and its 95% t
                        interval over seeds (none with one seed), a zero line
  load_cumulative.png   one seed per MoE setting, the last 10% of its logged routing steps:
                        each MoE layer's expert shares sorted from the busiest, cumulative
                        share against the fraction of experts (layers overlaid, one panel
                        per setting); the diagonal is a uniform load
  quality_time.png      final validation loss (mean ± std over seeds) against the median
                        step time (mean ± std over seeds), one labelled point per setting
  loss_vs_lr.png        (settings that differ in train.lr) final validation loss mean ± std
                        against the learning rate, log x, one line per family (the
                        setting's name without its lr part);
                        each diverged run a cross at the top
  maxvio_frontier.png   (settings that differ in moe.aux_loss_coef or moe.expert_bias_rate)
                        final validation loss against MaxVio_global (the validation
                        sample's, mean over MoE layers), each seed a small dot and each
                        setting's mean ± std a labelled marker; the auxiliary-loss settings
                        that differ only in their coefficient joined by a line in alpha's
                        order (Wang et al.'s Fig. 2: lower left is better)
  bias_trajectories.png (settings with moe.expert_bias_rate > 0) one panel per such
                        setting, its first seed: every expert's bias in every MoE layer
                        over the logged steps (one colour per layer)
  router_logits.png     (settings that differ in moe.z_loss_coef) per run over the steps:
                        the logged z-loss divided by its coefficient, i.e. the mean over
                        tokens of logsumexp(router logits)^2, which grows with the logits
                        (the engine logs no router-logit norm, and computes z only when the
                        coefficient is above 0), and the router entropy (every run)
"""
import json
import math
import os
import re

import measures

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402


def _colors(n):
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _rolling(ys, w):
    out, acc, q = [], 0.0, []
    for y in ys:
        q.append(y)
        acc += y
        if len(q) > w:
            acc -= q.pop(0)
        out.append(acc / len(q))
    return out


def _save(fig, out, name, written):
    path = os.path.join(out, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(name)


def _first_ok(summary, name):
    return next((r for r in summary["runs"][name] if r["status"] == "ok"), None)


def _band(ax, xs, mean, std, color, label):
    ax.plot(xs, mean, color=color, label=label, lw=1.4)
    ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)],
                    color=color, alpha=0.2, lw=0)


def val_loss(summary, out, written):
    settings = summary["settings"]
    cols = _colors(len(settings))
    for fname, xlabel in (("val_loss_steps.png", "step"), ("val_loss_flops.png", "training FLOPs")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for s, c in zip(settings, cols):
            r = _first_ok(summary, s["name"])
            if not s["curve_val"] or not r:
                continue
            scale = 1.0 if fname.endswith("steps.png") else r["tokens_per_step"] * r["flops_per_token"]
            xs = [p[0] * scale for p in s["curve_val"]]
            _band(ax, xs, [p[1] for p in s["curve_val"]], [p[2] for p in s["curve_val"]], c,
                  "%s (%d seeds)" % (s["name"], s["ok"]))
        if summary.get("baseline_final_val_curve") is not None:
            ax.axhline(summary["baseline_final_val_curve"], color="grey", ls=":", lw=1,
                       label="%s final" % summary["baseline"])
        if fname.endswith("flops.png"):
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss (nats)")
        ax.set_title("%s: validation loss, mean ± std over seeds" % summary["experiment"], fontsize=10)
        ax.legend(fontsize=7)
        _save(fig, out, fname, written)


def train_loss(summary, out, written):
    settings = summary["settings"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for s, c in zip(settings, _colors(len(settings))):
        for i, r in enumerate(summary["runs"][s["name"]]):
            pts = [(st, v) for st, v in r["curve_ce"] if v is not None]
            if not pts:
                continue
            xs, ys = [p[0] for p in pts], _rolling([p[1] for p in pts], 10)
            ax.plot(xs, ys, color=c, lw=0.8, alpha=0.8, label=s["name"] if i == 0 else None)
            at = dict(zip(xs, ys))
            ax.plot([x for x in r["spikes"] if x in at], [at[x] for x in r["spikes"] if x in at],
                    "o", color=c, ms=4)
            if r["diverged"]:
                ax.plot([xs[-1]], [ys[-1]], "x", color=c, ms=8, mew=2)
    ax.set_xlabel("step")
    ax.set_ylabel("training cross-entropy (10-step mean)")
    ax.set_title("%s: every run (dot: spike, cross: diverged)" % summary["experiment"], fontsize=10)
    ax.legend(fontsize=7)
    _save(fig, out, "train_loss_runs.png", written)


def per_step(summary, out, written, key, fname, ylabel):
    settings = [s for s in summary["settings"] if any(r[key] for r in summary["runs"][s["name"]])]
    if not settings:
        return
    if key == "curve_dropped" and not any(v for s in settings for r in summary["runs"][s["name"]]
                                          for _, v in r[key] if v):
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bounds = []
    for s, c in zip(settings, _colors(len(settings))):
        curves = [dict(r[key]) for r in summary["runs"][s["name"]] if r["status"] == "ok" and r[key]]
        if not curves:
            continue
        steps = sorted(set.intersection(*[set(k for k, v in cv.items() if v is not None) for cv in curves]))
        w = max(1, len(steps) // 50)
        runs = [_rolling([cv[t] for t in steps], w) for cv in curves]
        mean = [sum(v) / len(v) for v in zip(*runs)]
        std = [(sum((x - m) ** 2 for x in v) / (len(v) - 1)) ** 0.5 if len(v) > 1 else 0.0
               for v, m in zip(zip(*runs), mean)]
        _band(ax, steps, mean, std, c, s["name"])
        if key == "curve_dropped" and steps:  # where the steady part (dropped_steady) starts
            bounds.append((steps[0], steps[min(len(measures.split_startup(steps)[0]), len(steps) - 1)]))
    if bounds:
        ax.axvspan(min(b[0] for b in bounds), max(b[1] for b in bounds), color="grey", alpha=0.15, lw=0,
                   label="start-up: first 10% of steps (dropped_start; the rest: dropped_steady)")
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title("%s: %s (moving mean), mean ± std over seeds" % (summary["experiment"], ylabel), fontsize=10)
    ax.legend(fontsize=7)
    _save(fig, out, fname, written)


def _routing_rows(summary, out):
    """(setting, seed, routing.jsonl records) of each setting's first finished seed that
    logged MoE layers."""
    rows = []
    for s in summary["settings"]:
        r = _first_ok(summary, s["name"])
        path = os.path.join(out, s["name"], "seed%d" % r["seed"], "routing.jsonl") if r else ""
        if r and os.path.isfile(path):
            recs = measures.read_jsonl(path)
            if recs and recs[0]["layers"]:
                rows.append((s["name"], r["seed"], recs))
    return rows


def heatmaps(summary, out, written):
    rows = _routing_rows(summary, out)
    if not rows:
        return
    layers = max(len(recs[0]["layers"]) for _, _, recs in rows)
    fig, axes = plt.subplots(len(rows), layers, figsize=(max(6.5, 3.6 * layers), 1.5 + 1.3 * len(rows)), squeeze=False)
    for i, (name, seed, recs) in enumerate(rows):
        for li in range(layers):
            ax = axes[i][li]
            if li >= len(recs[0]["layers"]):
                ax.axis("off")
                continue
            z = []
            for d in recs:
                c = d["tokens_per_expert"][li]
                tot = sum(c) or 1
                z.append([x / tot for x in c])
            zt = list(map(list, zip(*z)))  # experts x logged steps
            im = ax.imshow(zt, aspect="auto", cmap="viridis", interpolation="nearest",
                           extent=[recs[0]["step"], recs[-1]["step"], len(zt) - 0.5, -0.5])
            ax.set_title("%s seed %d, layer %d" % (name, seed, recs[0]["layers"][li]), fontsize=8)
            ax.set_ylabel("expert", fontsize=7)
            ax.tick_params(labelsize=6)
            fig.colorbar(im, ax=ax, fraction=0.04)
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize=7)
    fig.suptitle("%s: expert share of the assignments before dropping" % summary["experiment"], fontsize=10)
    _save(fig, out, "load_heatmaps.png", written)


def specialisation(summary, out, written):
    settings = [s for s in summary["settings"] if s["metrics"]["lang_mi_bits"]["mean"] is not None]
    if not settings:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    cols = _colors(len(settings))
    ms = [s["metrics"]["lang_mi_norm"] for s in settings]
    a1.bar(range(len(settings)), [m["mean"] or 0 for m in ms], yerr=[m["std"] or 0 for m in ms],
           color=cols, capsize=3)
    a1.set_xticks(range(len(settings)))
    ceil = []
    for s in settings:
        cs = [r["lang_mi_ceiling"] for r in summary["runs"][s["name"]] if r.get("lang_mi_ceiling")]
        ceil.append(sum(cs) / len(cs) if cs else None)
    a1.set_xticklabels(["%s\n(ceiling %.2f bits)" % (s["name"], c) if c else s["name"]
                        for s, c in zip(settings, ceil)], rotation=30, ha="right", fontsize=6)
    a1.set_ylim(0, 1)
    a1.set_ylabel("I(label; expert) / min(H(label), log2 E)\n(ceiling in bits under each setting)",
                  fontsize=8)
    a1.set_title("specialisation: MI over its ceiling, mean ± std over seeds", fontsize=9)
    width = 0.8 / len(settings)
    labels = None
    for i, (s, c) in enumerate(zip(settings, cols)):
        r = _first_ok(summary, s["name"])
        path = os.path.join(out, s["name"], "seed%d" % r["seed"], "routing_by_language.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            lang = json.load(f)
        labels = lang["labels"]
        shares = []
        for li, lab in enumerate(labels):
            vals = [max(t[li]) / sum(t[li]) for t in lang["counts"] if sum(t[li])]
            shares.append(sum(vals) / len(vals) if vals else 0.0)
        a2.bar([j + i * width for j in range(len(labels))], shares, width, color=c, label=s["name"])
    if labels:
        a2.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))])
        a2.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
    a2.set_ylabel("share sent to the label's top expert")
    a2.set_title("per label (one seed, mean over MoE layers)", fontsize=9)
    a2.legend(fontsize=6)
    _save(fig, out, "specialisation.png", written)


def _grid(n, w=4.2, h=3.2, cols_max=3):
    cols = min(cols_max, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(max(8.0, w * cols), h * rows + 0.6), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n:]:
        ax.axis("off")
    return fig, flat[:n]


def delta_steps(summary, out, written):
    if not summary.get("baseline"):
        return
    settings = [s for s in summary["settings"] if s["name"] != summary["baseline"]
                and any(r.get("curve_delta") for r in summary["runs"][s["name"]])]
    if not settings:
        return
    fig, axes = _grid(len(settings))
    # Each setting keeps the colour it has in the other figures (the baseline's stays unused).
    color_of = dict(zip([s["name"] for s in summary["settings"]], _colors(len(summary["settings"]))))
    for s, ax in zip(settings, axes):
        c = color_of[s["name"]]
        for r in summary["runs"][s["name"]]:
            if r.get("curve_delta"):
                ax.plot([p[0] for p in r["curve_delta"]], [p[1] for p in r["curve_delta"]],
                        color=c, lw=0.6, alpha=0.6)
        band = s.get("curve_delta") or []
        n = sum(1 for r in summary["runs"][s["name"]] if r.get("curve_delta"))
        if band:
            xs = [p[0] for p in band]
            ax.plot(xs, [p[1] for p in band], color=c, lw=1.8, label="mean of %d seed%s" % (n, "s" * (n > 1)))
            if band[0][2] is not None:
                ax.fill_between(xs, [p[2] for p in band], [p[3] for p in band], color=c, alpha=0.2,
                                lw=0, label="95% t interval")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title("%s - %s" % (s["name"], summary["baseline"]), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.set_ylabel("Δ validation loss (nats)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.suptitle("%s: paired Δ validation loss against the same seed's %s run (thin: each seed)"
                 % (summary["experiment"], summary["baseline"]), fontsize=10)
    _save(fig, out, "delta_steps.png", written)


def load_cumulative(summary, out, written):
    rows = _routing_rows(summary, out)
    if not rows:
        return
    fig, axes = _grid(len(rows), w=3.4, h=3.2, cols_max=4)
    for (name, seed, recs), ax in zip(rows, axes):
        tail = max(1, len(recs) // 10)
        for li, counts in enumerate(measures.routing_tail_counts(recs)):
            xs, ys = measures.cumulative_shares(counts)
            ax.plot(xs, ys, marker=".", ms=3, lw=1.2, label="layer %d" % recs[0]["layers"][li])
        ax.plot([0, 1], [0, 1], color="grey", ls=":", lw=1, label="uniform")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.set_title("%s seed %d (last %d of %d logged steps)" % (name, seed, tail, len(recs)), fontsize=7)
        ax.set_xlabel("fraction of experts (busiest first)", fontsize=7)
        ax.set_ylabel("cumulative share of assignments", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=6, loc="lower right")
    fig.suptitle("%s: expert load as sorted cumulative shares, end of training (one panel per "
                 "setting, MoE layers overlaid)" % summary["experiment"], fontsize=9)
    _save(fig, out, "load_cumulative.png", written)


def _step_time(summary, s):
    """(ms, [err below, err above], how) of a setting's step: the timing pass's median and
    range when the runner timed the settings alone (timing.json), else the training runs'
    median steps, mean ± std over seeds."""
    t = ((summary.get("timing") or {}).get("per_setting") or {}).get(s["name"])
    if t:
        m = t["median"] * 1000
        return m, [m - t["min"] * 1000, t["max"] * 1000 - m], "alone"
    st = s["metrics"]["step_s"]
    if st["mean"] is None:
        return None, None, None
    e = (st["std"] or 0) * 1000
    return st["mean"] * 1000, [e, e], "runs"


def quality_time(summary, out, written):
    pts = [(s, _step_time(summary, s)) for s in summary["settings"]
           if s["metrics"]["val_loss"]["mean"] is not None]
    pts = [(s, t) for s, t in pts if t[0] is not None]
    if len(pts) < 2:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (s, (ms, err, _)), c in zip(pts, _colors(len(pts))):
        v = s["metrics"]["val_loss"]
        ax.errorbar([ms], [v["mean"]], xerr=[[err[0]], [err[1]]], yerr=[v["std"] or 0],
                    fmt="o", color=c, capsize=3, ms=5, label=s["name"])
        ax.annotate(s["name"], (ms, v["mean"]), textcoords="offset points", xytext=(5, 4),
                    fontsize=7)
    if all(t[2] == "alone" for _, t in pts):
        tm = summary["timing"]
        ax.set_xlabel("step time (ms): each setting alone on the machine, median of %d rounds of "
                      "%d steps [range]" % (tm["rounds"], tm["steps"]))
    else:
        ax.set_xlabel("step time (ms, median of each run; mean ± std over seeds)")
    ax.set_ylabel("final validation loss (nats; mean ± std)")
    ax.set_title("%s: quality against step time (lower left is better)" % summary["experiment"], fontsize=10)
    ax.legend(fontsize=7)
    _save(fig, out, "quality_time.png", written)


def _rounded(x):
    return float("%.6g" % x) if x is not None else None


def setting_value(summary, s, run_key, override):
    """A setting's value of a config key: its first run's (from the resolved config), else
    the last `override=` among the setting's and the experiment's --set overrides."""
    for r in summary["runs"][s["name"]]:
        if r.get(run_key) is not None:
            return _rounded(r[run_key])
    v = None
    for kv in list(s["overrides"]) + list(summary.get("extra_sets") or []):
        k, _, val = kv.partition("=")
        if k == override:
            v = float(val)
    return _rounded(v)


def loss_vs_lr(summary, out, written):
    settings = summary["settings"]
    lrs = [setting_value(summary, s, "lr", "train.lr") for s in settings]
    if len(set(x for x in lrs if x is not None)) < 2:
        return
    # One line per family: the setting's name without its learning-rate part (zloss's
    # "lr0.01-z0" and "lr0.02-z0" are the family "z0"; moe_vs_dense's pre-sweep has "dense"
    # and "top1-e16").
    fams = [re.sub(r"lr[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?", "", s["name"]).replace("--", "-").strip("-")
            or s["name"] for s in settings]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    groups = sorted(set(fams), key=fams.index)
    trans = matplotlib.transforms.blended_transform_factory(ax.transData, ax.transAxes)
    for gi, (fam, c) in enumerate(zip(groups, _colors(len(groups)))):
        pts = sorted(((lr, s) for lr, f, s in zip(lrs, fams, settings) if f == fam and lr is not None),
                     key=lambda p: p[0])
        line = [(lr, s["metrics"]["val_loss"]) for lr, s in pts if s["metrics"]["val_loss"]["mean"] is not None]
        ax.errorbar([lr for lr, _ in line], [m["mean"] for _, m in line], yerr=[m["std"] or 0 for _, m in line],
                    fmt="o-" if gi % 2 == 0 else "s--", color=c, capsize=3, ms=4, label=fam)
        for lr, s in pts:
            for k in range(s["diverged"]):  # each diverged run a cross at the top, side by side
                ax.plot([lr * (1 + 0.04 * (k + gi * 3))], [0.96], "x", color=c, ms=8, mew=2,
                        transform=trans, clip_on=False)
    ax.plot([], [], "x", color="grey", ms=8, mew=2, label="diverged run (at the top)")
    ax.set_xscale("log")
    ticks = sorted(set(x for x in lrs if x is not None))
    ax.set_xticks(ticks)
    ax.set_xticklabels(["%g" % x for x in ticks], fontsize=7)
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("learning rate (train.lr)")
    ax.set_ylabel("final validation loss (nats; finished seeds, mean ± std)")
    ax.set_title("%s: final loss against the learning rate" % summary["experiment"], fontsize=10)
    ax.legend(fontsize=7)
    _save(fig, out, "loss_vs_lr.png", written)


def maxvio_frontier(summary, out, written):
    settings = [s for s in summary["settings"] if s["metrics"]["val_loss"]["mean"] is not None
                and s["metrics"]["maxvio_global"]["mean"] is not None]
    knobs = [(setting_value(summary, s, "aux_loss_coef", "moe.aux_loss_coef"),
              setting_value(summary, s, "expert_bias_rate", "moe.expert_bias_rate")) for s in settings]
    if len(set(knobs)) < 2:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    colors = _colors(len(settings))
    for s, (aux, bias), c in zip(settings, knobs, colors):
        runs = [r for r in summary["runs"][s["name"]] if r.get("val_loss") is not None
                and r.get("maxvio_global") is not None]
        ax.plot([r["maxvio_global"] for r in runs], [r["val_loss"] for r in runs], ".", color=c,
                ms=4, alpha=0.6)
        v, m = s["metrics"]["val_loss"], s["metrics"]["maxvio_global"]
        ax.errorbar([m["mean"]], [v["mean"]], xerr=[m["std"] or 0], yerr=[v["std"] or 0],
                    fmt="D" if bias else "o", color=c,
                    capsize=3, ms=6, label=s["name"])
        ax.annotate(s["name"], (m["mean"], v["mean"]), textcoords="offset points", xytext=(5, 4),
                    fontsize=7)
    # The alpha sweeps: settings without the bias whose names differ only in the aux number.
    fams = {}
    for s, (aux, bias) in zip(settings, knobs):
        if aux is not None and not bias:
            fam = re.sub(r"aux[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?", "aux", s["name"])
            fams.setdefault(fam, []).append((aux, s))
    for fam, members in fams.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda p: p[0])
        ax.plot([s["metrics"]["maxvio_global"]["mean"] for _, s in members],
                [s["metrics"]["val_loss"]["mean"] for _, s in members], "-", color="grey", lw=0.8,
                zorder=0)
        for aux, s in members:
            ax.annotate("a=%g" % aux, (s["metrics"]["maxvio_global"]["mean"], s["metrics"]["val_loss"]["mean"]),
                        textcoords="offset points", xytext=(5, -9), fontsize=6, color="grey")
    ax.plot([], [], "-", color="grey", lw=0.8, label="aux-loss sweep (alpha)")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.3g"))
    ax.set_xlabel("MaxVio_global (validation sample, mean over MoE layers; log)")
    ax.set_ylabel("final validation loss (nats; dots: seeds)")
    ax.set_title("%s: quality against balance (circles: aux loss, diamonds: expert bias; lower "
                 "left is better)" % summary["experiment"], fontsize=9)
    ax.legend(fontsize=6)
    _save(fig, out, "maxvio_frontier.png", written)


def bias_trajectories(summary, out, written):
    panels = []
    for s in summary["settings"]:
        if not (setting_value(summary, s, "expert_bias_rate", "moe.expert_bias_rate") or 0) > 0:
            continue
        for r in summary["runs"][s["name"]]:
            path = os.path.join(out, s["name"], "seed%d" % r["seed"], "routing.jsonl")
            got = measures.bias_curves(path) if os.path.isfile(path) else None
            if got:
                panels.append((s["name"], r["seed"], got))
                break
    if not panels:
        return
    fig, axes = _grid(len(panels))
    for ax, (name, seed, (steps, layers, biases)) in zip(axes, panels):
        for l, c in zip(range(len(biases)), _colors(len(biases))):
            for e, ys in enumerate(biases[l]):
                ax.plot(steps, ys, color=c, lw=0.6, alpha=0.8, label="layer %s" % layers[l] if e == 0 else None)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title("%s (seed %d)" % (name, seed), fontsize=8)
        ax.set_xlabel("step", fontsize=7)
        ax.set_ylabel("expert bias", fontsize=7)
        ax.tick_params(labelsize=6)
        ax.legend(fontsize=6)
    fig.suptitle("%s: every expert's bias over the steps (one line per expert)" % summary["experiment"],
                 fontsize=10)
    _save(fig, out, "bias_trajectories.png", written)


def router_logits(summary, out, written):
    settings = summary["settings"]
    zs = [setting_value(summary, s, "z_loss_coef", "moe.z_loss_coef") or 0.0 for s in settings]
    if len(set(zs)) < 2:
        return
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.2))
    drew = False
    for s, z, c in zip(settings, zs, _colors(len(settings))):
        for i, r in enumerate(summary["runs"][s["name"]]):
            path = os.path.join(out, s["name"], "seed%d" % r["seed"], "metrics.jsonl")
            cur = measures.router_curves(path) if os.path.isfile(path) else []
            cur = [p for p in cur if p[1] is not None and math.isfinite(p[1]) and p[2] is not None
                   and math.isfinite(p[2])]
            if not cur:
                continue
            w = max(1, len(cur) // 50)
            steps = [p[0] for p in cur]
            label = s["name"] if i == 0 else None
            # router_lse_sq, logged whatever the coefficient; z / coef from older logs.
            if all(p[3] is not None and math.isfinite(p[3]) for p in cur):
                size = [p[3] for p in cur]
            else:
                size = [p[1] / z for p in cur] if z > 0 else None
            if size is not None:
                a1.plot(steps, _rolling(size, w), color=c, lw=0.9, label=label,
                        ls="-" if z > 0 else "--")
                drew = True
            a2.plot(steps, _rolling([p[2] for p in cur], w), color=c, lw=0.9, label=label,
                    ls="-" if z > 0 else "--")
    if drew:
        a1.set_yscale("log")
        # Label the decades only: labelled minor ticks overlap once the runs span several.
        a1.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.3g"))
        a1.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    a1.set_xlabel("step")
    a1.set_ylabel("mean logsumexp(router logits)^2 (= z-loss / coefficient)")
    a1.set_title("router logit size, every run (dashed: z-loss 0)", fontsize=8)
    a1.legend(fontsize=6)
    a2.set_xlabel("step")
    a2.set_ylabel("router entropy (nats; mean over MoE layers)")
    a2.set_title("router entropy, every run (dashed: z-loss 0)", fontsize=8)
    a2.legend(fontsize=6)
    fig.suptitle("%s: router statistics per run (moving mean of 1/50 of the run)" % summary["experiment"],
                 fontsize=10)
    _save(fig, out, "router_logits.png", written)


def write_all(summary, out):
    written = []
    val_loss(summary, out, written)
    train_loss(summary, out, written)
    per_step(summary, out, written, "curve_maxvio", "maxvio_steps.png", "MaxVio per batch")
    per_step(summary, out, written, "curve_dropped", "dropped_steps.png", "dropped fraction")
    heatmaps(summary, out, written)
    specialisation(summary, out, written)
    delta_steps(summary, out, written)
    load_cumulative(summary, out, written)
    quality_time(summary, out, written)
    loss_vs_lr(summary, out, written)
    maxvio_frontier(summary, out, written)
    bias_trajectories(summary, out, written)
    router_logits(summary, out, written)
    return written
