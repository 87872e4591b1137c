#!/usr/bin/python3
"""Builds a sentence-pair task from tiny Shakespeare: does line B directly follow line A?

The text's non-empty lines are cut by position into three parts matching the character model's
splits (examples/configs/shakespeare_gpt.yaml: the first 90% of the text trains it, the next 5%
validates, the last 5% tests), so the pairs' validation and test lines are text the pre-trained
model never trained on. In each part, for a line A: the pair (A, the next line) is labelled
`follows`, and (A, a line drawn at random from the same part, not A's next) `random`; every
line's pairs stay in its part. The CSV's rows keep the parts in order (train, validation, test)
with the counts that data.split {train: 0.8, val: 0.1} cuts exactly.

Usage: examples/shakespeare_pairs.py [TEXT] [OUT.csv] [--train N] [--seed S]
"""
import argparse
import csv
import random

SHARES = (0.9, 0.05)  # the character model's train and validation shares of the text


def parts(text):
    """The non-empty lines of each part, by the position of the line's first character."""
    lines, pos = [], 0
    for line in text.split("\n"):
        if line.strip():
            lines.append((pos, line))
        pos += len(line) + 1
    a, b = int(SHARES[0] * len(text)), int((SHARES[0] + SHARES[1]) * len(text))
    return ([l for p, l in lines if p + len(l) < a],  # whole lines only: none spans a cut
            [l for p, l in lines if p >= a and p + len(l) < b],
            [l for p, l in lines if p >= b])


def pairs(lines, count, rng):
    """count / 2 lines A, each with its next line and with a random one."""
    rows = []
    for i in sorted(rng.sample(range(len(lines) - 1), count // 2)):
        j = i
        while j in (i, i + 1) or lines[j] == lines[i + 1]:
            j = rng.randrange(len(lines))
        rows.append((lines[i], lines[i + 1], "follows"))
        rows.append((lines[i], lines[j], "random"))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("text", nargs="?", default="data/tinyshakespeare.txt")
    ap.add_argument("out", nargs="?", default="data/shakespeare_pairs.csv")
    ap.add_argument("--train", type=int, default=4000, help="training pairs (a multiple of 16)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.train % 16:
        ap.error("--train must be a multiple of 16")
    with open(args.text, encoding="utf-8") as f:
        train_lines, val_lines, test_lines = parts(f.read())
    rng = random.Random(args.seed)
    held_out = args.train // 8  # validation and test: 10% of the rows each
    rows = (pairs(train_lines, args.train, rng) + pairs(val_lines, held_out, rng) +
            pairs(test_lines, held_out, rng))
    n = len(rows)
    # data.split {train: 0.8, val: 0.1} cuts at floor(0.8 n) and floor(0.9 n) (a whole share of n
    # kept whole): the parts' ends.
    def cut(share):
        return int(share * n * (1 + 1e-12))
    assert cut(0.8) == args.train and cut(0.8 + 0.1) == args.train + held_out, n
    with open(args.out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["line_a", "line_b", "label"])
        w.writerows(rows)
    print("%s: %d pairs (train %d, val %d, test %d) from %d / %d / %d lines" %
          (args.out, n, args.train, held_out, held_out, len(train_lines), len(val_lines),
           len(test_lines)))


if __name__ == "__main__":
    main()
