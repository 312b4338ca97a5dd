#!/usr/bin/env python3
"""Files of one concept, functions of one screen: no source file of the engine, kernels,
layers or benchmarks over MAX_FILE lines and no function over MAX_FUNCTION lines, except the
files listed in ALLOWED with the reason one concept needs the length. Tests are exempt.

A function is a definition that starts at column 0 (Google style: namespaces do not
indent) and ends at the next `}` at column 0; its length counts both lines. Prints every
file and function over its limit and exits 1 when there is one.
Usage: size_test.py REPO_ROOT
"""
import os
import re
import sys

MAX_FILE = 500
MAX_FUNCTION = 80
FOLDERS = ["engine", "kernels", "dense", "moe", "benchmarks"]
# Files allowed past MAX_FILE lines, and why.
ALLOWED = {}

SIGNATURE = re.compile(r"^[A-Za-z_][\w:<>,\s\*&~\[\]]*\b[\w:~]+\s*\(")
NOT_FUNCTION = re.compile(r"^(namespace|struct|class|enum|union|extern|using|typedef|template\s*<[^>]*>\s*(struct|class))\b")


def functions(lines):
    """(name line, first line number, length) of each column-0 function definition."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if SIGNATURE.match(line) and not NOT_FUNCTION.match(line):
            # The signature may span lines; the body opens with '{' at the end of a line.
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith("{") and ";" not in lines[j]:
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{") and ";" not in lines[j]:
                k = j + 1
                while k < len(lines) and not lines[k].startswith("}"):
                    k += 1
                yield line.strip(), i + 1, k - i + 1
                i = k + 1
                continue
        i += 1


def main(root):
    problems = []
    for folder in FOLDERS:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8") as f:
                    lines = f.read().split("\n")
                n = len(lines) - (1 if lines and lines[-1] == "" else 0)
                if n > MAX_FILE and rel not in ALLOWED:
                    problems.append(f"{rel}: {n} lines (limit {MAX_FILE})")
                for sig, first, length in functions(lines):
                    if length > MAX_FUNCTION:
                        problems.append(f"{rel}:{first}: {length}-line function: {sig[:70]}")
    for p in problems:
        print(p)
    print(f"{len(problems)} files or functions over the limits")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
