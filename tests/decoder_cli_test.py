#!/usr/bin/python3
"""A Hugging Face folder through the command line, as a user has one on disk: a byte-level BPE
from `seqforge tokenizer train`, a small Llama-architecture config.json and its weights. `train`
with data.task lm and model.family decoder lowers the loss from its start (ln V), `eval` and
`generate` read the run back, a model pre-trained from config.json alone (model.from_config)
leaves a run directory that is a Hugging Face folder the next run starts from, a DoRA run merged by `seqforge merge` into a new folder evaluates
as the adapters did, a LoRA pair classifier (text_classify) trains, evaluates and predicts, and
bad setups are one line each.

Usage: decoder_cli_test.py SEQFORGE SHAKESPEARE.txt WORK_DIR
"""
import json
import math
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
from make_decoder_fixtures import forward, parameters, write_safetensors  # noqa: E402

import torch  # noqa: E402

VOCAB = 384
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fail(message):
    raise SystemExit("FAIL: " + message)


def run(args, expect_ok=True, env=None):
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    if expect_ok and r.returncode != 0:
        fail(" ".join(args) + " failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
    return r


def make_folder(seqforge, text, folder, vocab_size=VOCAB):
    os.makedirs(folder, exist_ok=True)
    run([seqforge, "tokenizer", "train", text, "--vocab-size", str(VOCAB), "-o",
         os.path.join(folder, "tokenizer.json")])
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "vocab_size": vocab_size, "hidden_size": 48, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 12, "hidden_act": "silu", "max_position_embeddings": 128,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
              "initializer_range": 0.02, "torch_dtype": "bfloat16", "bos_token_id": 0,
              "eos_token_id": 0}
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    p = parameters(config, torch.Generator().manual_seed(0))
    p = {n: torch.ones_like(t) if n.endswith("norm.weight") else 0.1 * t for n, t in p.items()}
    write_safetensors(os.path.join(folder, "model.safetensors"),
                      {n: (t, "F32") for n, t in p.items()}, {"format": "pt"})


def write_config(path, data, folder, run_dir, extra=""):
    with open(path, "w") as f:
        f.write(f"""data:
  task: lm
  path: {data}
  seq_len: 32
model:
  family: decoder
  init_from: {folder}
train:
  epochs: 1
  batch_size: 16
  max_batches: 20
  run_dir: {run_dir}
optim:
  lr: 0.003
{extra}""")


def last_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if '"epoch"' in line]
    return rows[-1]


def eval_metrics(seqforge, run_dir):
    out = run([seqforge, "eval", run_dir, "--json"]).stdout
    return json.loads(out.strip().splitlines()[-1])


def read_safetensors(path):
    """{name: float32 tensor} of an F32 safetensors file."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        body = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        assert entry["dtype"] == "F32", entry
        out[name] = torch.frombuffer(bytearray(body[begin:end]), dtype=torch.float32).reshape(
            entry["shape"])
    return out


def reference_greedy(seqforge, run_dir, prompt, length):
    """What greedy decoding of the run's model gives in PyTorch (make_decoder_fixtures' forward),
    each token after the last max_position_embeddings tokens, stopping at the end-of-text id."""
    with open(os.path.join(run_dir, "config.json")) as f:
        config = json.load(f)
    config.setdefault("rope_scaling", None)
    config.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    p = read_safetensors(os.path.join(run_dir, "model.safetensors"))
    tokenizer = os.path.join(run_dir, "tokenizer.json")
    ids = [int(t) for t in subprocess.run([seqforge, "tokenize", tokenizer, "--whole"],
                                          input=prompt, capture_output=True, text=True,
                                          check=True).stdout.split()]
    made = []
    with torch.no_grad():
        for _ in range(length):
            window = ids[-config["max_position_embeddings"]:]
            logits = forward(config, p, torch.tensor([window]))
            nxt = int(logits[-1].argmax())
            if nxt == config["eos_token_id"]:
                break
            ids.append(nxt)
            made.append(nxt)
    text = subprocess.run([seqforge, "tokenize", tokenizer, "--decode", "--skip-special"],
                          input=" ".join(map(str, made)) + "\n", capture_output=True,
                          text=True, check=True).stdout
    return prompt + text


def main():
    seqforge, text, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    data = os.path.join(work, "shakespeare.txt")
    with open(text, encoding="utf-8") as f:
        head = f.read()[:100000]
    with open(data, "w", encoding="utf-8") as f:
        f.write(head)
    folder = os.path.join(work, "base")
    make_folder(seqforge, data, folder)

    # Full fine-tuning: the loss falls from ln V.
    config = os.path.join(work, "lm.yaml")
    run_dir = os.path.join(work, "run")
    write_config(config, data, folder, run_dir)
    run([seqforge, "train", config, "train.precision=fp32"])
    m = last_metrics(run_dir)
    print(f"lm: val_loss {m['val_loss']:.3f} after 20 batches (ln V = {math.log(VOCAB):.3f})")
    if not m["val_loss"] < math.log(VOCAB) - 0.5:
        fail(f"the validation loss {m['val_loss']} did not fall below ln V - 0.5")
    if abs(m["val_perplexity"] - math.exp(m["val_loss"])) > 1e-6 * m["val_perplexity"]:
        fail("val_perplexity is not exp(val_loss)")
    e = eval_metrics(seqforge, run_dir)
    if "test_bits_per_token" not in e:
        fail(f"eval gave {e}")
    # Another text: every whole sequence of its tokens, as the run's tokenizer cuts it.
    other = os.path.join(work, "other.txt")
    with open(other, "w", encoding="utf-8") as f:
        f.write(head[-3000:])
    with open(other, encoding="utf-8") as f:
        ids = subprocess.run([seqforge, "tokenize", os.path.join(run_dir, "tokenizer.json"),
                              "--whole", "--no-special"],
                             stdin=f, capture_output=True, text=True, check=True).stdout.split()
    # --skip-special is decoding's; encoding without the special tokens is --no-special.
    r = subprocess.run([seqforge, "tokenize", os.path.join(run_dir, "tokenizer.json"),
                        "--skip-special"], input="text\n", capture_output=True, text=True)
    if r.returncode == 0 or "--skip-special" not in r.stderr or "--decode" not in r.stderr:
        fail(f"tokenize --skip-special without --decode: {r.returncode} {r.stderr!r}")
    # generate needs a prompt from a token model.
    r = subprocess.run([seqforge, "generate", run_dir, "--length", "3"], capture_output=True,
                       text=True)
    if r.returncode == 0 or "--prompt" not in r.stderr:
        fail(f"generate without a prompt: {r.returncode} {r.stderr!r}")
    out = run([seqforge, "eval", run_dir, "--data", other, "--json"]).stdout
    d = json.loads(out.strip().splitlines()[-1])
    if d["samples"] != (len(ids) - 1) // 32 or not 0 < d["data_loss"] < math.log(VOCAB) or \
            abs(d["data_perplexity"] - math.exp(d["data_loss"])) > 1e-9 * d["data_perplexity"]:
        fail(f"eval --data on {len(ids)} tokens gave {d}")
    print(f"eval --data: {d['samples']:.0f} sequences of {len(ids)} tokens, "
          f"data_loss {d['data_loss']:.3f}")
    # The same run with bf16 GEMMs (where the CPU has them) ends within 2% of its loss.
    bf16_dir = os.path.join(work, "run_bf16")
    out = run([seqforge, "train", config, "train.precision=bf16",
               "train.run_dir=" + bf16_dir]).stdout
    if "bf16 GEMMs" in out.splitlines()[0]:
        low = last_metrics(bf16_dir)["val_loss"]
        print(f"lm in bf16: val_loss {low:.4f}, fp32 {m['val_loss']:.4f}")
        if abs(low - m["val_loss"]) > 0.02 * m["val_loss"]:
            fail(f"bf16 val_loss {low} is not within 2% of fp32's {m['val_loss']}")
        # A resume held to AVX2 computes in fp32 for its leg alone: the run stays a bf16 one.
        capped = run([seqforge, "train", "--resume", bf16_dir, "train.epochs=2",
                      "train.max_batches=2"], env={**os.environ, "SEQFORGE_MAX_ISA": "avx2"}).stdout
        with open(os.path.join(bf16_dir, "config.resolved.yaml")) as f:
            recorded = [line.strip() for line in f if line.strip().startswith("precision:")]
        again = run([seqforge, "train", "--resume", bf16_dir, "train.epochs=3",
                     "train.max_batches=2"]).stdout
        if "fp32 GEMMs" not in capped.splitlines()[0] or recorded != ["precision: bf16"] or \
                "bf16 GEMMs" not in again.splitlines()[0]:
            fail(f"a bf16 run resumed under an AVX2 cap, then without: {capped.splitlines()[0]!r}, "
                 f"{recorded}, {again.splitlines()[0]!r}")
    else:
        print("lm in bf16: skipped, this CPU runs no bf16 GEMMs: " + out.splitlines()[0])
    out = run([seqforge, "generate", run_dir, "--prompt", "ROMEO:", "--length", "20"]).stdout
    if not out.startswith("ROMEO:") or len(out.strip()) <= len("ROMEO:"):
        fail(f"generate gave {out!r}")
    print("generate:", out.strip().replace("\n", " | ")[:80])
    # The run reads the tokenizer it keeps: the base folder's may change. Its own changed since
    # the run trained would give its ids other meanings: an error for eval and generate, until
    # the file is the one the run used.
    base_tokenizer = os.path.join(folder, "tokenizer.json")
    with open(base_tokenizer, "rb") as f:
        original = f.read()
    with open(base_tokenizer, "wb") as f:
        f.write(original + b"\n")
    run([seqforge, "eval", run_dir])
    with open(base_tokenizer, "wb") as f:
        f.write(original)
    tokenizer = os.path.join(run_dir, "tokenizer.json")
    with open(tokenizer, "rb") as f:
        kept = f.read()
    with open(tokenizer, "wb") as f:
        f.write(kept + b"\n")
    for cmd in (["eval", run_dir], ["generate", run_dir, "--prompt", "A", "--length", "2"]):
        r = run([seqforge] + cmd, expect_ok=False)
        if r.returncode == 0 or "is not the file the model was trained with" not in r.stderr:
            fail(f"{cmd[0]} with a changed tokenizer: {r.stderr!r}")
    with open(tokenizer, "wb") as f:
        f.write(kept)
    print("the run reads its own tokenizer, and a changed one is refused")
    # The model is built from the run's config.json: one changed since (another rope_theta)
    # would load the weights as another model, and is refused.
    own_config = os.path.join(run_dir, "config.json")
    with open(own_config, "rb") as f:
        kept = f.read()
    changed = json.loads(kept)
    changed["rope_theta"] = changed.get("rope_theta", 10000.0) * 3
    with open(own_config, "w") as f:
        json.dump(changed, f)
    r = run([seqforge, "eval", run_dir], expect_ok=False)
    if r.returncode == 0 or "differs in content from the config.json the run wrote" not in r.stderr:
        fail(f"eval with a changed config.json: {r.returncode} {r.stderr!r}")
    # The same content written otherwise (CRLF, another indent, keys sorted) is the same file.
    with open(own_config, "w", newline="\r\n") as f:
        json.dump(json.loads(kept), f, indent=4, sort_keys=True)
    run([seqforge, "eval", run_dir])
    with open(own_config, "wb") as f:
        f.write(kept)
    print("a changed config.json of the run is refused")
    # A resume reads the tokenizer and the base's config.json again: one changed since the run
    # began (the same tokens under other ids, another rope_theta) is refused, and the restored
    # files resume.
    resumed = os.path.join(work, "run_resumed")
    run([seqforge, "train", config, "train.precision=fp32", "train.max_batches=3",
         "train.run_dir=" + resumed])
    vocab_swapped = json.loads(original)
    v = vocab_swapped["model"]["vocab"]
    a, b = sorted(v)[:2]
    v[a], v[b] = v[b], v[a]
    with open(base_tokenizer, "w") as f:
        json.dump(vocab_swapped, f)
    r = run([seqforge, "train", "--resume", resumed, "train.epochs=2"], expect_ok=False)
    if r.returncode == 0 or "is not the file the model was trained with" not in r.stderr:
        fail(f"a resume with a changed tokenizer: {r.returncode} {r.stderr!r}")
    with open(base_tokenizer, "wb") as f:
        f.write(original)
    base_config = os.path.join(folder, "config.json")
    with open(base_config, "rb") as f:
        kept = f.read()
    changed = json.loads(kept)
    changed["rope_theta"] = changed["rope_theta"] * 3
    with open(base_config, "w") as f:
        json.dump(changed, f)
    r = run([seqforge, "train", "--resume", resumed, "train.epochs=2"], expect_ok=False)
    if r.returncode == 0 or "differs from the config.json the run trained with" not in r.stderr:
        fail(f"a resume with a changed base config.json: {r.returncode} {r.stderr!r}")
    with open(base_config, "wb") as f:
        f.write(kept)
    run([seqforge, "train", "--resume", resumed, "train.epochs=2"])
    if last_metrics(resumed)["epoch"] != 2:
        fail("the restored files did not resume")
    # A base saved again with other metadata alone (a newer transformers) resumes, and the run
    # keeps the config.json it began with: an epoch that saves no checkpoint (no better score at
    # rate 0) leaves the run whole.
    changed = json.loads(kept)
    changed["transformers_version"] = "9.9.9"
    changed["use_cache"] = not changed.get("use_cache", True)
    with open(base_config, "w") as f:
        json.dump(changed, f)
    run([seqforge, "train", "--resume", resumed, "train.epochs=3", "optim.lr=0"])
    run([seqforge, "eval", resumed])
    with open(os.path.join(resumed, "config.json")) as f:
        if "9.9.9" in f.read():
            fail("the resumed run's config.json was rewritten from the base saved again")
    with open(base_config, "wb") as f:
        f.write(kept)
    print("a resume refuses a tokenizer or base config.json changed since the run began")
    out = run([seqforge, "train", config, "train.max_batches=1", "model.dropout=0.1",
               "train.run_dir=" + os.path.join(work, "warned"), "--overwrite"]).stdout
    if "warning: model.dropout does not apply to model.family decoder" not in out:
        fail("model.dropout on a decoder should be a warning: " + out)

    # A nucleus this small keeps only the likeliest token: greedy decoding.
    greedy = run([seqforge, "generate", run_dir, "--prompt", "ROMEO:", "--length", "12",
                  "--temperature", "0"]).stdout
    nucleus = run([seqforge, "generate", run_dir, "--prompt", "ROMEO:", "--length", "12",
                   "--top-p", "1e-9", "--seed", "5"]).stdout
    if greedy != nucleus:
        fail(f"--top-p 1e-9 gave {nucleus!r}, greedy decoding {greedy!r}")
    hot = subprocess.run([seqforge, "generate", run_dir, "--prompt", "ROMEO:", "--temperature",
                          "inf"], capture_output=True, text=True)
    if hot.returncode == 0 or "--temperature must be 0" not in hot.stderr:
        fail(f"an infinite temperature should be one error: {hot.returncode} {hot.stderr!r}")

    # Greedy generation past the model's 128 positions (the key/value cache, then the last 128
    # tokens read afresh for each token) against PyTorch's greedy decoding of the same weights.
    long = run([seqforge, "generate", run_dir, "--prompt", "ROMEO:", "--length", "150",
                "--temperature", "0"]).stdout
    want = reference_greedy(seqforge, run_dir, "ROMEO:", 150)
    if long != want:
        fail(f"greedy generation {long!r} differs from PyTorch's {want!r}")
    print(f"generate: {len(long)} characters of greedy text, as PyTorch's")

    # Pre-training from config.json alone (from_config), and the run directory, a Hugging Face
    # folder itself, as the next run's base.
    shape_only = os.path.join(work, "shape_only")
    os.makedirs(shape_only)
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(os.path.join(folder, name), shape_only)
    scratch_dir = os.path.join(work, "scratch")
    write_config(config, data, shape_only, scratch_dir, "")
    out = run([seqforge, "train", config, "model.from_config=true"]).stdout
    if "from_config: a new llama model" not in out:
        fail("from_config: " + out)
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        if not os.path.exists(os.path.join(scratch_dir, name)):
            fail(f"a decoder run directory lacks {name}")
    write_config(config, data, scratch_dir, os.path.join(work, "continued"), "")
    out = run([seqforge, "train", config, "train.max_batches=1"]).stdout
    if "init_from: " not in out or scratch_dir not in out:
        fail("a run directory as the base: " + out)

    # DoRA on q, v and down_proj (base frozen), then merged into a Hugging Face folder that
    # evaluates as the adapters did (a run from it with lr 0 keeps its weights).
    dora_dir = os.path.join(work, "dora")
    write_config(config, data, folder, dora_dir,
                 "adapter:\n  kind: dora\n  rank: 4\n  alpha: 8\n"
                 "  targets: [q_proj, v_proj, down_proj]\n")
    run([seqforge, "train", config])
    with open(os.path.join(dora_dir, "adapter_config.json")) as f:
        peft = json.load(f)
    if peft["target_modules"] != ["q_proj", "v_proj", "down_proj"] or not peft["use_dora"]:
        fail(f"adapter_config.json: {peft}")
    adapted = eval_metrics(seqforge, dora_dir)
    merged = os.path.join(work, "merged")
    run([seqforge, "merge", dora_dir, "--output", merged])
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not os.path.exists(os.path.join(merged, name)):
            fail(f"merge wrote no {name}")
    r = run([seqforge, "eval", merged], expect_ok=False)
    if r.returncode == 0 or "a Hugging Face model folder, not a seqforge run" not in r.stderr:
        fail(f"eval of a merged folder: {r.stderr!r}")
    check_dir = os.path.join(work, "merged_run")
    write_config(config, data, merged, check_dir, "")
    run([seqforge, "train", config, "optim.lr=0", "train.max_batches=1"])
    again = eval_metrics(seqforge, check_dir)
    gap = abs(again["test_loss"] - adapted["test_loss"]) / adapted["test_loss"]
    print(f"merged: test_loss {again['test_loss']:.6f}, adapters {adapted['test_loss']:.6f}")
    if gap > 1e-5:
        fail(f"the merged folder's test loss differs from the adapters' by {gap:.2e}")
    r = run([seqforge, "merge", dora_dir, "--output", folder], expect_ok=False)
    if r.returncode == 0 or "is the base model the run started from" not in r.stderr:
        fail(f"merge over the base folder: {r.stderr!r}")
    # A folder is made in one that exists, and a name of another kind of file is no folder.
    for output, said in ((os.path.join(work, "no", "such", "merged"), "there is no folder"),
                         (os.path.join(work, "merged.json"), "merges into a Hugging Face folder")):
        r = run([seqforge, "merge", dora_dir, "--output", output], expect_ok=False)
        if r.returncode == 0 or said not in r.stderr or os.path.exists(output):
            fail(f"merge --output {output}: {r.stderr!r}")

    # The run stands alone: with its base folder gone, it evaluates, samples and merges as before
    # (it keeps the config.json, the tokenizer and the whole weights it trained with).
    moved = folder + ".moved"
    os.rename(folder, moved)
    try:
        alone = eval_metrics(seqforge, dora_dir)
        run([seqforge, "generate", dora_dir, "--prompt", "ROMEO:", "--length", "4"])
        merged_alone = os.path.join(work, "merged_alone")
        run([seqforge, "merge", dora_dir, "--output", merged_alone])
    finally:
        os.rename(moved, folder)
    with open(os.path.join(merged, "model.safetensors"), "rb") as f, \
            open(os.path.join(merged_alone, "model.safetensors"), "rb") as g:
        same_merge = f.read() == g.read()
    if alone["test_loss"] != adapted["test_loss"] or not same_merge:
        fail(f"without its base folder: test_loss {alone['test_loss']} against "
             f"{adapted['test_loss']}, the same merged weights: {same_merge}")
    print("the run evaluates, samples and merges without its base folder")

    # The same DoRA with the base held in bf16 (bf16 GEMMs, where the CPU has them): trains,
    # evaluates, and merges into a folder that evaluates as the adapters did.
    low_dir = os.path.join(work, "dora_bf16_base")
    write_config(config, data, folder, low_dir,
                 "adapter:\n  kind: dora\n  rank: 4\n  alpha: 8\n"
                 "  targets: [q_proj, v_proj, down_proj]\n  base_precision: bf16\n")
    out = run([seqforge, "train", config, "train.precision=bf16"], expect_ok=False)
    if out.returncode == 0:
        adapted = eval_metrics(seqforge, low_dir)
        merged = os.path.join(work, "merged_bf16_base")
        run([seqforge, "merge", low_dir, "--output", merged])
        check_dir = os.path.join(work, "merged_bf16_base_run")
        write_config(config, data, merged, check_dir, "")
        run([seqforge, "train", config, "optim.lr=0", "train.max_batches=1",
             "train.precision=bf16"])
        again = eval_metrics(seqforge, check_dir)
        gap = abs(again["test_loss"] - adapted["test_loss"]) / adapted["test_loss"]
        print(f"bf16 base merged: test_loss {again['test_loss']:.6f}, adapters "
              f"{adapted['test_loss']:.6f}")
        if gap > 1e-5:
            fail(f"the merged bf16-base folder's test loss differs by {gap:.2e}")
    elif "needs bf16 GEMMs" in out.stderr:
        print("bf16 base: skipped, " + out.stderr.strip().splitlines()[-1])
    else:
        fail("a DoRA run on a bf16 base failed: " + out.stderr[-2000:])

    # Sentence pairs through the tokenizer's template and HF's score head on the last token.
    pairs = os.path.join(work, "pairs.csv")
    run([sys.executable, os.path.join(ROOT, "examples", "shakespeare_pairs.py"), text, pairs,
         "--train", "800"])
    cls_dir = os.path.join(work, "pairs_run")
    with open(os.path.join(work, "pairs.yaml"), "w") as f:
        f.write(f"""data:
  path: {pairs}
  task: text_classify
  text_columns: [line_a, line_b]
  class_column: label
  seq_len: 48
  split: {{train: 0.8, val: 0.1}}
model:
  family: decoder
  init_from: {folder}
adapter: {{kind: lora, rank: 4, alpha: 8}}
train: {{epochs: 1, batch_size: 16, max_batches: 5, run_dir: {cls_dir}}}
""")
    run([seqforge, "train", os.path.join(work, "pairs.yaml")])
    with open(os.path.join(cls_dir, "adapter_config.json")) as f:
        peft = json.load(f)
    if peft["task_type"] != "SEQ_CLS" or peft["modules_to_save"] != ["score"]:
        fail(f"a classifier's adapter_config.json: {peft}")
    if "test_accuracy" not in eval_metrics(seqforge, cls_dir):
        fail("eval of the pair classifier gave no test_accuracy")
    predictions = os.path.join(work, "predictions.csv")
    run([seqforge, "predict", cls_dir, "--input", pairs, "--output", predictions])
    with open(predictions) as f:
        header = f.readline().strip()
    if header != "line,class,p_follows,p_random,actual":
        fail(f"predictions' header: {header}")
    print("pairs: a LoRA classifier trained, evaluated and predicted")

    # The classifier's run holds its adapters unmerged: as model.init_from it is refused (its
    # adapters would be dropped); merged, it is a classifier's folder (its labels, HF's class)
    # that a later classifier starts from, its score head included: at lr 0 the same test loss.
    pairs_yaml = os.path.join(work, "pairs.yaml")
    again_dir = os.path.join(work, "pairs_again")
    r = run([seqforge, "train", pairs_yaml, f"model.init_from={cls_dir}", "adapter.kind=none",
             f"train.run_dir={again_dir}"], expect_ok=False)
    if r.returncode == 0 or "holds adapters" not in r.stderr or "seqforge merge" not in r.stderr:
        fail("a run with unmerged adapters as model.init_from: " + r.stderr[-500:])
    merged_cls = os.path.join(work, "pairs_merged")
    run([seqforge, "merge", cls_dir, "--output", merged_cls])
    with open(os.path.join(merged_cls, "config.json")) as f:
        merged_config = json.load(f)
    # Merged in f32 whatever the base's dtype: transformers 5 loads a folder in its config's.
    if (merged_config["architectures"] != ["LlamaForSequenceClassification"] or
            sorted(merged_config["label2id"]) != ["follows", "random"] or
            merged_config["torch_dtype"] != "float32"):
        fail(f"the merged classifier's config.json: {merged_config}")
    run([seqforge, "train", pairs_yaml, f"model.init_from={merged_cls}", "adapter.kind=none",
         "optim.lr=0", f"train.run_dir={again_dir}"])
    before, after = eval_metrics(seqforge, cls_dir), eval_metrics(seqforge, again_dir)
    if abs(before["test_loss"] - after["test_loss"]) > 1e-5 * abs(before["test_loss"]):
        fail(f"a classifier started from its merged folder: test_loss {after['test_loss']} "
             f"against {before['test_loss']}")
    merged_config["id2label"] = {"0": "random", "1": "follows"}
    with open(os.path.join(merged_cls, "config.json"), "w") as f:
        json.dump(merged_config, f)
    r = run([seqforge, "train", pairs_yaml, f"model.init_from={merged_cls}", "adapter.kind=none",
             f"train.run_dir={again_dir}2"], expect_ok=False)
    if r.returncode == 0 or "its classifier scores [random, follows]" not in r.stderr:
        fail("a classifier's folder of other class order: " + r.stderr[-500:])
    merged_config["id2label"] = {"0": "follows"}
    with open(os.path.join(merged_cls, "config.json"), "w") as f:
        json.dump(merged_config, f)
    r = run([seqforge, "train", pairs_yaml, f"model.init_from={merged_cls}", "adapter.kind=none",
             f"train.run_dir={again_dir}3"], expect_ok=False)
    if r.returncode == 0 or "id2label names 1 classes, this run's data has 2" not in r.stderr:
        fail("a classifier's folder naming fewer classes: " + r.stderr[-500:])
    print(f"pairs: merged into a classifier's folder that starts the next run "
          f"(test_loss {after['test_loss']:.6f})")

    # Bad setups: one line naming the problem.
    no_tokenizer = os.path.join(work, "no_tokenizer")
    shutil.copytree(folder, no_tokenizer)
    os.remove(os.path.join(no_tokenizer, "tokenizer.json"))
    small = os.path.join(work, "small_vocab")
    shutil.copytree(folder, small)
    with open(os.path.join(small, "config.json")) as f:
        c = json.load(f)
    c["vocab_size"] = 300
    with open(os.path.join(small, "config.json"), "w") as f:
        json.dump(c, f)
    bad_dir = os.path.join(work, "bad")
    cases = [
        (["model.init_from=", f"data.tokenizer={folder}/tokenizer.json"],
         "model.family decoder builds its model from a Hugging Face folder"),
        ([f"model.init_from={no_tokenizer}"], "needs data.tokenizer"),
        ([f"model.init_from={small}", f"data.tokenizer={folder}/tokenizer.json"],
         "past the model's vocab_size 300 (tokenizer and model do not belong together)"),
        (["adapter.kind=lora", "adapter.targets=[c_attn]"], "is not a Linear of a decoder layer"),
        (["data.task=charlm"], "model.family decoder takes data.task lm or text_classify"),
        (["data.seq_len=129"], "data.seq_len 129 is longer than the 128 positions of"),
    ]
    write_config(config, data, folder, bad_dir)
    for overrides, want in cases:
        r = run([seqforge, "train", config] + overrides, expect_ok=False)
        lines = [x for x in r.stderr.strip().splitlines() if x.startswith("seqforge: error")]
        if r.returncode == 0 or len(lines) != 1 or want not in lines[0]:
            fail(f"{overrides}: expected one error line with {want!r}, got {r.stderr!r}")
        print("error:", lines[0][:150])
    print("decoder CLI: all checks passed")


if __name__ == "__main__":
    main()
