#!/usr/bin/python3
"""Loads a seqforge checkpoint into PyTorch modules and checks their output against seqforge's.

Usage: check_torch_loads_checkpoint.py CHECKPOINT.safetensors IO.safetensors
CHECKPOINT holds the parameters under PyTorch names and the model configuration as JSON metadata
("config": vocab, embed, input, hidden, layers, bidirectional, batch_first, output, per_step;
optional cell "lstm" | "gru", proj, the LSTM's proj_size, and final_states, the head on
torch.cat([h_n[-2], h_n[-1]], 1) rather than output[:, -1]; or family "transformer" with
make_transformer_fixtures.py's v, c, l, h, bs, causal (and k, seg for a classifier) for its
nanoGPT-style module).
IO holds "x" (the input), "y" (seqforge's output) and a classifier's "lengths" and "segments". Exits 1 on a mismatch.
"""
import json
import sys

import torch

from make_transformer_fixtures import Gpt
from safetensors_read import read_safetensors


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        if c["vocab"]:
            self.embedding = torch.nn.Embedding(c["vocab"], c["embed"])
        d = 2 if c["bidirectional"] else 1
        args = (c["embed"] if c["vocab"] else c["input"], c["hidden"], c["layers"])
        kw = dict(bidirectional=c["bidirectional"], batch_first=c["batch_first"])
        self.cell = c.get("cell", "lstm")
        if self.cell == "gru":
            self.gru = torch.nn.GRU(*args, **kw)
        else:
            self.lstm = torch.nn.LSTM(*args, proj_size=c.get("proj", 0), **kw)
        self.head = torch.nn.Linear(d * (c.get("proj") or c["hidden"]), c["output"])

    def forward(self, x):
        if self.c["vocab"]:
            x = self.embedding(x)
        y, state = getattr(self, self.cell)(x)
        if self.c["per_step"]:
            return self.head(y.reshape(-1, y.shape[-1]))
        if self.c.get("final_states"):
            h_n = state[0] if self.cell == "lstm" else state
            if self.c["bidirectional"]:
                return self.head(torch.cat([h_n[-2], h_n[-1]], 1))
            return self.head(h_n[-1])
        return self.head(y[:, -1] if self.c["batch_first"] else y[-1])


def main():
    params, meta = read_safetensors(sys.argv[1])
    io, _ = read_safetensors(sys.argv[2])
    config = json.loads(meta["config"])
    model = Gpt(config) if config.get("family") == "transformer" else Model(config)
    model.load_state_dict(params, strict=True)
    with torch.no_grad():
        if config.get("family") == "transformer":
            got = model(io["x"], io.get("lengths"), io.get("segments"))
        else:
            got = model(io["x"])
        if config.get("family") == "transformer":
            got = got.reshape(-1, got.shape[-1])
    want = io["y"]
    err = ((got - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()
    print("PyTorch loaded %d tensors; output max error %.2e relative to max |y|" % (len(params), err))
    sys.exit(0 if err < 1e-5 else 1)


if __name__ == "__main__":
    main()
