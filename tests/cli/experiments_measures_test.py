#!/usr/bin/python3
"""scripts/experiments/measures.py on hand-computed cases: the spike rule, the mean ± std
over seeds, the crossing step and the same-seed speed-up (censored when the baseline never
gets there), the mean curve, the dropped fraction's start-up and steady parts, the
normalised label/expert MI, the paired Δ curve and its t band, sorted cumulative loads,
the router curves, and FLOPs per token of a
hand-counted config (tests/cli/experiments_cli_test.sh checks the same formula against
`switchyard train --dry-run` on every run of the ci grids).
    experiments_measures_test.py path/to/scripts/experiments
"""
import math
import os
import sys

sys.path.insert(0, os.path.abspath(sys.argv[1]))
import measures  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402


def series(values, first=0):
    return [(first + i, v) for i, v in enumerate(values)]


# Spikes (windows of 50 steps): a flat loss has none; one step at 2.1x the mean before it
# is one, 1.95x is not (and lifts the 50-step mean by only 1.9%); a sustained 25% rise
# trips the window rule when 41 of 50 steps are up (2.5 x 41 + 2 x 9 > 1.2 x 100); 10% does
# not; NaN is a spike; a jump inside the warmup is not counted.
flat = [2.0] * 200
check("flat", measures.find_spikes(series(flat), warmup=0)[0] == [])
spikes, worst, worst_step = measures.find_spikes(series(flat[:120] + [4.2] + flat[:79]), warmup=0)
check("one step at 2.1x", spikes == [120], spikes)
check("step ratio", abs(worst_step - 2.1) < 1e-12, worst_step)
spikes, worst, worst_step = measures.find_spikes(series(flat[:120] + [3.9] + flat[:79]), warmup=0)
check("one step at 1.95x", spikes == [], spikes)
check("window ratio of one step", abs(worst - (49 * 2.0 + 3.9) / 50 / 2.0) < 1e-12, worst)
rise = flat[:120] + [2.5] * 80
check("sustained 25% rise", measures.find_spikes(series(rise), warmup=0)[0] == [160], measures.find_spikes(series(rise), 0)[0])
check("10% rise", measures.find_spikes(series(flat[:120] + [2.2] * 80), warmup=0)[0] == [])
check("nan", measures.find_spikes(series(flat[:120] + [float("nan"), None]), warmup=0)[0] == [120])
early = [2.0] * 60 + [5.0] + [2.0] * 100
check("spike inside warmup", measures.find_spikes(series(early), warmup=100)[0] == [])
check("same spike after warmup", measures.find_spikes(series(early), warmup=0)[0] == [60])

# mean ± sample std: 1, 2, 3, 4 -> 2.5 and sqrt(5/3); None and NaN left out; one value, no std.
m = measures.mean_std([1.0, 2.0, None, 3.0, float("nan"), 4.0])
check("mean", m["mean"] == 2.5 and m["n"] == 4, m)
check("std", abs(m["std"] - math.sqrt(5.0 / 3.0)) < 1e-15, m)
check("one value", measures.mean_std([7.0]) == {"mean": 7.0, "std": None, "n": 1, "values": [7.0]})
check("no value", measures.mean_std([None])["mean"] is None)

# Crossing: between steps 100 (4.0) and 200 (3.0), 3.25 is reached at step 175.
curve = [[0, 6.0], [100, 4.0], [200, 3.0], [300, 2.5]]
check("crossing", measures.crossing_step(curve, 3.25) == 175.0, measures.crossing_step(curve, 3.25))
check("never", measures.crossing_step(curve, 2.0) is None)
check("mean curve", measures.mean_curve([[[0, 1.0], [10, 3.0]], [[0, 3.0], [10, 5.0], [20, 1.0]]])
      == [[0, 2.0, math.sqrt(2.0)], [10, 4.0, math.sqrt(2.0)]])


def fake(seed, curve, status="ok"):
    return {"status": status, "seed": seed, "diverged": status == "diverged", "spiked": False,
            "stable": status == "ok", "curve_val": curve, "val_loss": curve[-1][1]}


# Speed-up, same seed: the baseline (dense) run of every seed has `curve` (3.25 at step 175).
# Seed 1's run ends at 3.25 after 150 steps: 175/150 = 1.1667. Seed 2's ends at 3.5 after 200
# steps, which dense reached at step 150 (4.0 -> 3.0 over 100..200): 150/200 = 0.75, below 1.
# Seed 3's ends at 2.0, which dense never reaches in its 300 steps: censored, more than
# 300/200 = 1.5. Seed 4 diverged: counted, not averaged, no speed-up.
check("same seed", measures.speedup_same_seed(curve, [[0, 6.0], [100, 3.5], [150, 3.25]])
      == {"speedup": 175 / 150, "censored": False, "target": 3.25, "base_steps": 175.0, "steps": 150})
check("censored", measures.speedup_same_seed(curve, [[0, 6.0], [200, 2.0]])
      == {"speedup": 1.5, "censored": True, "target": 2.0, "base_steps": None, "steps": 200})
runs = [fake(1, [[0, 6.0], [100, 3.5], [150, 3.25]]), fake(2, [[0, 6.0], [100, 4.0], [200, 3.5]]),
        fake(3, [[0, 6.0], [200, 2.0]]), fake(4, [[0, 6.0]], "diverged")]
s = measures.summarise_setting("moe", ["moe.num_experts=8"], runs,
                               baseline_runs=[fake(i, curve) for i in (1, 2, 3, 4)])
sp = s["metrics"]["speedup"]
check("speed-up values", sp["values"] == [175 / 150, 0.75] and sp["censored"] == 1 and sp["bound"] == 1.5
      and sp["seeds"] == 3, sp)
# The median of 0.75, 1.1667 and (> 1.5) is 1.1667; with two censored seeds of three it lies
# above the bound (None).
check("speed-up median", abs(sp["median"] - 175 / 150) < 1e-15, sp)
check("median censored", measures.speedup_summary(
    [{"speedup": 0.9, "censored": False}, {"speedup": 1.5, "censored": True},
     {"speedup": 1.5, "censored": True}])["median"] is None)
check("counts", (s["runs"], s["ok"], s["diverged"], s["stable"]) == (4, 3, 1, 3), s)
# Paired by seed: 3.25 - 2.5, 3.5 - 2.5, 2.0 - 2.5 (seed 4 diverged: no pair).
dv = s["metrics"]["delta_val_loss"]
check("delta", dv["values"] == [0.75, 1.0, -0.5], dv)
# The curve at a step (linear between evaluations) and Δ at the run's last step: dense's
# curve is 3.5 at step 150 and 3.0 at 200, so 3.25 - 3.5, 3.5 - 3.0, 2.0 - 3.0.
check("curve at", (measures.curve_at(curve, 150), measures.curve_at(curve, 300), measures.curve_at(curve, 350),
                   measures.curve_at(curve, -10)) == (3.5, 2.5, None, None))
dc = s["metrics"]["delta_curve_end"]
check("delta at the run's end", dc["values"] == [-0.25, 0.5, -1.0], dc)
# Each run's paired Δ curve at the steps both evaluated, and the band at the steps every
# seed has (only step 0, where every Δ is 0: a zero-width interval).
check("run delta curves", [r["curve_delta"] for r in runs[:3]] ==
      [[[0, 0.0], [100, -0.5]], [[0, 0.0], [100, 0.0], [200, 0.5]], [[0, 0.0], [200, -1.0]]],
      [r.get("curve_delta") for r in runs])
check("setting delta band", s["curve_delta"] == [[0, 0.0, 0.0, 0.0]], s["curve_delta"])

# FLOPs per token, counted by hand: d 8, L 2, S 4, V 10, 2 heads, d_ff 16, layer 1 MoE with
# 4 experts of 6 (top-2, gelu): attention 4*64 per layer; MLP 2*8*16; router 8*4;
# experts 2*2*8*6; head 8*10 -> 6 * (512 + 256 + 32 + 192 + 80) + 12 * 2 * 4 * 8.
cfg = {"model": {"d_model": 8, "n_layers": 2, "seq_len": 4, "vocab_size": 10, "n_heads": 2,
                 "n_kv_heads": 0, "d_ff": 16, "activation": "gelu"},
       "moe": {"num_experts": 4, "layer_freq": 2, "top_k": 2, "d_expert": 6, "activation": "gelu",
               "num_shared_experts": 0, "d_shared": 0},
       "train": {"micro_batch_size": 3, "grad_accum": 2}}
check("flops", measures.flops_per_token(cfg) == 6.0 * 1072 + 768, measures.flops_per_token(cfg))
check("tokens per step", measures.tokens_per_step(cfg) == 24)
cfg["moe"]["layer_freq"] = 1000  # dense: layer 1 is an MLP too
check("dense flops", measures.flops_per_token(cfg) == 6.0 * (512 + 512 + 80) + 768)

# The validation sample (val_sample.py) of a hand-made corpus: 2 val documents of 300 and
# 700 tokens (token i = i), 4 blocks of 100 at offsets 0, 300, 600, 900 in bit-reversed
# order (0, 600, 300, 900); documents cut at the boundaries, labels kept, totals summed.
import json, struct, tempfile  # noqa: E402,E401
import val_sample  # noqa: E402
from array import array  # noqa: E402
src = tempfile.mkdtemp()
val_sample._write_shard(os.path.join(src, "train-00000.bin"), array("H", [5] * 10))
val_sample._write_shard(os.path.join(src, "val-00000.bin"), array("H", range(1000)))
open(os.path.join(src, "tokenizer.model"), "w").close()
index = {"format": "switchyard-tokens", "version": 1, "vocab_size": 1000, "tokenizer": "tokenizer.model",
         "labels": ["a", "b"],
         "totals": {"a": {"train": {"documents": 1, "tokens": 10}, "val": {"documents": 1, "tokens": 300}},
                    "b": {"train": {"documents": 0, "tokens": 0}, "val": {"documents": 1, "tokens": 700}}},
         "shards": [{"name": "train-00000.bin", "split": "train", "tokens": 10},
                    {"name": "val-00000.bin", "split": "val", "tokens": 1000}],
         "documents": [{"split": "train", "shard": 0, "offset": 0, "tokens": 10, "label": "a"},
                       {"split": "val", "shard": 1, "offset": 0, "tokens": 300, "label": "a"},
                       {"split": "val", "shard": 1, "offset": 300, "tokens": 700, "label": "b"}]}
json.dump(index, open(os.path.join(src, "index.json"), "w"))
dst = os.path.join(src, "sample")
check("sample size", val_sample.make(src, dst, blocks=4, block=100) == 400)
got = list(val_sample._read_shard(os.path.join(dst, "val-00000.bin")))
check("sample tokens", got == list(range(0, 100)) + list(range(600, 700)) + list(range(300, 400)) + list(range(900, 1000)), got[:5])
raw = open(os.path.join(dst, "val-00000.bin"), "rb").read()
h = 0xcbf29ce484222325
for b in raw[32:]:
    h = ((h ^ b) * 0x100000001b3) % 2 ** 64
check("header", raw[:24] == b"SYTOKENS" + struct.pack("<IIQ", 1, 2, 400) and struct.unpack("<Q", raw[24:32])[0] == h)
new = json.load(open(os.path.join(dst, "index.json")))
vd = [(d["offset"], d["tokens"], d["label"]) for d in new["documents"] if d["split"] == "val"]
check("sample documents", vd == [(0, 100, "a"), (100, 100, "b"), (200, 100, "b"), (300, 100, "b")], vd)
check("sample totals", new["totals"]["a"]["val"] == {"documents": 1, "tokens": 100} and
      new["totals"]["b"]["val"] == {"documents": 3, "tokens": 300}, new["totals"])
check("train shard linked", os.path.realpath(os.path.join(dst, "train-00000.bin")) == os.path.join(os.path.realpath(src), "train-00000.bin"))
check("small split kept whole", val_sample.make(src, os.path.join(src, "s2"), blocks=16, block=100) is None)

# summary.md's cells: mean ± std, and how many seeds a mean covers when not all of them
# have a value (a speed-up exists only for the runs that reached the baseline's loss).
import summary_md  # noqa: E402
m = measures.mean_std([1.5, None, 0.5])
check("cell n of ok", summary_md.cell(m, "%.2fx", 1, 3) == "1.00x ± 0.71 (2 of 3)", summary_md.cell(m, "%.2fx", 1, 3))
check("cell all seeds", summary_md.cell(measures.mean_std([0.25, 0.75]), "%.2f%%", 100, 2) == "50.00% ± 35.36",
      summary_md.cell(measures.mean_std([0.25, 0.75]), "%.2f%%", 100, 2))
check("cell none", summary_md.cell(measures.mean_std([None]), "%.4f", 1, 1) == "-")

# The speed-up cell with a censored seed, and the Δ cell (mean ± pooled SE, p).
check("speed-up cell", summary_md.speedup_cell(sp, 3) == "median 1.17x; 1 of 3 censored (> 1.50x); others 1.17x, 0.75x",
      summary_md.speedup_cell(sp, 3))
check("speed-up cell uncensored", summary_md.speedup_cell(measures.speedup_summary(
    [{"speedup": 1.0, "censored": False}, {"speedup": 1.5, "censored": False}]), 2) == "1.25x ± 0.35",
    summary_md.speedup_cell(measures.speedup_summary([{"speedup": 1.0, "censored": False}, {"speedup": 1.5, "censored": False}]), 2))
check("delta cell", summary_md.delta_cell({"mean": 0.02, "se": 0.0057735, "p": 0.0257}) == "+0.0200 ± 0.0058 (p 0.026)")

# The start-up transient and the steady state of the dropped fraction: 10 steps, one MoE
# layer of 100 assignments each, 50 dropped at step 0 and 10 at every other step: the first
# 10% (1 step) drops 50%, the other 9 steps 10%, the run (50 + 90) / 1000 = 14%.
recs = [{"step": i, "moe": [{"assignments": 100, "dropped": 50 if i == 0 else 10}]} for i in range(10)]
head, rest = measures.split_startup(recs)
check("start-up split", (len(head), len(rest)) == (1, 9))
check("dropped start/steady/run", (measures.dropped(head), measures.dropped(rest), measures.dropped(recs))
      == (0.5, 0.1, 0.14), (measures.dropped(head), measures.dropped(rest), measures.dropped(recs)))
check("start-up of 25 steps", len(measures.split_startup(list(range(25)))[0]) == 2)
check("start-up of 3 steps", measures.split_startup([0, 1, 2]) == ([0], [1, 2]))
check("no assignments", measures.dropped([{"step": 0, "moe": [{"assignments": 0, "dropped": 0}]}]) is None)

# Normalised label/expert MI. Two labels, 100 tokens each, 4 experts: label a all to expert
# 0, label b all to expert 1: I = H(label) = 1 bit = the ceiling min(1, log2 4) -> 1.
# Independent routing (each label spread 25/25/25/25): I = 0 -> 0. A layer with four labels
# of 50 tokens each and 2 experts, a and b to expert 0, c and d to expert 1: H(label) = 2,
# log2 E = 1, I = 1 bit = the ceiling -> 1 (its ceiling 1 bit). Mixed: label a 75/25 over
# experts 0/1, label b 25/75: I = 1 - H(0.75) = 1 - 0.811278 = 0.188722 bits, ceiling 1.
sep = [[100, 0, 0, 0], [0, 100, 0, 0]]
ind = [[25, 25, 25, 25], [25, 25, 25, 25]]
four = [[50, 0], [50, 0], [0, 50], [0, 50]]
mixed = [[75, 25], [25, 75]]
hb = -(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25))
check("mi separated", measures.label_mi_normalised([sep]) == (1.0, 1.0), measures.label_mi_normalised([sep]))
check("mi independent", measures.label_mi_normalised([ind])[0] == 0.0)
n, c = measures.label_mi_normalised([four])
check("mi capped by log2 E", abs(n - 1.0) < 1e-12 and c == 1.0, (n, c))
n, c = measures.label_mi_normalised([mixed])
check("mi mixed", abs(n - (1 - hb)) < 1e-12 and c == 1.0, (n, c))
# Two layers: the mean of the ratios (1 and 0) and of the ceilings (1 bit each); an empty
# layer and a one-label layer (ceiling 0) are left out.
n, c = measures.label_mi_normalised([sep, ind, [[0, 0], [0, 0]], [[10, 5], [0, 0]]])
check("mi mean over layers", (n, c) == (0.5, 1.0), (n, c))
check("mi none", measures.label_mi_normalised([[[0, 0]]]) == (None, None))
# Unequal labels: a 300 tokens to expert 0, b 100 to expert 1, 4 experts: I = H(label) =
# H(0.75) = 0.811278 bits, the ceiling (below log2 4 = 2): ratio 1.
n, c = measures.label_mi_normalised([[[300, 0, 0, 0], [0, 100, 0, 0]]])
check("mi ceiling H(label)", abs(n - 1.0) < 1e-12 and abs(c - hb) < 1e-12, (n, c))

# The paired Δ curve: at the steps both evaluated, over the run's steps only (the baseline
# trains twice as long; its step 300 has no pair, and the run's step 50 none either).
base = [[0, 6.0], [100, 4.0], [200, 3.0], [300, 2.5]]
run = [[0, 6.0], [50, 5.0], [100, 3.5], [200, 3.25]]
check("paired delta curve", measures.paired_delta_curve(base, run) == [[0, 0.0], [100, -0.5], [200, 0.25]],
      measures.paired_delta_curve(base, run))
# The band over seeds: Δ at step 100 of 3 seeds -0.5, -0.3, -0.1: mean -0.3, sd 0.2, SE
# 0.2 / sqrt(3), t_{0.975, 2} = 4.302653 -> ± 0.496828. One seed: no interval. Only the
# steps every seed has.
band = measures.delta_band([[[0, 0.0], [100, -0.5]], [[0, 0.0], [100, -0.3]], [[100, -0.1]]])
half = 4.302652729911275 * 0.2 / math.sqrt(3)
check("delta band", len(band) == 1 and band[0][0] == 100 and abs(band[0][1] + 0.3) < 1e-12
      and abs(band[0][2] - (-0.3 - half)) < 1e-9 and abs(band[0][3] - (-0.3 + half)) < 1e-9, band)
check("delta band one seed", measures.delta_band([[[0, 0.1], [100, -0.2]]]) == [[0, 0.1, None, None], [100, -0.2, None, None]])
check("delta band none", measures.delta_band([]) == [])

# Sorted cumulative shares: counts 10, 40, 30, 20 -> busiest first 40, 30, 20, 10 of 100.
xs, ys = measures.cumulative_shares([10, 40, 30, 20])
check("cumulative x", xs == [0.0, 0.25, 0.5, 0.75, 1.0], xs)
check("cumulative y", [round(y, 12) for y in ys] == [0.0, 0.4, 0.7, 0.9, 1.0], ys)
check("cumulative uniform", measures.cumulative_shares([5, 5])[1] == [0.0, 0.5, 1.0])
# The last 10% of 20 routing records (2 records), per layer, summed per expert.
recs = [{"step": i, "layers": [1, 3], "tokens_per_expert": [[i, 1], [2 * i, 0]]} for i in range(20)]
check("tail counts", measures.routing_tail_counts(recs) == [[18 + 19, 2], [36 + 38, 0]], measures.routing_tail_counts(recs))
check("tail counts short", measures.routing_tail_counts(recs[:3]) == [[2, 1], [4, 0]])

# Router curves from metrics.jsonl: the step records' mean z and entropy over MoE layers;
# validation and memory lines are skipped.
import json as _json, tempfile as _tf  # noqa: E402,E401
mp = os.path.join(_tf.mkdtemp(), "metrics.jsonl")
with open(mp, "w") as f:
    f.write(_json.dumps({"step": 0, "loss": 5.0, "moe": [{"z": 0.002, "router_entropy": 1.0},
                                                         {"z": 0.004, "router_entropy": 2.0}]}) + "\n")
    f.write(_json.dumps({"step": 0, "memory": {}}) + "\n")
    f.write(_json.dumps({"step": 1, "val_loss": 4.0}) + "\n")
    f.write(_json.dumps({"step": 1, "loss": 4.5, "moe": [{"z": 0.0, "router_entropy": 1.5,
                                                          "router_lse_sq": 2.0},
                                                         {"z": 0.0, "router_entropy": 1.5,
                                                          "router_lse_sq": 2.5}]}) + "\n")
rc = measures.router_curves(mp)
check("router curves", len(rc) == 2 and rc[0][0] == 0 and abs(rc[0][1] - 0.003) < 1e-15 and rc[0][2] == 1.5
      and rc[0][3] is None and rc[1] == [1, 0.0, 1.5, 2.25], rc)

finish("experiments_measures_test: all checks passed")
