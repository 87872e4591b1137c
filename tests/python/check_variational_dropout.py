#!/usr/bin/python3
"""Replays seqforge's recurrent layer with variational dropout in PyTorch and compares.

Usage: check_variational_dropout.py RUN.safetensors
RUN holds a recurrent layer's parameters (PyTorch names, "param." prefix), its input x (T, B, I),
h0 [and c0], the dropout masks seqforge drew ("mask.input.l{l}" (T, B, I_l), "mask.state.s{s}"
(B, P)), the output y, h_n [and c_n], the upstream gradients dy, dh_n [, dc_n] and seqforge's
gradients ("grad." + parameter names, "grad.x", "grad.h0" [, "grad.c0"]); the configuration is
JSON metadata ("config": cell, layers, bidirectional, proj). The reference below is an explicit
loop over time in float64 with autograd: every layer's input times its mask, the recurrent state
times its chain's mask before W_hh (the GRU's interpolation uses the unmasked state). Prints the
worst relative error and exits 1 above the tolerance given as "tolerance" in the metadata.
"""
import json
import sys

import numpy as np
import torch

from safetensors_read import read_safetensors


def reference(c, t, params):
    lstm = c["cell"] == "lstm"
    D, L = (2 if c["bidirectional"] else 1), c["layers"]
    x, h0 = t["x"], t["h0"]
    c0 = t.get("c0")
    T = x.shape[0]
    layer_in = x
    h_n, c_n = [], []
    for l in range(L):
        layer_in = layer_in * t["mask.input.l%d" % l]
        outs = []
        for d in range(D):
            s = l * D + d
            sfx = "_l%d%s" % (l, "_reverse" if d else "")
            w_ih, w_hh = params["weight_ih" + sfx], params["weight_hh" + sfx]
            b_ih, b_hh = params["bias_ih" + sfx], params["bias_hh" + sfx]
            mask = t["mask.state.s%d" % s]
            h, cell = h0[s], (c0[s] if lstm else None)
            ys = [None] * T
            for step in (range(T) if d == 0 else reversed(range(T))):
                gi = layer_in[step] @ w_ih.T + b_ih
                gh = (h * mask) @ w_hh.T + b_hh
                if lstm:
                    i, f, g, o = (gi + gh).chunk(4, dim=1)
                    cell = torch.sigmoid(f) * cell + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(cell)
                    if c.get("proj"):
                        h = h @ params["weight_hr" + sfx].T
                else:
                    ir, iz, inn = gi.chunk(3, dim=1)
                    hr, hz, hnn = gh.chunk(3, dim=1)
                    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
                    n = torch.tanh(inn + r * hnn)
                    h = (1 - z) * n + z * h
                ys[step] = h
            outs.append(torch.stack(ys))
            h_n.append(h)
            c_n.append(cell)
        layer_in = torch.cat(outs, dim=-1)
    return layer_in, torch.stack(h_n), (torch.stack(c_n) if lstm else None)


def main():
    t, meta = read_safetensors(sys.argv[1], np.float64)
    c = json.loads(meta["config"])
    lstm = c["cell"] == "lstm"
    params = {k[len("param."):]: v.clone().requires_grad_(True)
              for k, v in t.items() if k.startswith("param.")}
    leaves = {k: t[k].clone().requires_grad_(True) for k in ("x", "h0", "c0") if k in t}
    t.update(leaves)
    y, h_n, c_n = reference(c, t, params)
    loss = (y * t["dy"]).sum() + (h_n * t["dh_n"]).sum()
    if lstm:
        loss = loss + (c_n * t["dc_n"]).sum()
    loss.backward()
    pairs = [("y", y, t["y"]), ("h_n", h_n, t["h_n"])]
    if lstm:
        pairs.append(("c_n", c_n, t["c_n"]))
    pairs += [("grad." + k, p.grad, t["grad." + k]) for k, p in params.items()]
    pairs += [("grad." + k, v.grad, t["grad." + k]) for k, v in leaves.items()]
    worst, name = 0.0, ""
    for n, want, got in pairs:
        want = want.detach()
        floor = max(0.1 * want.abs().max().item(), 1e-30)
        e = ((got - want).abs() / torch.clamp(want.abs(), min=floor)).max().item()
        if e > worst:
            worst, name = e, n
    tolerance = float(meta["tolerance"])
    print("variational dropout against the PyTorch loop: %d tensors, worst %.2e (%s), tolerance "
          "%.0e" % (len(pairs), worst, name, tolerance))
    sys.exit(0 if worst <= tolerance else 1)


if __name__ == "__main__":
    main()
