#!/usr/bin/python3
"""scripts/experiments/measures.py on hand-computed cases: the spike rule, the mean ± std
over seeds, the crossing step and the same-seed speed-up (censored when the baseline never
gets there), the mean curve, and FLOPs per token of a
hand-counted config (tests/cli/experiments_cli_test.sh checks the same formula against
`switchyard train --dry-run` on every run of the ci grids).
    experiments_measures_test.py path/to/scripts/experiments
"""
import math
import os
import sys

sys.path.insert(0, os.path.abspath(sys.argv[1]))
import measures  # noqa: E402

failures = 0


def check(name, ok, detail=""):
    global failures
    if not ok:
        failures += 1
        print("FAIL: %s %s" % (name, detail))


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
import runner  # noqa: E402
m = measures.mean_std([1.5, None, 0.5])
check("cell n of ok", runner.cell(m, "%.2fx", 1, 3) == "1.00x ± 0.71 (2 of 3)", runner.cell(m, "%.2fx", 1, 3))
check("cell all seeds", runner.cell(measures.mean_std([0.25, 0.75]), "%.2f%%", 100, 2) == "50.00% ± 35.36",
      runner.cell(measures.mean_std([0.25, 0.75]), "%.2f%%", 100, 2))
check("cell none", runner.cell(measures.mean_std([None]), "%.4f", 1, 1) == "-")

# The speed-up cell with a censored seed, and the Δ cell (mean ± pooled SE, p).
check("speed-up cell", runner.speedup_cell(sp, 3) == "median 1.17x; 1 of 3 censored (> 1.50x); others 1.17x, 0.75x",
      runner.speedup_cell(sp, 3))
check("speed-up cell uncensored", runner.speedup_cell(measures.speedup_summary(
    [{"speedup": 1.0, "censored": False}, {"speedup": 1.5, "censored": False}]), 2) == "1.25x ± 0.35",
    runner.speedup_cell(measures.speedup_summary([{"speedup": 1.0, "censored": False}, {"speedup": 1.5, "censored": False}]), 2))
check("delta cell", runner.delta_cell({"mean": 0.02, "se": 0.0057735, "p": 0.0257}) == "+0.0200 ± 0.0058 (p 0.026)")

if failures:
    sys.exit(1)
print("experiments_measures_test: all checks passed")
