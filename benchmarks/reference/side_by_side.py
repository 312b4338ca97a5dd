"""Fair side-by-side timing of two programs (ours and PyTorch), shared by the comparison
drivers (compare_moe_layer.py, compare_train.py).

Fair means: each side is tried under every thread setting a user of it would try (a
setting is a name, environment variables and extra arguments); the sides and their
settings are run in alternation, round after round, so a change of machine load hits all of
them alike; each (side, setting) gets the median and the min-max of its rounds, the best
setting of each side is the one with the best median, and the figure compared is the ratio
of the two best medians. Nothing here asserts on time.
"""
import json
import os
import statistics
import subprocess
import sys

# PyTorch's thread knobs on a CPU: torch.set_num_threads (intra-op OpenMP threads, passed as
# --threads), OpenBLAS's own threads (Debian's torch calls OpenBLAS for matrix products), and
# OpenMP's wait policy (PASSIVE: idle threads sleep instead of spinning against OpenBLAS's).
TORCH_SETTINGS = {
    "torch1-blas1": ({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}, ["--threads", "1"]),
    "torch1-blas2": ({"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "1"}, ["--threads", "1"]),
    "torch2-blas1": ({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "2"}, ["--threads", "2"]),
    "torch2-blas2": ({"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}, ["--threads", "2"]),
    "torch2-blas2-passive": ({"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2",
                              "OMP_WAIT_POLICY": "PASSIVE"}, ["--threads", "2"]),
    "torch2-blas1-passive": ({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "2",
                              "OMP_WAIT_POLICY": "PASSIVE"}, ["--threads", "2"]),
}

# Ours: the size of our compute pool (engine/core/thread_pool.h, which reads OPENBLAS_NUM_THREADS
# when SWITCHYARD_THREADS is unset; OpenBLAS itself then runs one thread per call); the
# passive variant is there for symmetry (OMP_WAIT_POLICY means nothing to our pool).
OURS_SETTINGS = {
    "blas1": ({"OPENBLAS_NUM_THREADS": "1"}, ["--threads", "1"]),
    "blas2": ({"OPENBLAS_NUM_THREADS": "2"}, ["--threads", "2"]),
    "blas2-passive": ({"OPENBLAS_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
                      ["--threads", "2"]),
}


def pick(settings, names):
    """The entries of `settings` named in the comma-separated `names` ('' or 'all': all)."""
    if not names or names == "all":
        return dict(settings)
    out = {}
    for name in names.split(","):
        if name not in settings:
            sys.exit(f"side_by_side: unknown setting '{name}' (known: {', '.join(settings)})")
        out[name] = settings[name]
    return out


def run(cmd, env_extra, log):
    """Runs cmd with env_extra added to the environment; its output goes to log (a path).
    Exits with the log's tail when the command fails."""
    env = dict(os.environ)
    env.update(env_extra)
    with open(log, "w") as out:
        rc = subprocess.call(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        tail = open(log).read()[-2000:]
        sys.exit(f"side_by_side: {' '.join(cmd)} exited {rc}; its log {log}:\n{tail}")


def summarize(values):
    """{median, min, max, runs, values} of a list of numbers."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values), "values": values}


def alternate(sides, rounds, measure):
    """Runs every (side, setting) once per round, sides alternating within the round
    (ours setting 1, torch setting 1, ours setting 2, ...), for `rounds` rounds.
    sides: {side: {setting: payload}}; measure(side, setting, payload, round) -> a number.
    Returns {side: {setting: summarize(values)}}."""
    order = []
    names = {side: list(settings) for side, settings in sides.items()}
    for i in range(max(len(v) for v in names.values())):
        for side in sides:
            if i < len(names[side]):
                order.append((side, names[side][i]))
    values = {side: {name: [] for name in names[side]} for side in sides}
    for r in range(rounds):
        for side, name in order:
            values[side][name].append(measure(side, name, sides[side][name], r))
    return {side: {name: summarize(v) for name, v in per.items()} for side, per in values.items()}


def best(per_setting, lower_is_better):
    """(name, summary) of the setting with the best median."""
    key = lambda item: item[1]["median"]
    items = list(per_setting.items())
    return min(items, key=key) if lower_is_better else max(items, key=key)


def fmt(summary, digits=2):
    """'median (min-max)'."""
    return (f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}-"
            f"{summary['max']:.{digits}f})")


def write_json(path, obj):
    with open(path, "w") as out:
        json.dump(obj, out, indent=2)
        out.write("\n")
