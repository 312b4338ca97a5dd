"""The experiment runner's checkable evidence beside summary.json (docs/experiments/README.md,
"What the runner does"): per_seed.csv, every run's own numbers (one row per run), and
configs/<setting>.yaml, each setting's resolved config with the keys that differ between its
seeds named at the top. With these a reader can recompute every mean, standard deviation and
paired test of summary.md and rerun any setting without the run directories.
"""
import csv
import json
import os

import measures

# Columns every row has, before the experiment's own (summary.md's --columns).
LEAD = ["setting", "seed", "status"]


def per_seed_columns(summary, columns, stability):
    """per_seed.csv's header: setting, seed, status, (stable, spiked with --stability),
    val_loss (final, the whole validation data), the Δ against the same-seed baseline run
    when the experiment has one, then every other measure summary.md shows, in its order
    (the speed-up with a speedup_censored flag beside it: 1 when the value is only a lower
    bound)."""
    head = list(LEAD)
    if stability:
        head += ["stable", "spiked", "worst_window_ratio", "worst_step_ratio"]
    head.append("val_loss")
    if summary.get("baseline"):
        head.append("delta_val_loss")
    for c in columns:
        if c in head or c == "step_alone":  # per setting (timing.json), not per run
            continue
        head.append(c)
        if c == "speedup":
            head.append("speedup_censored")
    return head


def _fmt(v):
    """A cell: empty for None, 0/1 for booleans, repr for floats (every digit, so that a
    reader's recomputed mean matches summary.json's), str otherwise."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def per_seed_rows(summary, columns, stability):
    """The rows of per_seed.csv: one per (setting, seed) in summary.json's order, each value
    the run's own (raw units: seconds, fractions, nats, FLOPs), empty where the run has none
    (a diverged run's quality, a dense run's routing, the baseline's own Δ)."""
    head = per_seed_columns(summary, columns, stability)
    rows = []
    for st in summary["settings"]:
        for r in summary["runs"][st["name"]]:
            row = []
            for c in head:
                if c == "setting":
                    v = st["name"]
                elif c == "speedup":
                    sp = r.get("speedup")
                    v = sp["speedup"] if sp else None
                elif c == "speedup_censored":
                    sp = r.get("speedup")
                    v = sp["censored"] if sp else None
                else:
                    v = r.get(c)
                row.append(_fmt(v))
            rows.append(row)
    return head, rows


def write_per_seed_csv(summary, columns, stability, path):
    head, rows = per_seed_rows(summary, columns, stability)
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(head)
        w.writerows(rows)
    os.replace(path + ".tmp", path)
    return len(rows)


def _flatten(tree, prefix=""):
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay values."""
    out = {}
    for k, v in tree.items():
        key = "%s.%s" % (prefix, k) if prefix else str(k)
        if isinstance(v, dict):
            out.update(_flatten(v, key))
        else:
            out[key] = v
    return out


def differing_keys(configs):
    """The dotted keys whose values are not the same in every config (dicts; a key missing
    from one counts as differing), sorted."""
    flats = [_flatten(c) for c in configs]
    keys = set().union(*[set(f) for f in flats]) if flats else set()
    return sorted(k for k in keys if len(set(repr(f.get(k)) for f in flats)) > 1)


def config_header(setting, seed, path, seeds, differ, values, missing):
    """The comment block on top of configs/<setting>.yaml."""
    lines = ["# %s: the resolved config of seed %d's run (%s), as `switchyard train` wrote it."
             % (setting, seed, path)]
    if differ:
        lines.append("# Keys that differ between the seeds' configs (seeds %s):" % ", ".join(map(str, seeds)))
        for k in differ:
            vals = ", ".join(json.dumps(v) for v in values[k])
            lines.append("#   %s: %s" % (k, vals))
    elif len(seeds) == 1:
        lines.append("# One seed's config (seed %d): nothing to compare." % seeds[0])
    else:
        lines.append("# The seeds' configs (seeds %s) are identical." % ", ".join(map(str, seeds)))
    if missing:
        lines.append("# No config from seed(s) %s (stopped before a checkpoint: diverged)."
                     % ", ".join(map(str, missing)))
    return "\n".join(lines) + "\n"


def write_configs(summary, out):
    """OUT/configs/<setting>.yaml for every setting with a checkpointed run: the first such
    seed's config.yaml, headed by the keys whose values differ across the seeds (normally
    only train.seed). Returns the files written (relative to OUT)."""
    import yaml
    d = os.path.join(out, "configs")
    os.makedirs(d, exist_ok=True)
    written = []
    for st in summary["settings"]:
        found, missing = [], []
        for r in summary["runs"][st["name"]]:
            p = measures.resolved_config_path(os.path.join(out, st["name"], "seed%d" % r["seed"]))
            (found if p else missing).append((r["seed"], p))
        if not found:
            continue
        cfgs = []
        for _, p in found:
            with open(p) as f:
                cfgs.append(yaml.safe_load(f))
        differ = differing_keys(cfgs)
        flats = [_flatten(c) for c in cfgs]
        values = {k: [f.get(k) for f in flats] for k in differ}
        seed, path = found[0]
        with open(path) as f:
            text = f.read()
        header = config_header(st["name"], seed, os.path.relpath(path, out), [s for s, _ in found],
                               differ, values, [s for s, _ in missing])
        name = os.path.join("configs", st["name"] + ".yaml")
        with open(os.path.join(out, name), "w") as f:
            f.write(header + text)
        written.append(name)
    return written
