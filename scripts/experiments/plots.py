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
  dropped_steps.png     the dropped fraction likewise (only when some setting drops)
  load_heatmaps.png     one seed per setting, each MoE layer: every expert's share of the
                        assignments (before dropping) over the logged steps
  specialisation.png    label/expert mutual information per setting (mean ± std over seeds)
                        and, for one seed per setting, each label's share of its
                        assignments sent to its most-used expert (mean over MoE layers)
"""
import json
import os

import matplotlib

matplotlib.use("Agg")
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
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title("%s: %s (moving mean), mean ± std over seeds" % (summary["experiment"], ylabel), fontsize=10)
    ax.legend(fontsize=7)
    _save(fig, out, fname, written)


def heatmaps(summary, out, written):
    rows = []
    for s in summary["settings"]:
        r = _first_ok(summary, s["name"])
        path = os.path.join(out, s["name"], "seed%d" % r["seed"], "routing.jsonl") if r else ""
        if r and os.path.isfile(path):
            with open(path) as f:
                recs = [json.loads(line) for line in f if line.strip()]
            if recs and recs[0]["layers"]:
                rows.append((s["name"], r["seed"], recs))
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
    ms = [s["metrics"]["lang_mi_bits"] for s in settings]
    a1.bar(range(len(settings)), [m["mean"] for m in ms], yerr=[m["std"] or 0 for m in ms],
           color=cols, capsize=3)
    a1.set_xticks(range(len(settings)))
    a1.set_xticklabels([s["name"] for s in settings], rotation=30, ha="right", fontsize=7)
    a1.set_ylabel("label / expert mutual information (bits)")
    a1.set_title("specialisation, mean ± std over seeds", fontsize=9)
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


def write_all(summary, out):
    written = []
    val_loss(summary, out, written)
    train_loss(summary, out, written)
    per_step(summary, out, written, "curve_maxvio", "maxvio_steps.png", "MaxVio per batch")
    per_step(summary, out, written, "curve_dropped", "dropped_steps.png", "dropped fraction")
    heatmaps(summary, out, written)
    specialisation(summary, out, written)
    return written
