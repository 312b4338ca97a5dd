#!/usr/bin/python3
"""The experiment runner behind scripts/experiments/*.sh (docs/experiments/README.md).

An experiment is named settings (each a list of `--set section.key=value` overrides on one
base config) times seeds. For every (setting, seed) the runner
  1. trains `switchyard train --config BASE --set train.seed=SEED --set train.max_steps=STEPS
     --set data.dir=DATA <setting> <--set ...>` into OUT/<setting>/seed<SEED> (log beside it,
     OUT/<setting>/seed<SEED>.log), and writes run.json there: status ok, or diverged when
     training stopped on a non-finite loss (exit 3, docs/failures.md); any other failure
     stops the experiment with the log's last lines;
  2. evaluates the final checkpoint on the whole validation split (`switchyard eval --json
     --batches 0`) into eval.json.
A run whose run.json (and, when ok, eval.json) exists is kept: an interrupted experiment
resumes where it stopped. --jobs N trains N runs at once, each with SWITCHYARD_THREADS =
cores / N (the engine's compute pool; OpenBLAS stays on one thread).

Then it writes OUT/summary.json and OUT/summary.md (per setting: mean ± standard deviation
over the seeds that finished; measures.py says what each number is), the figures
OUT/*.png (plots.py) and OUT/report.html (`switchyard report` of one seed per setting).
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time

import measures

EXIT_NONFINITE = 3  # switchyard train: stopped on a non-finite loss or gradient norm


class Usage(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Usage(message)


def parse(argv):
    p = Parser(add_help=False)
    # What the experiment script fixes.
    p.add_argument("--name", required=True)
    p.add_argument("--title", required=True)
    p.add_argument("--setting", action="append", default=[], metavar="NAME=K=V K=V")
    p.add_argument("--columns", default="val_loss,perplexity,step_s")
    p.add_argument("--baseline", default="", help="setting whose final loss the speed-up is measured to")
    p.add_argument("--stability", action="store_true", help="stable / spiked / diverged columns")
    p.add_argument("--default-steps", type=int, default=100)
    p.add_argument("--default-seeds", default="3")
    p.add_argument("--default-data", default="data/code")
    p.add_argument("--budget-note", default="")
    # What the user may change.
    p.add_argument("--grid", default="full")
    p.add_argument("--config")
    p.add_argument("--out")
    p.add_argument("--data")
    p.add_argument("--seeds")
    p.add_argument("--steps", type=int)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--bin")
    p.add_argument("--set", action="append", default=[], dest="extra")
    p.add_argument("--val-blocks", type=int, default=1024)
    p.add_argument("--val-block-tokens", type=int, default=1024)
    a = p.parse_args(argv)
    if a.grid not in ("full", "ci"):
        raise Usage("--grid '%s' is not one of full, ci" % a.grid)
    a.steps = a.default_steps if a.steps is None else a.steps
    if a.steps < 1:
        raise Usage("--steps %d must be a positive integer" % a.steps)
    if a.jobs < 1:
        raise Usage("--jobs %d must be a positive integer" % a.jobs)
    if a.val_blocks < 0 or a.val_blocks & (a.val_blocks - 1) or a.val_block_tokens < 1:
        raise Usage("--val-blocks %d must be 0 (the whole split) or a power of two, "
                    "--val-block-tokens %d positive" % (a.val_blocks, a.val_block_tokens))
    seeds = a.default_seeds if a.seeds is None else a.seeds
    try:
        if "," in seeds:
            a.seeds = [int(s) for s in seeds.split(",")]
        else:
            a.seeds = list(range(1, int(seeds) + 1))
    except ValueError:
        raise Usage("--seeds '%s' is neither a count (3) nor a list (1,2,3)" % seeds)
    if not a.seeds or min(a.seeds) < 0 or len(set(a.seeds)) != len(a.seeds):
        raise Usage("--seeds '%s' must name at least one distinct non-negative seed" % seeds)
    for kv in a.extra:
        if "=" not in kv or "." not in kv.split("=", 1)[0]:
            raise Usage("--set '%s': expected section.key=value" % kv)
    a.settings = []
    for s in a.setting:
        name, _, sets = s.partition("=")
        a.settings.append((name, sets.split()))
    a.data = a.data or a.default_data
    a.out = a.out or os.path.join("runs", "experiments", a.name + ("" if a.grid == "full" else "-ci"))
    return a


def check_inputs(a):
    """Missing inputs are one line each (exit 1), before anything is created."""
    if not os.access(a.bin, os.X_OK):
        return "%s is not built (ninja -C build switchyard, or --bin PATH)" % a.bin
    if not os.path.isfile(a.config):
        return "--config %s: no such file" % a.config
    if not os.path.isfile(os.path.join(a.data, "index.json")):
        hint = ("python3 scripts/make_code_corpus.py builds it" if a.data.rstrip("/").endswith("data/code")
                else "switchyard prep --out %s builds it" % a.data)
        return "--data %s: no prepared corpus there (no index.json; %s, or pass --data DIR)" % (a.data, hint)
    return None


def run_one(a, name, sets, seed, vocab, threads):
    """Trains and evaluates one (setting, seed) unless already done; returns a log line."""
    d = os.path.join(a.out, name, "seed%d" % seed)
    status_path, eval_path = os.path.join(d, "run.json"), os.path.join(d, "eval.json")
    if os.path.isfile(status_path):
        with open(status_path) as f:
            st = json.load(f)
        if st["status"] != "ok" or os.path.isfile(eval_path):
            return "%s/seed%d: already done (%s)" % (name, seed, st["status"])
    else:
        shutil.rmtree(d, ignore_errors=True)
        cmd = [a.bin, "train", "--config", a.config, "--out", d,
               "--set", "train.seed=%d" % seed, "--set", "train.max_steps=%d" % a.steps,
               "--set", "data.dir=%s" % a.data, "--set", "model.vocab_size=%d" % vocab]
        for kv in sets + a.extra:
            cmd += ["--set", kv]
        env = dict(os.environ, SWITCHYARD_THREADS=str(threads))
        start = time.time()
        log = os.path.join(a.out, name, "seed%d.log" % seed)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        with open(log, "w") as f:
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        if rc not in (0, EXIT_NONFINITE):
            with open(log) as f:
                tail = f.read().strip().splitlines()[-3:]
            raise RuntimeError("training %s/seed%d failed (exit %d; %s): %s"
                               % (name, seed, rc, log, " | ".join(tail)))
        st = {"status": "ok" if rc == 0 else "diverged", "exit": rc, "seed": seed,
              "setting": name, "overrides": sets + a.extra, "wall_s": time.time() - start}
    if st["status"] == "ok":
        cmd = [a.bin, "eval", "--checkpoint", d, "--json", "--batches", "0", "--data", a.data]
        r = subprocess.run(cmd, capture_output=True, text=True,
                           env=dict(os.environ, SWITCHYARD_THREADS=str(threads)))
        if r.returncode == EXIT_NONFINITE:  # finite weights, non-finite forward: diverged too
            st.update(status="diverged", eval_error=r.stderr.strip())
        elif r.returncode != 0:
            raise RuntimeError("eval of %s/seed%d failed (exit %d): %s"
                               % (name, seed, r.returncode, r.stderr.strip().splitlines()[-1:]))
        else:
            with open(eval_path + ".tmp", "w") as f:
                f.write(r.stdout)
            os.replace(eval_path + ".tmp", eval_path)
    with open(status_path + ".tmp", "w") as f:
        json.dump(st, f)
    os.replace(status_path + ".tmp", status_path)  # last: marks the run complete
    return "%s/seed%d: %s in %.0f s" % (name, seed, st["status"], st["wall_s"])


def train_all(a, vocab):
    threads = max(1, (os.cpu_count() or 1) // a.jobs)
    todo = [(n, s, seed) for n, s in a.settings for seed in a.seeds]
    with concurrent.futures.ThreadPoolExecutor(max_workers=a.jobs) as pool:
        futs = [pool.submit(run_one, a, n, s, seed, vocab, threads) for n, s, seed in todo]
        try:
            for i, fut in enumerate(concurrent.futures.as_completed(futs)):
                print("%s: [%d/%d] %s" % (a.name, i + 1, len(todo), fut.result()), flush=True)
        except BaseException:
            for f in futs:
                f.cancel()
            raise


def summarise(a):
    """summary.json's content: the settings over their seeds, plus each run's numbers."""
    per_setting = []
    for name, sets in a.settings:
        dirs = [os.path.join(a.out, name, "seed%d" % s) for s in a.seeds]
        cfgs = [measures.resolved_config(d) for d in dirs]
        sibling = next((c for c in cfgs if c), None)  # a diverged run may leave no checkpoint
        runs = [measures.run_measures(d, c or sibling) for d, c in zip(dirs, cfgs)]
        per_setting.append((name, sets, runs))
    baseline = None
    if a.baseline:
        base = next(runs for name, _, runs in per_setting if name == a.baseline)
        curve = measures.mean_curve([r["curve_val"] for r in base if r["status"] == "ok"])
        if curve:
            baseline = (curve[-1][1], curve[-1][0])
    base_runs = next((runs for n, _, runs in per_setting if n == a.baseline), None)
    settings = [measures.summarise_setting(n, s, runs, baseline if n != a.baseline else None,
                                           base_runs if n != a.baseline else None)
                for n, s, runs in per_setting]
    return {"experiment": a.name, "title": a.title, "grid": a.grid, "config": a.config,
            "data": a.source_data, "val_sample_tokens": a.val_tokens, "steps": a.steps, "seeds": a.seeds, "extra_sets": a.extra,
            "baseline": a.baseline or None,
            "baseline_final_val_curve": baseline[0] if baseline else None,
            "spike_rule": {"window": measures.SPIKE_WINDOW, "ratio": measures.SPIKE_RATIO,
                           "step_ratio": measures.STEP_RATIO},
            "settings": settings,
            "runs": {n: runs for n, _, runs in per_setting}}


# summary.md's columns: key -> (header, printf format, scale).
COLUMNS = {
    "val_loss": ("val loss", "%.4f", 1),
    "perplexity": ("perplexity", "%.2f", 1),
    "maxvio_global": ("MaxVio global (mean of layers)", "%.3f", 1),
    "maxvio_global_max": ("MaxVio global (max layer)", "%.3f", 1),
    "maxvio_batch": ("MaxVio per batch (last 10%)", "%.3f", 1),
    "dropped_run": ("dropped (run)", "%.2f%%", 100),
    "dropped_end": ("dropped (last 10%)", "%.2f%%", 100),
    "step_s": ("step (ms, median)", "%.1f", 1000),
    "flops_per_token": ("MFLOP / token", "%.3f", 1e-6),
    "train_flops": ("training PFLOP", "%.4g", 1e-15),
    "lang_mi_bits": ("label MI (bits)", "%.3f", 1),
    "lang_top_share": ("label top share", "%.1f%%", 100),
    "speedup": ("speed-up (steps to the baseline's final loss)", "%.2fx", 1),
    "delta_val_loss": ("Δ val loss vs baseline, same seed", "%+.4f", 1),
}


def cell(m, fmt, scale, ok):
    """Mean ± std of one metric; "(n of ok)" when fewer seeds than finished have a value
    (a speed-up exists only for the runs whose curve reached the baseline's final loss)."""
    if m["mean"] is None:
        return "-"
    s = fmt % (m["mean"] * scale)
    if m["std"] is not None:
        s += " ± " + (fmt % (m["std"] * scale)).rstrip("%x").lstrip("+")
    if m["n"] < ok:
        s += " (%d of %d)" % (m["n"], ok)
    return s


def markdown(summary, columns, stability):
    head = ["setting", "overrides", "seeds ok"]
    if stability:
        head += ["stable", "spiked", "diverged"]
    head += [COLUMNS[c][0] for c in columns]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    for s in summary["settings"]:
        row = [s["name"], " ".join("`%s`" % o for o in s["overrides"]) or "(base)",
               "%d/%d" % (s["ok"], s["runs"])]
        if stability:
            row += ["%d/%d" % (s[k], s["runs"]) for k in ("stable", "spiked", "diverged")]
        row += [cell(s["metrics"][c], *COLUMNS[c][1:], s["ok"]) for c in columns]
        lines.append("| " + " | ".join(row) + " |")
    note = ("\n%s: %s grid, %d steps, seeds %s, config %s, data %s. Each cell: mean ± sample "
            "standard deviation over the seeds that finished (no ± with one; \"(n of m)\" where "
            "only n of the m finished seeds have a value).\n"
            % (summary["title"], summary["grid"], summary["steps"],
               ",".join(map(str, summary["seeds"])), summary["config"], summary["data"]))
    return "\n".join(lines) + "\n" + note


def report(a, summary):
    """`switchyard report` of the first finished seed of each setting (None if none)."""
    runs = []
    for s in summary["settings"]:
        for r in summary["runs"][s["name"]]:
            if r["status"] == "ok":
                runs.append(os.path.join(a.out, s["name"], "seed%d" % r["seed"]))
                break
    if not runs:
        return None
    out = os.path.join(a.out, "report.html")
    r = subprocess.run([a.bin, "report", *runs, "--out", out, "--title",
                        "%s (%s grid, %d steps, one seed per setting)" % (a.title, a.grid, a.steps)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("switchyard report failed: %s" % r.stderr.strip())
    return out


def main(argv):
    prog = os.environ.get("SY_EXPERIMENT_PROG", "runner.py")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        a = parse(argv)
    except Usage as e:
        sys.stderr.write("%s: error: %s\n" % (prog, e))
        return 2
    a.bin = a.bin or os.path.join(root, "build", "bin", "switchyard")
    a.config = a.config or os.path.join(root, "configs", "experiments", "base.yaml")
    cols = a.columns.split(",")
    bad = [c for c in cols if c not in COLUMNS]
    if bad or (a.baseline and a.baseline not in [n for n, _ in a.settings]) or not a.settings:
        sys.stderr.write("%s: error: bad experiment definition (columns %s, baseline '%s')\n"
                         % (prog, bad, a.baseline))
        return 2
    msg = check_inputs(a)
    if msg:
        sys.stderr.write("%s: error: %s\n" % (prog, msg))
        return 1
    with open(os.path.join(a.data, "index.json")) as f:
        vocab = json.load(f)["vocab_size"]
    os.makedirs(a.out, exist_ok=True)
    a.source_data, a.val_tokens = a.data, None
    if a.val_blocks:
        import val_sample
        sample = os.path.join(a.out, "val-sample")
        try:
            a.val_tokens = val_sample.make(a.data, sample, a.val_blocks, a.val_block_tokens)
        except (OSError, ValueError, KeyError) as e:
            sys.stderr.write("%s: error: validation sample of %s: %s\n" % (prog, a.data, e))
            return 1
        if a.val_tokens:
            a.data = sample
            print("%s: validation on %d blocks of %d tokens spread over %s's split (%s)"
                  % (a.name, a.val_blocks, a.val_block_tokens, a.source_data, sample), flush=True)
    print("%s: %d settings x %d seeds, %d steps, %d jobs, out %s"
          % (a.name, len(a.settings), len(a.seeds), a.steps, a.jobs, a.out), flush=True)
    try:
        train_all(a, vocab)
        summary = summarise(a)
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, allow_nan=False)
        md = markdown(summary, cols, a.stability)
        with open(os.path.join(a.out, "summary.md"), "w") as f:
            f.write(md)
        import plots
        figs = plots.write_all(summary, a.out)
        page = report(a, summary)
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.stderr.write("%s: error: %s\n" % (prog, e))
        return 1
    print(md)
    print("%s: %s; figures %s; %s" % (a.name, os.path.join(a.out, "summary.md"), ", ".join(figs),
                                      page or "no report (no run finished)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
