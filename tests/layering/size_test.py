#!/usr/bin/env python3
"""Files of one concept, functions of one screen: no source file of the engine, kernels,
layers or benchmarks over MAX_FILE lines and no function over MAX_FUNCTION lines, except the
files listed in ALLOWED with the reason one concept needs the length. Tests are exempt.

A function is a definition that starts at column 0 (Google style: namespaces do not
indent), or a member function defined inside a class or struct body (two columns in from
the class), and ends at the next `}` at its own indentation; its length counts both lines.
Prints every file and function over its limit and exits 1 when there is one.
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

SIGNATURE = re.compile(r"^[A-Za-z_~][\w:<>,\s\*&~\[\]]*\b[\w:~]+\s*\(")
NOT_FUNCTION = re.compile(
    r"^(namespace|struct|class|enum|union|extern|using|typedef|return|if|for|while|switch|"
    r"else|do|case|template\s*<[^>]*>\s*(struct|class))\b")
CLASS_OPEN = re.compile(r"^(\s*)(?:template\s*<[^>]*>\s*)?(?:class|struct)\s+\w+[^;]*\{\s*$")


def functions(lines):
    """(signature, first line number, length) of each function definition at column 0 and of
    each member function defined in a class body."""
    classes = []  # indentation of the class bodies we are in
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip(" "))
        m = CLASS_OPEN.match(line)
        if m:
            classes.append(len(m.group(1)))
            i += 1
            continue
        if classes and line.strip().startswith("};") and indent == classes[-1]:
            classes.pop()
            i += 1
            continue
        member = bool(classes) and indent == classes[-1] + 2
        body = line[indent:]
        if (indent == 0 or member) and SIGNATURE.match(body) and not NOT_FUNCTION.match(body):
            # The signature may span lines; the body opens with '{' at the end of a line.
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith("{") and ";" not in lines[j]:
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{") and ";" not in lines[j]:
                if lines[j].rstrip().endswith("}"):  # a one-line body
                    i = j + 1
                    continue
                end = re.compile(r"^ {%d}\}" % indent)
                k = j + 1
                while k < len(lines) and not end.match(lines[k]):
                    k += 1
                yield body.strip(), i + 1, k - i + 1
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
