#!/usr/bin/python3
"""Checks seqforge's LoRA/DoRA adapters on a recurrent layer against PyTorch.

Usage: check_recurrent_adapters.py FILE
FILE (safetensors, float64) holds the model's parameters under their names ("param.<name>"),
the input "x" (B, T, I), the output gradient "dy" (B, O), seqforge's output "y" and its
gradients "grad.<name>" of what trains; its metadata "config" gives cell, input, hidden,
layers, bidirectional, output, kind (lora | dora), rank, alpha. PyTorch runs nn.LSTM / nn.GRU
(batch_first) on weights W0 + s B A, or for DoRA m V / ||V|| with the row norms of V = W0 + s B A
detached (PEFT's DoRA), then the Linear head on the last step. Exits 1 on a mismatch.
"""
import json
import sys

import torch

from safetensors_read import read_safetensors


def main():
    t, meta = read_safetensors(sys.argv[1])
    c = json.loads(meta["config"])
    rnn_class = torch.nn.LSTM if c["cell"] == "lstm" else torch.nn.GRU
    rnn = rnn_class(c["input"], c["hidden"], c["layers"], bidirectional=c["bidirectional"],
                    batch_first=True).double()
    head = torch.nn.Linear(c["hidden"] * (2 if c["bidirectional"] else 1), c["output"]).double()
    s = c["alpha"] / c["rank"]
    trained = {}
    weights = {}
    for name, _ in rnn.named_parameters():
        w0 = t["param.%s.%s" % (c["cell"], name)]
        stem = "param.base_model.model.%s.%s." % (c["cell"], name)
        if stem + "lora_A.weight" not in t:
            weights[name] = w0
            continue
        a = t[stem + "lora_A.weight"].clone().requires_grad_(True)
        b = t[stem + "lora_B.weight"].clone().requires_grad_(True)
        trained[stem[6:] + "lora_A.weight"], trained[stem[6:] + "lora_B.weight"] = a, b
        w = w0 + s * (b @ a)
        if c["kind"] == "dora":
            m = t[stem + "lora_magnitude_vector"].clone().requires_grad_(True)
            trained[stem[6:] + "lora_magnitude_vector"] = m
            w = (m / w.norm(dim=1).detach()).unsqueeze(1) * w
        weights[name] = w
    for name in ("weight", "bias"):
        p = t["param.head." + name].clone().requires_grad_(True)
        trained["head." + name] = p
        weights["head." + name] = p
    # The RNN functions themselves: nn.LSTM caches its flat weights, so they take ours directly.
    flat = [weights[name] for name in rnn._flat_weights_names]
    x = t["x"]
    d = 2 if c["bidirectional"] else 1
    h0 = torch.zeros(c["layers"] * d, x.shape[0], c["hidden"], dtype=x.dtype)
    if c["cell"] == "lstm":
        out, _, _ = torch._VF.lstm(x, (h0, h0), flat, True, c["layers"], 0.0, False,
                                   c["bidirectional"], True)
    else:
        out, _ = torch._VF.gru(x, h0, flat, True, c["layers"], 0.0, False, c["bidirectional"],
                               True)
    y = out[:, -1] @ weights["head.weight"].t() + weights["head.bias"]
    (y * t["dy"]).sum().backward()

    def err(got, want):
        return ((got - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()

    worst = err(t["y"], y.detach())
    print("output: max error %.2e" % worst)
    for name, p in trained.items():
        e = err(t["grad." + name], p.grad)
        worst = max(worst, e)
        print("%-60s %.2e" % (name, e))
    sys.exit(0 if worst < 1e-10 else 1)


if __name__ == "__main__":
    main()
