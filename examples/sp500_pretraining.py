#!/usr/bin/python3
"""What pre-training buys on the S&P 500 example.

Pre-trains the masked autoencoder once (examples/configs/sp500_pretrain.yaml), then, for each
seed, fine-tunes the volatility classifier (examples/configs/sp500_finetune.yaml) on the seed's
labelled subset twice: from the pre-trained encoder, and from scratch (random initialisation, no
frozen epochs). Prints each run's test accuracy, their means, and the majority-class baseline
(always predicting the most frequent class of the seed's labelled training windows).

Usage: /usr/bin/python3 examples/sp500_pretraining.py [--seeds 5] [--label-fraction 0.1]
       [--seqforge build/seqforge] [--work runs/sp500_pretraining] [key.path=value ...]
Extra key=value overrides go to both fine-tuning arms.
"""
import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd):
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("failed: %s\n%s%s" % (" ".join(cmd), out.stdout, out.stderr))
    return out.stdout


def test_metrics(seqforge, run_dir):
    values = {}
    for line in run([seqforge, "eval", run_dir, "--split", "test"]).splitlines():
        key, value = line.split()
        values[key] = float(value)
    return values


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--label-fraction", type=float, default=0.1)
    p.add_argument("--seqforge", default=os.path.join(ROOT, "build", "seqforge"))
    p.add_argument("--work", default=os.path.join(ROOT, "runs", "sp500_pretraining"))
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    configs = os.path.join(ROOT, "examples", "configs")
    pretrain = os.path.join(a.work, "pretrain")
    print("pre-training the masked autoencoder ...", flush=True)
    run([a.seqforge, "train", "--overwrite", os.path.join(configs, "sp500_pretrain.yaml"),
         "train.run_dir=" + pretrain])
    encoder = os.path.join(pretrain, "model.safetensors")
    rows = []
    for seed in range(1, a.seeds + 1):
        common = ["train.seed=%d" % seed, "data.label_fraction=%g" % a.label_fraction]
        common += a.overrides
        accuracy = {}
        for arm, extra in (("pretrained", ["model.init_from=" + encoder]),
                           ("scratch", ["model.init_from=", "train.freeze_modules=[]",
                                        "train.freeze_epochs=0"])):
            run_dir = os.path.join(a.work, "%s-%d" % (arm, seed))
            run([a.seqforge, "train", "--overwrite", os.path.join(configs, "sp500_finetune.yaml"),
                 "train.run_dir=" + run_dir] + common + extra)
            m = test_metrics(a.seqforge, run_dir)
            accuracy[arm] = m["test_accuracy"]
            baseline = m["test_majority_accuracy"]
        rows.append((seed, accuracy["pretrained"], accuracy["scratch"], baseline))
        print("seed %d: test accuracy pretrained %.4f, scratch %.4f (majority class %.4f)" %
              rows[-1], flush=True)
    pre = [r[1] for r in rows]
    scratch = [r[2] for r in rows]
    spread = (lambda v: statistics.stdev(v) if len(v) > 1 else 0.0)
    print("\n%d seeds, %g of the training labels:" % (len(rows), a.label_fraction))
    print("  from the pre-trained encoder  %.4f +- %.4f" % (statistics.mean(pre), spread(pre)))
    print("  from scratch                  %.4f +- %.4f" % (statistics.mean(scratch),
                                                          spread(scratch)))
    baselines = [r[3] for r in rows]
    print("  majority-class baseline       %.4f (%.4f to %.4f)" %
          (statistics.mean(baselines), min(baselines), max(baselines)))
    wins = sum(1 for r in rows if r[1] > r[2])
    print("  pre-trained ahead in %d of %d seeds" % (wins, len(rows)))


if __name__ == "__main__":
    main()
