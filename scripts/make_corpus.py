#!/usr/bin/env python3
"""Writes a synthetic text corpus of about SIZE bytes for prep tests and benchmarks.

usage: make_corpus.py OUT SIZE_BYTES [--seed N] [--jsonl]

Documents of 20-400 words drawn with a Zipf-like law from a 20000-word vocabulary of
pseudo-words, separated by blank lines (or one JSON object per line with --jsonl). The
same arguments give the same bytes.
"""
import argparse
import json
import random


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("size", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jsonl", action="store_true")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ber", "dan", "gor", "hel",
                 "ist", "jun", "kor", "lem", "qu", "xe", "zo", "ph"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4)))
             for _ in range(20000)]
    cum_weights, total = [], 0.0
    for i in range(len(words)):
        total += 1.0 / (i + 1)
        cum_weights.append(total)
    written = 0
    with open(args.out, "w", encoding="utf-8") as out:
        while written < args.size:
            n = rng.randint(20, 400)
            doc = " ".join(rng.choices(words, cum_weights=cum_weights, k=n))
            doc = doc.replace(" ka ", ".\n", 1)
            line = json.dumps({"text": doc}) + "\n" if args.jsonl else doc + "\n\n"
            out.write(line)
            written += len(line.encode("utf-8"))


if __name__ == "__main__":
    main()
