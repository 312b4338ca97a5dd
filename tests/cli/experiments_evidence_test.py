#!/usr/bin/python3
"""scripts/experiments/evidence.py and publish.py on a hand-made experiment directory:
per_seed.csv's header and rows (every run's own values, empty where a run has none, the
speed-up's censored flag), the keys that differ between seeds' configs, configs/<setting>.yaml
(the first checkpointed seed's config.yaml byte for byte under a header naming the differing
keys and the seeds without a config), and publish's copy (summary.json without the per-step
curves, nothing from the run directories, the bytes it reports).
    experiments_evidence_test.py path/to/scripts/experiments
"""
import csv
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.abspath(sys.argv[1]))
import evidence  # noqa: E402
import publish  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, finish  # noqa: E402


def run(seed, status="ok", **kw):
    r = {"status": status, "seed": seed, "val_loss": None, "perplexity": None, "step_s": 0.25,
         "stable": status == "ok", "spiked": False, "worst_window_ratio": 1.01, "worst_step_ratio": 1.2,
         "curve_ce": [[0, 5.0]], "curve_maxvio": [[0, 0.5]], "curve_dropped": [[0, 0.1]],
         "curve_val": [[0, 5.0]]}
    r.update(kw)
    return r


# Two settings of two seeds: the baseline dense, and moe whose seed 2 diverged. Values chosen
# to print exactly (repr of binary fractions).
summary = {
    "experiment": "t", "baseline": "dense",
    "settings": [{"name": "dense", "overrides": []}, {"name": "moe", "overrides": ["moe.num_experts=4"]}],
    "runs": {
        "dense": [run(1, val_loss=3.5, perplexity=33.0, dropped_run=None),
                  run(2, val_loss=3.25, perplexity=25.75, dropped_run=None)],
        "moe": [run(1, val_loss=3.375, perplexity=29.25, dropped_run=0.125, delta_val_loss=-0.125,
                    speedup={"speedup": 1.5, "censored": True}),
                run(2, "diverged", step_s=0.5)],
    },
}
cols = ["val_loss", "delta_val_loss", "perplexity", "speedup", "dropped_run", "step_s"]
head, rows = evidence.per_seed_rows(summary, cols, stability=False)
check("header", head == ["setting", "seed", "status", "val_loss", "delta_val_loss", "perplexity",
                         "speedup", "speedup_censored", "dropped_run", "step_s"], head)
check("rows", rows == [
    ["dense", "1", "ok", "3.5", "", "33.0", "", "", "", "0.25"],
    ["dense", "2", "ok", "3.25", "", "25.75", "", "", "", "0.25"],
    ["moe", "1", "ok", "3.375", "-0.125", "29.25", "1.5", "1", "0.125", "0.25"],
    ["moe", "2", "diverged", "", "", "", "", "", "", "0.5"]], rows)
# Stability columns come after the status; the Δ column is added without a baseline only
# when summary.md shows it; val_loss is always there.
head, rows = evidence.per_seed_rows(dict(summary, baseline=None), ["step_s"], stability=True)
check("stability header", head == ["setting", "seed", "status", "stable", "spiked", "worst_window_ratio",
                                   "worst_step_ratio", "val_loss", "step_s"], head)
check("stability row", rows[3] == ["moe", "2", "diverged", "0", "0", "1.01", "1.2", "", "0.5"], rows[3])
# The file parses back to the same rows.
tmp = tempfile.mkdtemp()
path = os.path.join(tmp, "per_seed.csv")
check("rows written", evidence.write_per_seed_csv(summary, cols, False, path) == 4)
with open(path, newline="") as f:
    back = list(csv.reader(f))
check("csv round trip", back == [evidence.per_seed_columns(summary, cols, False)] +
      evidence.per_seed_rows(summary, cols, False)[1], back)

# Differing keys: train.seed differs, a nested list differs, a key missing from one differs.
a = {"train": {"seed": 1, "lr": 0.5}, "parallel": {"pipeline_layers": [1, 2]}, "moe": {"k": 1}}
b = {"train": {"seed": 2, "lr": 0.5}, "parallel": {"pipeline_layers": [1, 3]}, "moe": {}}
check("differing keys", evidence.differing_keys([a, b]) == ["moe.k", "parallel.pipeline_layers", "train.seed"],
      evidence.differing_keys([a, b]))
check("same configs", evidence.differing_keys([a, dict(a)]) == [])

# configs/<setting>.yaml from the run directories: dense seeds 1 and 2 (their checkpoints
# step-4 and step-8: the latest is read), moe seed 1 only (seed 2 diverged: no checkpoint).
out = os.path.join(tmp, "exp")
texts = {}
for name, seed, step, lr in [("dense", 1, 8, "0.5"), ("dense", 2, 8, "0.5"), ("moe", 1, 8, "0.25")]:
    for st in (4, step):
        d = os.path.join(out, name, "seed%d" % seed, "step-%08d" % st)
        os.makedirs(d, exist_ok=True)
        text = "train:\n  seed: %d\n  lr: %s\n  max_steps: %d\n" % (seed, lr, st)
        with open(os.path.join(d, "config.yaml"), "w") as f:
            f.write(text)
        texts[(name, seed)] = text
os.makedirs(os.path.join(out, "moe", "seed2"), exist_ok=True)
written = evidence.write_configs(summary, out)
check("configs written", written == ["configs/dense.yaml", "configs/moe.yaml"], written)
dense = open(os.path.join(out, "configs", "dense.yaml")).read()
want = ("# dense: the resolved config of seed 1's run (dense/seed1/step-00000008/config.yaml), as "
        "`switchyard train` wrote it.\n"
        "# Keys that differ between the seeds' configs (seeds 1, 2):\n"
        "#   train.seed: 1, 2\n") + texts[("dense", 1)]
check("dense config", dense == want, repr(dense))
moe = open(os.path.join(out, "configs", "moe.yaml")).read()
check("moe config", moe.endswith(texts[("moe", 1)]) and "One seed's config (seed 1)" in moe
      and "# No config from seed(s) 2 (stopped before a checkpoint: diverged)." in moe, repr(moe))
import yaml  # noqa: E402
check("config parses", yaml.safe_load(dense) == {"train": {"seed": 1, "lr": 0.5, "max_steps": 8}})

# publish: summary.json without the per-step curves (everything else kept), summary.md,
# per_seed.csv, configs and PNGs copied, and runs.tar.xz with the finished runs' records (the
# latest checkpoint's config, not the earlier one's); logs, weights and report.html not.
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f)
for n, body in [("summary.md", "| setting |\n"), ("a.png", "png"), ("report.html", "<html>"),
                ("dense/seed1.log", "log"), ("dense/seed1/run.json", '{"status": "ok"}'),
                ("dense/seed1/metrics.jsonl", "{}\n"), ("dense/seed1/step-00000008/model.safetensors", "w")]:
    with open(os.path.join(out, n), "w") as f:
        f.write(body)
evidence.write_per_seed_csv(summary, cols, False, os.path.join(out, "per_seed.csv"))
dest = os.path.join(tmp, "docs", "t")
files = publish.publish(out, dest)
names = sorted(n for n, _ in files)
check("published files", names == ["a.png", "configs/dense.yaml", "configs/moe.yaml", "per_seed.csv",
                                   "runs.tar.xz", "summary.json", "summary.md"], names)
import tarfile  # noqa: E402
with tarfile.open(os.path.join(dest, "runs.tar.xz")) as t:
    members = sorted(t.getnames())
check("runs archive", members == ["dense/seed1/metrics.jsonl", "dense/seed1/run.json",
                                  "dense/seed1/step-00000008/config.yaml"], members)
on_disk = sorted(os.path.relpath(os.path.join(r, f), dest) for r, _, fs in os.walk(dest) for f in fs)
check("nothing else", on_disk == names, on_disk)
check("bytes", all(b == os.path.getsize(os.path.join(dest, n)) for n, b in files))
pub = json.load(open(os.path.join(dest, "summary.json")))
r = pub["runs"]["moe"][0]
check("curves left out", not any(k in r for k in publish.STEP_CURVES) and r["curve_val"] == [[0, 5.0]]
      and r["val_loss"] == 3.375 and pub["published"]["left_out"] == list(publish.STEP_CURVES), r)
check("the rest kept", {k: v for k, v in pub.items() if k not in ("runs", "published")}
      == {k: v for k, v in summary.items() if k != "runs"})
check("source untouched", "curve_ce" in json.load(open(os.path.join(out, "summary.json")))["runs"]["moe"][0])
check("csv copied", open(os.path.join(dest, "per_seed.csv")).read() == open(os.path.join(out, "per_seed.csv")).read())
# The command line: usage is one line and exit 2; a directory without summary.json exit 1.
check("usage", publish.main([]) == 2)
check("no summary", publish.main([tmp, os.path.join(tmp, "x")]) == 1)
# Without a finished run (a summary rebuilt elsewhere) there is no archive to write.
os.remove(os.path.join(out, "dense", "seed1", "run.json"))
dest2 = os.path.join(tmp, "docs", "u")
check("no runs, no archive", "runs.tar.xz" not in [n for n, _ in publish.publish(out, dest2)]
      and not os.path.exists(os.path.join(dest2, "runs.tar.xz")))

finish("experiments_evidence_test: all checks passed")
