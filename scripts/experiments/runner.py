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
resumes where it stopped. run.json records what defines the run (overrides, steps, the
corpus's index.json digest, the validation sample, the base config's digest, the binary);
a kept run that differs from this call in any but the binary stops the experiment before
anything trains (check_kept), another binary is a warning. --jobs N trains N runs at once, each with SWITCHYARD_THREADS =
cores / N (the engine's compute pool; OpenBLAS stays on one thread).

Then it writes OUT/summary.json and OUT/summary.md (summary_md.py; per setting: mean ± std
over the seeds that finished; with a baseline, the paired t on each setting's same-seed Δ
with the variance pooled over the settings, the trend of Δ in log2 E (--trend) and the seeds
an effect needs for 80% power (stats.py); measures.py says what each number is),
OUT/per_seed.csv and OUT/configs/<setting>.yaml (every run's numbers and each setting's
resolved config: evidence.py), the figures OUT/*.png (plots.py) and OUT/report.html
(`switchyard report` of one seed per setting). --publish DIR then copies the evidence and the
figures into a docs folder (publish.py).
"""
import concurrent.futures
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

# scipy and numpy (stats.py, plots.py) work on a few hundred numbers here: OpenBLAS's threads
# would only spin (sched_yield) beside the one that works, taking a core from the trainings.
# Read when OpenBLAS loads; the trainings this starts take SWITCHYARD_THREADS, set for each.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import measures  # noqa: E402
import stats  # noqa: E402
from runner_args import Usage, check_inputs, parse  # noqa: E402
from summary_md import COLUMNS, markdown  # noqa: E402

EXIT_NONFINITE = 3  # switchyard train: stopped on a non-finite loss or gradient norm


def mpi_init_failed(log):
    """Whether a run's log ends in Open MPI's start-up failure: a one-process run initialises
    MPI as a singleton, which under a loaded machine sometimes aborts before MPI_Init
    completes (seen with several runs starting at once); nothing of the run has happened."""
    with open(log, errors="replace") as f:
        return "before MPI_INIT completed" in f.read()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def config_digest(path):
    """sha256 of the base config's content as parsed (canonical JSON: an edited comment or
    layout keeps the runs), or of its bytes when it does not parse."""
    try:
        import yaml
        with open(path) as f:
            text = json.dumps(yaml.safe_load(f), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()
    except Exception:  # not YAML PyYAML reads: the engine will say what is wrong
        return sha256_file(path)


def run_identity(a, val_tokens):
    """What defines a run beyond its setting's overrides and its seed (the steps aside:
    run_steps), written into every run.json and compared when a finished run is kept
    (check_kept): the corpus (its index.json's digest; the path for messages), the
    validation sample (blocks, tokens each; None: the whole split), the base config's content
    and the switchyard binary (its digest; another binary only warns)."""
    return {"data": os.path.abspath(a.source_data),
            "data_index_sha256": sha256_file(os.path.join(a.source_data, "index.json")),
            "val_sample": [a.val_blocks, a.val_block_tokens] if val_tokens else None,
            "config": os.path.abspath(a.config), "config_sha256": config_digest(a.config),
            "binary": os.path.abspath(a.bin), "binary_sha256": sha256_file(a.bin)}


def run_steps(a, sets):
    """A run's train.max_steps: its setting's own when it sets one (moe_vs_dense's dense
    run trains twice as long), else --steps."""
    steps = a.steps
    for kv in sets + a.extra:
        k, _, v = kv.partition("=")
        if k.strip() == "train.max_steps":
            try:
                steps = int(v)
            except ValueError:
                steps = v.strip()
    return steps


def _runs_named(runs):
    return runs[0] + (" and %d more" % (len(runs) - 1) if len(runs) > 1 else "")


def check_kept(a):
    """Before anything trains: every finished run in OUT (its run.json) must be the run this
    call would train: the same overrides, steps, corpus, validation sample and base config;
    else RuntimeError naming the run and what differs. Returns warning lines: runs trained
    by another binary are kept (a rebuilt binary usually computes the same; run.json names
    the one that trained each run), and so are runs whose run.json predates this record
    (their steps checked against their config.yaml where they left one)."""
    ident = a.identity
    other_bin, old = [], []
    for name, sets in a.settings:
        for seed in a.seeds:
            d = os.path.join(a.out, name, "seed%d" % seed)
            path = os.path.join(d, "run.json")
            if not os.path.isfile(path):
                continue
            with open(path) as f:
                st = json.load(f)
            if st.get("overrides") != sets + a.extra:
                raise RuntimeError("%s was trained with the overrides %s, not this setting's %s "
                                   "(remove it, or use another --out)" % (d, st.get("overrides"), sets + a.extra))
            diffs = []
            steps = st.get("steps")
            if steps is None:  # run.json before the record: the checkpoint's config says
                cfg = measures.resolved_config(d)
                steps = (cfg.get("train") or {}).get("max_steps") if cfg else None
            if steps is not None and steps != run_steps(a, sets):
                diffs.append("was %s steps, now %s" % (steps, run_steps(a, sets)))
            if "data_index_sha256" in st and st["data_index_sha256"] != ident["data_index_sha256"]:
                diffs.append("was data %s (index.json sha256 %.12s), now %s (%.12s)"
                             % (st.get("data"), st["data_index_sha256"], ident["data"], ident["data_index_sha256"]))
            if "val_sample" in st and st["val_sample"] != ident["val_sample"]:
                vs = lambda v: "%d blocks of %d tokens" % tuple(v) if v else "the whole split"
                diffs.append("was validated on %s, now %s" % (vs(st["val_sample"]), vs(ident["val_sample"])))
            if "config_sha256" in st and st["config_sha256"] != ident["config_sha256"]:
                diffs.append("was base config %s (sha256 %.12s), now %s (%.12s)"
                             % (st.get("config"), st["config_sha256"], ident["config"], ident["config_sha256"]))
            if diffs:
                raise RuntimeError("%s was trained with other inputs than this call's: %s "
                                   "(remove it, or use another --out)" % (d, "; ".join(diffs)))
            run = "%s/seed%d" % (name, seed)
            if any(k not in st for k in ("steps", "data_index_sha256", "config_sha256", "binary_sha256")):
                old.append(run)
            elif st["binary_sha256"] != ident["binary_sha256"]:
                other_bin.append((run, st))
    warnings = []
    if other_bin:
        st = other_bin[0][1]
        warnings.append("%d kept runs (%s) were trained by another switchyard binary (%s, sha256 %.12s; "
                        "now %s, %.12s): kept, their numbers are that binary's"
                        % (len(other_bin), _runs_named([r for r, _ in other_bin]), st.get("binary"),
                           st["binary_sha256"], ident["binary"], ident["binary_sha256"]))
    if old:
        warnings.append("%d kept runs (%s) predate run.json's record of their data, base config and "
                        "binary: kept unchecked but for their steps (their config.yaml)" % (len(old), _runs_named(old)))
    return warnings


def error_lines(log):
    """What a failed run's log says went wrong: its lines with "error:" (the engine's
    `switchyard train: error: ...` on stderr, which lands before the buffered config dump
    on stdout), else its last 3 lines."""
    with open(log, errors="replace") as f:
        lines = f.read().strip().splitlines()
    errors = [l.strip() for l in lines if "error:" in l]
    return errors[-3:] if errors else lines[-3:]


def run_one(a, name, sets, seed, vocab, threads):
    """Trains and evaluates one (setting, seed) unless already done (check_kept has checked
    a kept run against this call); returns a log line."""
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
        for attempt in range(3):
            # train refuses an --out holding a previous run: start each attempt clean.
            shutil.rmtree(d, ignore_errors=True)
            with open(log, "w") as f:
                rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
            if rc in (0, EXIT_NONFINITE) or not mpi_init_failed(log):
                break
            time.sleep(1 + attempt)  # MPI's start-up failed, not the run: try again
        if rc not in (0, EXIT_NONFINITE):
            raise RuntimeError("training %s/seed%d failed (exit %d; %s): %s"
                               % (name, seed, rc, log, " | ".join(error_lines(log))))
        st = {"status": "ok" if rc == 0 else "diverged", "exit": rc, "seed": seed,
              "setting": name, "overrides": sets + a.extra, "wall_s": time.time() - start,
              "steps": run_steps(a, sets)}
        st.update(a.identity)
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


TIME_SKIP = 5  # a timing run's first steps (allocations, warm caches) are not timed


def time_all(a, vocab):
    """Each setting's step time with the machine to itself (the training runs share it,
    --jobs at a time, so their step times also measure their neighbours): --time-rounds
    rounds; in each, every setting trains TIME_SKIP + --time-steps steps of the first
    seed's run (train.max_steps raised to that when the experiment's is smaller) alone on
    every core, the order rotated by one each round, so that no setting
    always goes first. Per run the median of its timed steps; per setting the median over
    the rounds and their range. Kept in timing.json and reused while the settings, step
    count and rounds are the same, and so are what else sets a step's time: the corpus (its
    index.json), the base config's content, the binary and the machine's core count."""
    path = os.path.join(a.out, "timing.json")
    threads = os.cpu_count() or 1
    identity = run_identity(a, None)
    key = {"steps": a.time_steps, "skip": TIME_SKIP, "rounds": a.time_rounds,
           "settings": [[n, s + a.extra] for n, s in a.settings], "threads": threads,
           "data_index_sha256": identity["data_index_sha256"],
           "config_sha256": identity["config_sha256"], "binary_sha256": identity["binary_sha256"]}
    if os.path.isfile(path):
        with open(path) as f:
            old = json.load(f)
        if all(old.get(k) == v for k, v in key.items()):
            return old
        changed = [k for k, v in key.items() if old.get(k) != v]
        print("%s: timing.json was measured otherwise (%s differ): timing again"
              % (a.name, ", ".join(changed)), flush=True)
    per_round = {n: [] for n, _ in a.settings}
    for r in range(a.time_rounds):
        order = a.settings[r % len(a.settings):] + a.settings[:r % len(a.settings)]
        for name, sets in order:
            d = os.path.join(a.out, "timing-run")
            shutil.rmtree(d, ignore_errors=True)
            cmd = [a.bin, "train", "--config", a.config, "--out", d, "--steps", str(TIME_SKIP + a.time_steps),
                   "--set", "train.seed=%d" % a.seeds[0],
                   "--set", "train.max_steps=%d" % max(a.steps, TIME_SKIP + a.time_steps),
                   "--set", "data.dir=%s" % a.data, "--set", "model.vocab_size=%d" % vocab]
            for kv in sets + a.extra:
                cmd += ["--set", kv]
            cmd += ["--set", "train.eval_every=0"]  # after the sets: timing never validates
            res = subprocess.run(cmd, capture_output=True, text=True,
                                 env=dict(os.environ, SWITCHYARD_THREADS=str(threads)))
            if res.returncode != 0:
                raise RuntimeError("timing run of %s failed (exit %d): %s" % (
                    name, res.returncode, " | ".join(res.stderr.strip().splitlines()[-2:])))
            with open(os.path.join(d, "metrics.jsonl")) as f:
                recs = [json.loads(line) for line in f if line.strip()]
            steps = [x["step_s"] for x in recs if "step_s" in x and x.get("step", -1) >= TIME_SKIP]
            if not steps:
                raise RuntimeError("timing run of %s recorded no step after its first %d" % (name, TIME_SKIP))
            per_round[name].append(statistics.median(steps))
            shutil.rmtree(d, ignore_errors=True)
        print("%s: timing round %d/%d done" % (a.name, r + 1, a.time_rounds), flush=True)
    timing = dict(key, per_setting={
        n: {"median": statistics.median(v), "min": min(v), "max": max(v), "rounds": v}
        for n, v in per_round.items()})
    with open(path + ".tmp", "w") as f:
        json.dump(timing, f, indent=1)
    os.replace(path + ".tmp", path)
    return timing


def summarise(a):
    """summary.json's content: the settings over their seeds, plus each run's numbers."""
    per_setting = []
    for name, sets in a.settings:
        dirs = [os.path.join(a.out, name, "seed%d" % s) for s in a.seeds]
        cfgs = [measures.resolved_config(d) for d in dirs]
        sibling = next((c for c in cfgs if c), None)  # a diverged run may leave no checkpoint
        runs = [measures.run_measures(d, c or sibling) for d, c in zip(dirs, cfgs)]
        per_setting.append((name, sets, runs))
    base_runs = next((runs for n, _, runs in per_setting if n == a.baseline), None)
    settings = [measures.summarise_setting(n, s, runs, base_runs if n != a.baseline else None)
                for n, s, runs in per_setting]
    runs_by_setting = {n: runs for n, _, runs in per_setting}
    return dict({"experiment": a.name, "title": a.title, "grid": a.grid, "config": a.config,
            "data": a.source_data, "val_sample_tokens": a.val_tokens, "steps": a.steps, "seeds": a.seeds, "extra_sets": a.extra,
            "baseline": a.baseline or None,
            # The baseline's mean validation curve at its last evaluation (the plots' line).
            "baseline_final_val_curve": next((st["curve_val"][-1][1] for st in settings
                                              if st["name"] == a.baseline and st["curve_val"]), None),
            "spike_rule": {"window": measures.SPIKE_WINDOW, "ratio": measures.SPIKE_RATIO,
                           "step_ratio": measures.STEP_RATIO},
            "settings": settings,
            "runs": runs_by_setting},
        **tests_of(settings, runs_by_setting, a.baseline, a.trend, a.power_effects))


def tests_of(settings, runs_by_setting, baseline, trend_names, power_effects):
    """summary.json's tests (paired_test, paired_test_curve_end, trend, power) of the runs,
    each setting's own results stored in its entry of `settings` (delta_test,
    delta_curve_test). restat.py recomputes a published summary's with it."""
    tests = measures.paired_tests(runs_by_setting, baseline)
    curve_tests = measures.paired_tests(runs_by_setting, baseline, key="curve_end")
    for st in settings:
        st["delta_test"] = tests["settings"].get(st["name"]) if tests else None
        st["delta_curve_test"] = curve_tests["settings"].get(st["name"]) if curve_tests else None
    trend = measures.trend_in_experts(runs_by_setting, trend_names, baseline) if trend_names else None
    if trend:
        trend["settings"] = trend_names
    power = None
    if tests and tests["delta_sd"] and tests["delta_sd"] > 0:
        power = {"delta_sd": tests["delta_sd"], "alpha": stats.ALPHA, "power": stats.POWER,
                 "method": "noncentral t, df n - 1 (one setting's paired test)",
                 "seeds": {str(e): stats.seeds_for_power(float(e), tests["delta_sd"]) for e in power_effects}}
    return {"paired_test": ({"model": "two-way setting x seed", "sd": tests["sd"], "delta_sd": tests["delta_sd"],
                             "df": tests["df"], "alpha": tests["alpha"]} if tests else None),
            "paired_test_curve_end": ({"sd": curve_tests["sd"], "delta_sd": curve_tests["delta_sd"],
                                       "df": curve_tests["df"]} if curve_tests else None),
            "trend": trend, "power": power}


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


def figures_stamp(a, summary):
    """A digest of what the figures and report.html are drawn from: the summary, the drawing
    code (this file, plots.py, and scripts/report.py, which `switchyard report` runs), the
    switchyard binary (path, size, modification time) and the files of every run directory
    (name, size, modification time)."""
    h = hashlib.sha256()
    h.update(json.dumps(summary, sort_keys=True, allow_nan=True).encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("runner.py", "plots.py", os.path.join("..", "report.py")):
        with open(os.path.join(here, name), "rb") as f:
            h.update(f.read())
    st = os.stat(a.bin)
    h.update(("%s %d %d %s" % (os.path.abspath(a.bin), st.st_size, st.st_mtime_ns, a.title)).encode())
    for name in sorted(summary["runs"]):
        for r in summary["runs"][name]:
            run = os.path.join(a.out, name, "seed%d" % r["seed"])
            for entry in sorted(os.scandir(run), key=lambda e: e.name) if os.path.isdir(run) else []:
                if entry.is_file():
                    est = entry.stat()
                    h.update(("%s %d %d" % (entry.path, est.st_size, est.st_mtime_ns)).encode())
    return h.hexdigest()


def draw(a, summary):
    """(figures, report page): plots.write_all and report(), unless the last call drew them
    from the same inputs (figures_stamp, kept in OUT/.figures.json) and every one is still
    there. A second call that trains nothing then redraws nothing (its 10 figures and the
    report took about 9 s of the call's 10)."""
    path = os.path.join(a.out, ".figures.json")
    stamp = figures_stamp(a, summary)
    try:
        with open(path) as f:
            kept = json.load(f)
        files = kept["figures"] + ([kept["page"]] if kept["page"] else [])
        if kept["stamp"] == stamp and all(os.path.isfile(os.path.join(a.out, x)) for x in files):
            print("%s: figures and report up to date (%s)" % (a.name, path), flush=True)
            page = os.path.join(a.out, kept["page"]) if kept["page"] else None
            return kept["figures"], page
    except (OSError, ValueError, KeyError, TypeError):
        pass
    import plots
    figs = plots.write_all(summary, a.out)
    page = report(a, summary)
    with open(path + ".tmp", "w") as f:
        json.dump({"stamp": stamp, "figures": figs,
                   "page": os.path.basename(page) if page else None}, f)
    os.replace(path + ".tmp", path)
    return figs, page


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
    names = [n for n, _ in a.settings]
    if (bad or (a.baseline and a.baseline not in names) or not a.settings
            or any(t not in names for t in a.trend)):
        sys.stderr.write("%s: error: bad experiment definition (columns %s, baseline '%s', trend %s)\n"
                         % (prog, bad, a.baseline, a.trend))
        return 2
    msg = check_inputs(a)
    if msg:
        sys.stderr.write("%s: error: %s\n" % (prog, msg))
        return 1
    if a.restore:
        import runs_archive
        try:
            restored, kept = runs_archive.unpack(a.restore, a.out)
        except (OSError, ValueError) as e:
            sys.stderr.write("%s: error: --restore %s\n" % (prog, e))
            return 1
        print("%s: restored %d runs from %s (%d already in %s kept)"
              % (a.name, len(restored), a.restore, len(kept), a.out), flush=True)
    with open(os.path.join(a.data, "index.json")) as f:
        vocab = json.load(f)["vocab_size"]
    a.source_data, a.val_tokens = a.data, None
    import val_sample
    try:
        planned = val_sample.sample_tokens(a.data, a.val_blocks, a.val_block_tokens) if a.val_blocks else None
        a.identity = run_identity(a, planned)
        # Before anything is written (the validation sample included): kept runs must match.
        for w in check_kept(a):
            sys.stderr.write("%s: warning: %s\n" % (prog, w))
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.stderr.write("%s: error: %s\n" % (prog, e))
        return 1
    os.makedirs(a.out, exist_ok=True)
    if a.val_blocks:
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
        timing = time_all(a, vocab) if a.time_steps else None
        summary = summarise(a)
        summary["timing"] = timing
        summary["columns"], summary["stability"] = cols, a.stability  # for restat.py
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, allow_nan=False)
        md = markdown(summary, cols, a.stability)
        with open(os.path.join(a.out, "summary.md"), "w") as f:
            f.write(md)
        import evidence
        evidence.write_per_seed_csv(summary, cols, a.stability, os.path.join(a.out, "per_seed.csv"))
        evidence.write_configs(summary, a.out)
        figs, page = draw(a, summary)
        if a.publish:
            import publish
            files = publish.publish(a.out, a.publish)
            print("%s: published %d files, %d bytes, into %s"
                  % (a.name, len(files), sum(b for _, b in files), a.publish), flush=True)
    except (RuntimeError, OSError, ValueError, KeyError) as e:
        sys.stderr.write("%s: error: %s\n" % (prog, e))
        return 1
    print(md)
    print("%s: %s; figures %s; %s" % (a.name, os.path.join(a.out, "summary.md"), ", ".join(figs),
                                      page or "no report (no run finished)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
