#!/usr/bin/python3
"""Fine-tuning a pre-trained model on Shakespeare sentence pairs: DoRA, LoRA, full fine-tuning and
training from scratch, over several seeds, each trained by seqforge with --config (the character
GPT's examples/configs/shakespeare_pairs_dora.yaml, or the Llama-architecture model's
examples/configs/shakespeare_pairs_llama_dora.yaml) and the overrides below. Prints per method the test
accuracy (mean, standard deviation and each seed's), the trainable share of the parameters, the
peak resident memory of the training process and the seconds per epoch, with the majority-class
baseline.

Needs the pre-trained model (seqforge train examples/configs/shakespeare_gpt.yaml, or
shakespeare_llama.yaml) and the pairs (examples/shakespeare_pairs.py).

Usage: examples/compare_finetuning.py [--seeds 5] [--seqforge build/seqforge]
           [--config examples/configs/shakespeare_pairs_dora.yaml]
           [--base runs/shakespeare_gpt] [--data data/shakespeare_pairs.csv] [--out runs/compare]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

CONFIG = "examples/configs/shakespeare_pairs_dora.yaml"
# Per method: overrides of the config. Adapters train at a higher rate than whole models, as
# usual with PEFT.
METHODS = {
    "dora": [],
    "lora": ["adapter.kind=lora"],
    "full": ["adapter.kind=none", "optim.lr=0.0005"],
    "scratch": ["adapter.kind=none", "model.init_from=", "optim.lr=0.001"],
}


def train(args, method, seed):
    run_dir = os.path.join(args.out, "%s-%d" % (method, seed))
    overrides = METHODS[method]
    with open(args.config) as f:
        decoder = "family: decoder" in f.read()
    if method == "scratch" and decoder:  # a new model of the base's config.json
        overrides = ["adapter.kind=none", "model.from_config=true", "optim.lr=0.001"]
    cmd = [args.seqforge, "train", args.config, "data.path=" + args.data,
           "model.init_from=" + args.base, "train.seed=%d" % seed, "train.run_dir=" + run_dir,
           "--overwrite"] + overrides + args.set
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if out.returncode != 0:
        sys.exit("%s failed:\n%s" % (" ".join(cmd), out.stdout))
    share = 100.0
    m = re.search(r"trainable parameters \(([0-9.]+)%\)", out.stdout)
    if m:
        share = float(m.group(1))
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    epochs = [r for r in records if "epoch" in r]
    test = [r for r in records if r.get("split") == "test"][-1]
    return dict(accuracy=test["test_accuracy"], majority=test["test_majority_accuracy"],
                share=share, peak_mb=max(r["peak_rss_mb"] for r in epochs),
                epoch_s=statistics.median(r["epoch_seconds"] for r in epochs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--seqforge", default="build/seqforge")
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--base", default="runs/shakespeare_gpt")
    ap.add_argument("--data", default="data/shakespeare_pairs.csv")
    ap.add_argument("--out", default="runs/compare")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--set", nargs="*", default=[], help="more key=value overrides for every run")
    args = ap.parse_args()
    results = {}
    for method in args.methods.split(","):
        results[method] = [train(args, method, seed) for seed in range(1, args.seeds + 1)]
        runs = results[method]
        print("%-8s done: %s" % (method, " ".join("%.3f" % r["accuracy"] for r in runs)),
              flush=True)
    print("\nsentence pairs, test split (%d seeds; majority class %.3f)" %
          (args.seeds, results[next(iter(results))][0]["majority"]))
    print("%-8s %-15s %-10s %-10s %-9s %s" %
          ("method", "accuracy", "trainable", "peak MB", "s/epoch", "per seed"))
    for method, runs in results.items():
        acc = [r["accuracy"] for r in runs]
        sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
        print("%-8s %.3f +- %.3f  %-10s %-10.0f %-9.1f %s" %
              (method, statistics.mean(acc), sd, "%.2f%%" % runs[0]["share"],
               max(r["peak_mb"] for r in runs), statistics.median(r["epoch_s"] for r in runs),
               " ".join("%.3f" % a for a in acc)))


if __name__ == "__main__":
    main()
