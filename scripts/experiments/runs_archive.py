#!/usr/bin/python3
"""An experiment's finished runs as one compressed file, so that an experiment can be
summarised again, or finished, on another machine (docs/experiments/README.md, "Carrying
runs to another machine"):

    /usr/bin/python3 scripts/experiments/runs_archive.py pack OUT FILE.tar.xz
    /usr/bin/python3 scripts/experiments/runs_archive.py unpack FILE.tar.xz OUT

pack writes what the runner and its measures read of every finished run in OUT (a directory
<setting>/seed<N> holding run.json): run.json, eval.json, metrics.jsonl, routing.jsonl,
routing_by_language.json, latest, and the latest checkpoint's config.yaml and
trainer_state.json (no weights, optimizer state or logs), plus OUT/timing.json. Members are
sorted, with zeroed owners and times, so the same runs give the same bytes.

unpack restores them into OUT. A run OUT already holds (its run.json exists) is kept as it
is, and so is an existing timing.json (a run directory without run.json, an interrupted
run, is replaced); the rest of the archive is checked before anything is
written (paths inside OUT, only the files pack writes), so a bad archive is one error line
(exit 1) and changes nothing. The runner then counts the restored runs as done
(`--restore FILE` does this before training).
"""
import io
import os
import re
import shutil
import sys
import tarfile

RUN_FILES = ("run.json", "eval.json", "metrics.jsonl", "routing.jsonl",
             "routing_by_language.json", "latest")
CHECKPOINT_FILES = ("config.yaml", "trainer_state.json")
TOP_FILES = ("timing.json",)
# What unpack accepts: <setting>/seed<N>/<run file> or .../step-<N>/<checkpoint file>.
_MEMBER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*/seed[0-9]+/(%s|step-[0-9]+/(%s))$"
                     % ("|".join(map(re.escape, RUN_FILES)), "|".join(map(re.escape, CHECKPOINT_FILES))))


def run_dirs(out):
    """The finished runs in out, as sorted relative paths <setting>/seed<N>."""
    found = []
    for setting in sorted(os.listdir(out)):
        sdir = os.path.join(out, setting)
        if not os.path.isdir(sdir):
            continue
        for seed in sorted(os.listdir(sdir)):
            if re.fullmatch(r"seed[0-9]+", seed) and os.path.isfile(os.path.join(sdir, seed, "run.json")):
                found.append(setting + "/" + seed)
    return found


def members(out):
    """[(relative path, absolute path)] of what pack writes for out."""
    files = [(n, os.path.join(out, n)) for n in TOP_FILES if os.path.isfile(os.path.join(out, n))]
    for rel in run_dirs(out):
        d = os.path.join(out, rel)
        files += [(rel + "/" + n, os.path.join(d, n)) for n in RUN_FILES if os.path.isfile(os.path.join(d, n))]
        steps = sorted(s for s in os.listdir(d) if re.fullmatch(r"step-[0-9]+", s))
        if steps:
            files += [(rel + "/" + steps[-1] + "/" + n, os.path.join(d, steps[-1], n))
                      for n in CHECKPOINT_FILES if os.path.isfile(os.path.join(d, steps[-1], n))]
    return files


def pack(out, path):
    """Writes the archive of out's finished runs to path; returns (runs, bytes)."""
    if not os.path.isdir(out):
        raise ValueError("%s: no such directory" % out)
    runs = run_dirs(out)
    if not runs:
        raise ValueError("%s holds no finished run (no <setting>/seed<N>/run.json)" % out)
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:xz", preset=9, format=tarfile.PAX_FORMAT) as tar:
        for rel, src in members(out):
            with open(src, "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(rel)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)
    return len(runs), os.path.getsize(path)


def unpack(path, out):
    """Restores path's runs into out, keeping what out already holds; returns
    (restored runs, kept runs)."""
    try:
        with tarfile.open(path, "r:xz") as tar:
            files = {}
            for m in tar.getmembers():
                if not m.isfile() or not (_MEMBER.match(m.name) or m.name in TOP_FILES):
                    raise ValueError("%s: unexpected member '%s' (not a runs archive)" % (path, m.name))
                files[m.name] = tar.extractfile(m).read()
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ValueError("%s: not a readable .tar.xz (%s)" % (path, e))
    def run_of(name):
        return "/".join(name.split("/")[:2])
    runs = sorted({run_of(n) for n in files if n not in TOP_FILES})
    missing = [r for r in runs if r + "/run.json" not in files]
    if missing:
        raise ValueError("%s: run %s has no run.json" % (path, missing[0]))
    kept = [r for r in runs if os.path.isfile(os.path.join(out, r, "run.json"))]
    restored = [r for r in runs if r not in kept]
    for r in restored:  # an interrupted run's leftovers (the runner would discard them too)
        shutil.rmtree(os.path.join(out, r), ignore_errors=True)
    todo = [n for n in TOP_FILES if n in files and not os.path.exists(os.path.join(out, n))]
    # The runs' files, every run.json last: it marks its run complete.
    todo += sorted((n for n in files if n not in TOP_FILES and run_of(n) in restored),
                   key=lambda n: n.endswith("/run.json"))
    for name in todo:
        dst = os.path.join(out, name)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst + ".tmp", "wb") as f:
            f.write(files[name])
        os.replace(dst + ".tmp", dst)
    return restored, kept


def main(argv):
    usage = ("usage: runs_archive.py pack OUT FILE.tar.xz | unpack FILE.tar.xz OUT "
             "(an experiment's output directory and its runs archive)\n")
    if len(argv) != 3 or argv[0] not in ("pack", "unpack"):
        sys.stderr.write(usage)
        return 2
    try:
        if argv[0] == "pack":
            n, size = pack(argv[1], argv[2])
            print("runs_archive: %d runs of %s in %s (%d bytes)" % (n, argv[1], argv[2], size))
        else:
            restored, kept = unpack(argv[1], argv[2])
            print("runs_archive: %d runs restored into %s, %d already there kept"
                  % (len(restored), argv[2], len(kept)))
    except (OSError, ValueError) as e:
        sys.stderr.write("runs_archive.py: error: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
