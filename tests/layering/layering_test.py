#!/usr/bin/env python3
"""DESIGN.md's layer order, checked on every #include of the engine's sources.

    core <- kernels <- dist <- parallel <- dense <- moe <- model <- {data, checkpoint}
         <- config <- plan <- train <- cli

A file may include headers of its own folder and of folders to its left; data and checkpoint
are siblings and include neither each other nor anything to their right. Prints every
violation as `file:line: folder -> included folder` and exits 1 when there is one.
Usage: layering_test.py REPO_ROOT
"""
import os
import re
import sys

# Folder -> level; a folder may include only lower levels (and itself).
LEVELS = {
    "engine/core": 0,
    "kernels": 1,
    "engine/dist": 2,
    "engine/parallel": 3,
    "dense": 4,
    "moe": 5,
    "engine/model": 6,
    "engine/data": 7,
    "engine/checkpoint": 7,
    "engine/config": 8,
    "engine/plan": 9,
    "engine/train": 10,
    "engine/cli": 11,
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(path):
    """The LEVELS folder a repository path belongs to (the longest prefix), or None."""
    best = None
    for folder in LEVELS:
        if path == folder or path.startswith(folder + "/"):
            if best is None or len(folder) > len(best):
                best = folder
    return best


def main(root):
    violations, checked = [], 0
    for folder in LEVELS:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                mine = folder_of(rel)
                with open(path, encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        checked += 1
                        theirs = folder_of(m.group(1))
                        if theirs is None or theirs == mine:
                            continue
                        if LEVELS[theirs] >= LEVELS[mine]:
                            violations.append(f"{rel}:{lineno}: {mine} -> {theirs} ({m.group(1)})")
    for v in violations:
        print(v)
    print(f"{checked} includes checked, {len(violations)} against the layer order")
    return 1 if violations or checked == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
