"""The experiment runner's flags (runner.py; scripts/experiments/lib.sh passes them): what an
experiment script fixes (its settings, columns, baseline, default steps, seeds and data) and
what the user may change, each bad value one error line (Usage), and the inputs checked
before anything is created (check_inputs).
"""
import argparse
import os


class Usage(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Usage(message)


# The keys the runner sets for every run (run_one): a --set of one would override the
# runner's own value (user sets come last) and silently break the design, e.g. every seed
# the same run. Refused at parsing, each pointing at the flag that controls it.
RESERVED = {
    "train.seed": "the runner sets each run's train.seed; use --seeds",
    "train.max_steps": "the runner sets each run's train.max_steps; use --steps",
    "data.dir": "the runner sets each run's data.dir; use --data",
    "data.paths": "a blend would train on other data than --data, on which the runs are "
                  "evaluated; use --data",
    "model.vocab_size": "the runner sets each run's model.vocab_size to the prepared data's "
                        "(its index.json); use --data",
}


def parse(argv):
    p = Parser(add_help=False)
    # What the experiment script fixes.
    p.add_argument("--name", required=True)
    p.add_argument("--title", required=True)
    p.add_argument("--setting", action="append", default=[], metavar="NAME=K=V K=V")
    p.add_argument("--columns", default="val_loss,perplexity,step_s")
    p.add_argument("--baseline", default="", help="setting each run is paired with (same seed): Δ, speed-up")
    p.add_argument("--stability", action="store_true", help="stable / spiked / diverged columns")
    p.add_argument("--default-steps", type=int, default=100)
    p.add_argument("--default-seeds", default="3")
    p.add_argument("--default-data", default="data/code")
    p.add_argument("--budget-note", default="")
    p.add_argument("--trend", default="", help="settings whose Δ is regressed on log2 moe.num_experts")
    p.add_argument("--power-effects", default="0.005,0.01,0.02",
                   help="effects (nats of Δ val loss) to size seed counts for")
    # What the user may change.
    p.add_argument("--grid", default="full")
    p.add_argument("--grids", default="full,ci", help="the grids the experiment script defines")
    p.add_argument("--config")
    p.add_argument("--out")
    p.add_argument("--data")
    p.add_argument("--seeds")
    p.add_argument("--steps", type=int)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--bin")
    p.add_argument("--set", action="append", default=[], dest="extra")
    p.add_argument("--time-steps", type=int, default=0,
                   help="after training, time every setting alone for this many steps "
                        "(timing.json; 0: no timing pass)")
    p.add_argument("--time-rounds", type=int, default=3)
    p.add_argument("--val-blocks", type=int, default=1024)
    p.add_argument("--val-block-tokens", type=int, default=1024)
    p.add_argument("--publish", default="", metavar="DIR",
                   help="copy summary.*, per_seed.csv, configs/, the figures and runs.tar.xz into DIR")
    p.add_argument("--restore", default="", metavar="FILE",
                   help="first restore the runs of a runs archive (runs_archive.py) into --out")
    a = p.parse_args(argv)
    grids = a.grids.split(",")
    if a.grid not in grids:
        raise Usage("--grid '%s' is not one of %s" % (a.grid, ", ".join(grids)))
    a.steps = a.default_steps if a.steps is None else a.steps
    a.trend = a.trend.split()
    try:
        a.power_effects = [float(e) for e in a.power_effects.split(",")]
    except ValueError:
        raise Usage("--power-effects '%s' is not a list of numbers" % a.power_effects)
    if any(not e > 0 for e in a.power_effects):
        raise Usage("--power-effects '%s': every effect must be positive" % a.power_effects)
    if a.steps < 1:
        raise Usage("--steps %d must be a positive integer" % a.steps)
    if a.jobs < 1:
        raise Usage("--jobs %d must be a positive integer" % a.jobs)
    if a.time_steps < 0 or a.time_rounds < 1:
        raise Usage("--time-steps %d must be >= 0 and --time-rounds %d >= 1"
                    % (a.time_steps, a.time_rounds))
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
        key = kv.split("=", 1)[0].strip()
        if key in RESERVED:
            raise Usage("--set '%s': %s" % (kv, RESERVED[key]))
    a.settings = []
    for s in a.setting:
        name, _, sets = s.partition("=")
        a.settings.append((name, sets.split()))
    a.data = a.data or a.default_data
    a.out = a.out or os.path.join("runs", "experiments", a.name + ("" if a.grid == "full" else "-" + a.grid))
    return a


def check_inputs(a):
    """Missing inputs are one line each (exit 1), before anything is created."""
    if not os.access(a.bin, os.X_OK):
        return "%s is not built (ninja -C build switchyard, or --bin PATH)" % a.bin
    if not os.path.isfile(a.config):
        return "--config %s: no such file" % a.config
    if not os.path.isfile(os.path.join(a.data, "index.json")):
        d = a.data.rstrip("/")
        hint = ("python3 scripts/make_code_corpus.py builds it" if d.endswith("data/code")
                else "python3 scripts/make_code_corpus.py --out %s --vocab 2048 builds it" % d
                if d.endswith("data/code-v2048")
                else "switchyard prep --out %s builds it" % a.data)
        return "--data %s: no prepared corpus there (no index.json; %s, or pass --data DIR)" % (a.data, hint)
    return None
