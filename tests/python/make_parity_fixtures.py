#!/usr/bin/python3
"""Writes PyTorch reference fixtures for seqforge's parity tests.

For every configuration in CONFIGS: a model [Embedding] -> nn.LSTM or nn.GRU -> nn.Linear, its
initial parameters, inputs, outputs, final states, the loss, every gradient, and the parameters
after two AdamW steps and after two clipped SGD-momentum steps on the same batch. Parameters and
inputs are drawn in float32 (so seqforge loads them exactly); PyTorch then computes in float64.

Usage: /usr/bin/python3 tests/python/make_parity_fixtures.py OUT_DIR [--random SEED COUNT]
Each fixture is OUT_DIR/<name>.safetensors (F64/I64 tensors, the configuration as JSON metadata).
With --random, COUNT random configurations (at least 24 for the parity tests) replace CONFIGS:
  SEQFORGE_FIXTURE_DIR=OUT_DIR build/tests/seqforge_tests --gtest_filter='PyTorchParity.CpuF32:*F64'

"""
import json
import os
import random
import re
import struct
import sys

import torch

# name fields: i input, h hidden, l layers, t steps, b batch; flags: bi (bidirectional), bf
# (batch_first), st (given initial states), head: last | step | mask (MSE on masked steps) | ce |
# quantile (the last step's forecast of k steps ahead, one output per quantile of q, the pinball
# loss against targets repeated per quantile, as a seqforge forecaster with train.loss quantile);
# cell="gru" makes the layer an nn.GRU (named gru_... / chargru_...; no cell state, so no c0, rc,
# c_n): otherwise it is an nn.LSTM (lstm_... / charlm_...); p: the LSTM's proj_size (h, h0, h_n
# and the output are p wide, weight_hr_l{k} (p, h); named ..._p{p}_...); cell="lnlstm" is the
# layer-normalised LSTM of LayerNormLSTM below (lnlstm_... / charlnlstm_...).
CONFIGS = [
    dict(i=1, h=1, l=1, t=1, b=1, head="last"),
    dict(i=3, h=5, l=1, t=7, b=4, head="last", bf=True),
    dict(i=3, h=5, l=1, t=7, b=4, head="step", st=True),
    dict(i=8, h=16, l=2, t=12, b=8, head="last", bf=True),
    dict(i=8, h=17, l=2, t=12, b=3, head="mask", bi=True, bf=True),
    dict(i=4, h=33, l=3, t=9, b=5, head="step", st=True),
    dict(i=6, h=64, l=1, t=24, b=64, head="last", bf=True),
    dict(i=2, h=7, l=3, t=5, b=2, head="last", bi=True, st=True),
    dict(i=17, h=31, l=2, t=16, b=9, head="step", bi=True, bf=True),
    dict(i=1, h=48, l=1, t=64, b=16, head="last", st=True, bf=True),
    dict(i=256, h=12, l=1, t=3, b=2, head="step"),
    dict(i=12, h=256, l=1, t=4, b=3, head="last", bf=True),
    dict(i=5, h=128, l=2, t=6, b=4, head="mask", bi=True, st=True),
    dict(i=9, h=20, l=2, t=1, b=7, head="last", bi=True),
    dict(i=3, h=3, l=1, t=64, b=1, head="step", bf=True),
    dict(i=10, h=10, l=3, t=8, b=64, head="last", bf=True, st=True),
    dict(i=7, h=100, l=1, t=10, b=5, head="mask", bf=True),
    dict(i=4, h=64, l=2, t=20, b=8, head="step", bi=True, st=True, bf=True),
    dict(v=65, e=16, h=32, l=2, t=16, b=4, head="ce", bf=True),
    dict(v=11, e=5, h=9, l=1, t=6, b=3, head="ce", st=True),
    dict(v=30, e=8, h=24, l=2, t=10, b=5, head="ce", bi=True, bf=True, weights=True),
    dict(v=20, e=12, h=19, l=3, t=7, b=2, head="ce", ignore=True, bf=True),
    dict(v=65, e=64, h=64, l=1, t=32, b=8, head="ce", bf=True, st=True, weights=True, ignore=True),
    dict(v=5, e=1, h=1, l=1, t=2, b=1, head="ce"),
    dict(i=16, h=40, l=1, t=33, b=17, head="last", bi=True),
    dict(i=2, h=8, l=2, t=3, b=2, head="step", bi=True, bf=False, st=True),
    # GRU: appended, so the LSTM fixtures keep their seeds.
    dict(cell="gru", i=1, h=1, l=1, t=1, b=1, head="last"),
    dict(cell="gru", i=3, h=5, l=1, t=7, b=4, head="step", st=True),
    dict(cell="gru", i=8, h=17, l=2, t=12, b=3, head="mask", bi=True, bf=True),
    dict(cell="gru", i=4, h=33, l=3, t=9, b=5, head="step", st=True, bf=True),
    dict(cell="gru", i=6, h=64, l=2, t=24, b=64, head="last", bf=True),
    dict(cell="gru", i=17, h=31, l=2, t=16, b=9, head="step", bi=True, st=True),
    dict(cell="gru", i=40, h=128, l=1, t=6, b=4, head="mask", st=True, bf=True),
    dict(cell="gru", i=256, h=12, l=1, t=3, b=2, head="last", bi=True),
    dict(cell="gru", i=2, h=7, l=3, t=5, b=2, head="last", bi=True, st=True),
    dict(cell="gru", v=65, e=16, h=32, l=2, t=16, b=4, head="ce", bf=True),
    dict(cell="gru", v=30, e=8, h=24, l=2, t=10, b=5, head="ce", bi=True, st=True, weights=True,
         ignore=True),
    # LSTM with projections (proj_size): appended after the GRU ones, for the same reason.
    dict(i=3, h=5, p=2, l=1, t=7, b=4, head="step", st=True),
    dict(i=8, h=17, p=5, l=2, t=12, b=3, head="mask", bi=True, bf=True),
    dict(i=4, h=33, p=16, l=3, t=9, b=5, head="last", st=True, bf=True),
    dict(i=20, h=64, p=31, l=2, t=16, b=9, head="step", bi=True, st=True),
    dict(i=1, h=2, p=1, l=1, t=1, b=1, head="last"),
    dict(v=30, e=8, h=24, p=7, l=2, t=10, b=5, head="ce", bf=True, st=True),
    # LN-LSTM: appended last.
    dict(cell="lnlstm", i=1, h=3, l=1, t=1, b=1, head="last"),
    dict(cell="lnlstm", i=3, h=5, l=1, t=7, b=4, head="step", st=True),
    dict(cell="lnlstm", i=8, h=17, l=2, t=12, b=3, head="mask", bi=True, bf=True),
    dict(cell="lnlstm", i=4, h=33, l=3, t=9, b=5, head="last", st=True, bf=True),
    dict(cell="lnlstm", i=20, h=64, l=2, t=16, b=9, head="step", bi=True, st=True),
    dict(cell="lnlstm", v=30, e=8, h=24, l=2, t=10, b=5, head="ce", bf=True, st=True),
    # One and three bidirectional layers of the projected and the layer-normalised LSTM.
    dict(i=5, h=9, p=4, l=1, t=6, b=3, head="last", bi=True, st=True),
    dict(i=3, h=12, p=6, l=3, t=5, b=2, head="step", bi=True, bf=True),
    dict(cell="lnlstm", i=5, h=9, l=1, t=6, b=3, head="last", bi=True, st=True),
    dict(cell="lnlstm", i=3, h=12, l=3, t=5, b=2, head="step", bi=True, bf=True),
    # Quantile forecasts of several steps ahead: appended last.
    dict(i=4, h=9, l=2, t=6, b=5, head="quantile", k=3, q=[0.1, 0.5, 0.9], bf=True),
    dict(cell="gru", i=3, h=16, l=1, t=7, b=4, head="quantile", k=1, q=[0.25, 0.75], st=True),
    dict(i=5, h=12, p=5, l=2, t=5, b=3, head="quantile", k=24, q=[0.05, 0.5, 0.95], bi=True),
]

LR_ADAMW, WD_ADAMW = 1e-2, 1e-2
LR_SGD, MOMENTUM = 0.1, 0.9


class LayerNormLSTM(torch.nn.Module):
    """The layer-normalised LSTM (Ba et al. 2016) as seqforge defines it, an explicit loop:
    pre = g_ih LN(x W_ih^T) + g_hh LN(h W_hh^T) + b_ih + b_hh (LN over the 4H values, gates i, f,
    g, o), c = f c + i g, h = o tanh(g_c LN(c) + b_c); LN as nn.LayerNorm's (eps 1e-5), no bias
    of its own but the cell norm's. Parameters per layer and direction, in this order:
    weight_ih, weight_hh, bias_ih, bias_hh, ln_ih_weight, ln_hh_weight, ln_c_weight, ln_c_bias."""

    def __init__(self, input_size, hidden, layers, bidirectional, batch_first):
        super().__init__()
        self.h, self.layers, self.batch_first = hidden, layers, batch_first
        self.d = 2 if bidirectional else 1
        bound = 1.0 / hidden ** 0.5
        for l in range(layers):
            for d in range(self.d):
                sfx = "_l%d%s" % (l, "_reverse" if d else "")
                i = input_size if l == 0 else self.d * hidden
                for name, shape in (("weight_ih", (4 * hidden, i)), ("weight_hh", (4 * hidden, hidden)),
                                    ("bias_ih", (4 * hidden,)), ("bias_hh", (4 * hidden,))):
                    self.register_parameter(name + sfx, torch.nn.Parameter(
                        torch.empty(shape).uniform_(-bound, bound)))
                # Gains and bias drawn away from 1 and 0, so that their gradients are tested.
                for name, n, lo, hi in (("ln_ih_weight", 4, 0.5, 1.5), ("ln_hh_weight", 4, 0.5, 1.5),
                                        ("ln_c_weight", 1, 0.5, 1.5), ("ln_c_bias", 1, -0.5, 0.5)):
                    self.register_parameter(name + sfx, torch.nn.Parameter(
                        torch.empty(n * hidden).uniform_(lo, hi)))

    # With explicit_norm, the layer norms are written out (mean, variance, division): the same
    # function, rounded otherwise, to measure how far float64 itself spreads on a configuration.
    explicit_norm = False
    # With a generator here, the products sum their terms in a random order: the same function,
    # rounded otherwise (PyTorch's own float32 error is the worst of several such orders).
    summation_order = None

    def product(self, a, w):
        """a w^T, its terms summed in summation_order's order where one is set."""
        if self.summation_order is None:
            return a @ w.T
        perm = torch.randperm(a.shape[-1], generator=self.summation_order)
        return a[..., perm] @ w[:, perm].T

    def forward(self, x, state):
        if self.batch_first:
            x = x.transpose(0, 1)
        T, B = x.shape[0], x.shape[1]
        ln = lambda v: torch.nn.functional.layer_norm(v, v.shape[-1:], eps=1e-5)
        if self.explicit_norm:
            ln = lambda v: ((v - v.mean(-1, keepdim=True)) /
                            torch.sqrt(v.var(-1, unbiased=False, keepdim=True) + 1e-5))
        h_n, c_n = [], []
        for l in range(self.layers):
            outs = []
            for d in range(self.d):
                s = l * self.d + d
                sfx = "_l%d%s" % (l, "_reverse" if d else "")
                p = lambda name: getattr(self, name + sfx)
                if state is None:
                    h = x.new_zeros(B, self.h)
                    c = x.new_zeros(B, self.h)
                else:
                    h, c = state[0][s], state[1][s]
                ys = [None] * T
                for t in (range(T) if d == 0 else reversed(range(T))):
                    pre = (p("ln_ih_weight") * ln(self.product(x[t], p("weight_ih"))) +
                           p("ln_hh_weight") * ln(self.product(h, p("weight_hh"))) + p("bias_ih") +
                           p("bias_hh"))
                    i, f, g, o = pre.chunk(4, dim=1)
                    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(p("ln_c_weight") * ln(c) + p("ln_c_bias"))
                    ys[t] = h
                outs.append(torch.stack(ys))
                h_n.append(h)
                c_n.append(c)
            x = torch.cat(outs, dim=-1)
        y = x.transpose(0, 1) if self.batch_first else x
        return y, (torch.stack(h_n), torch.stack(c_n))


def is_gru(c):
    return c.get("cell", "lstm") == "gru"


def state_keys(c):
    """The initial states a model takes, in the order it takes them."""
    return ("h0",) if is_gru(c) else ("h0", "c0")


def name_of(c):
    if "v" in c:
        s = {"gru": "chargru", "lnlstm": "charlnlstm"}.get(c.get("cell"), "charlm")
        s += "_v%d_e%d" % (c["v"], c["e"])
    else:
        s = c.get("cell", "lstm") + "_i%d" % c["i"]
    s += "_h%d" % c["h"] + ("_p%d" % c["p"] if c.get("p") else "")
    s += "_l%d_t%d_b%d" % (c["l"], c["t"], c["b"])
    for flag in ("bi", "bf", "st", "weights", "ignore"):
        if c.get(flag):
            s += "_" + flag
    if c["head"] == "quantile":
        s += "_k%d_q%d" % (c["k"], len(c["q"]))
    return s + "_" + c["head"]


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d = 2 if c.get("bi") else 1
        if "v" in c:
            self.embedding = torch.nn.Embedding(c["v"], c["e"])
        args = (c.get("i", c.get("e")), c["h"], c["l"])
        kw = dict(bidirectional=bool(c.get("bi")), batch_first=bool(c.get("bf")))
        if is_gru(c):
            self.gru = torch.nn.GRU(*args, **kw)
        elif c.get("cell") == "lnlstm":
            self.lnlstm = LayerNormLSTM(*args, **kw)
        else:
            self.lstm = torch.nn.LSTM(*args, proj_size=c.get("p", 0), **kw)
        out = c["v"] if "v" in c else (2 if c["head"] in ("step", "mask") else 1)
        if c["head"] == "quantile":
            out = c["k"] * len(c["q"])
        self.head = torch.nn.Linear(d * (c.get("p") or c["h"]), out)

    def forward(self, x, state):
        if "v" in self.c:
            x = self.embedding(x)
        if is_gru(self.c):  # an nn.GRU takes h0 alone and has no cell state
            y, hn = self.gru(x, None if state is None else state[0])
            cn = None
        elif self.c.get("cell") == "lnlstm":
            y, (hn, cn) = self.lnlstm(x, state)
        else:
            y, (hn, cn) = self.lstm(x, state)
        if self.c["head"] in ("last", "quantile"):
            y = y[:, -1, :] if self.c.get("bf") else y[-1]
        else:
            y = y.reshape(-1, y.shape[-1])
        return self.head(y), hn, cn


def loss_of(c, out, hn, cn, inputs):
    if c["head"] == "ce":
        w = inputs.get("input.class_weights")
        ignore = inputs["meta_ignore"]
        loss = torch.nn.functional.cross_entropy(out, inputs["input.target_ids"].reshape(-1),
                                                 weight=w, ignore_index=ignore)
    elif c["head"] == "quantile":
        q = torch.tensor(c["q"], dtype=out.dtype).repeat(c["k"])
        u = inputs["input.target"] - out
        loss = torch.maximum(q * u, (q - 1) * u).mean()
    elif c["head"] == "mask":
        m = inputs["input.mask"].reshape(-1) != 0
        loss = ((out[m] - inputs["input.target"][m]) ** 2).mean()
    else:
        loss = torch.nn.functional.mse_loss(out, inputs["input.target"])
    if c.get("st"):
        loss = loss + (hn * inputs["input.rh"]).sum()
        if cn is not None:
            loss = loss + (cn * inputs["input.rc"]).sum()
    return loss


def max_rel_error(got, want):
    """The parity metric: max |got - want| / max(|want|, 0.1 * max |want|)."""
    got, want = got.double().flatten(), want.double().flatten()
    if want.numel() == 0:
        return 0.0
    floor = max(0.1 * want.abs().max().item(), 1e-30)
    return ((got - want).abs() / torch.clamp(want.abs(), min=floor)).max().item()


def torch_f32_errors(c, model, inputs, run):
    """PyTorch's own float32 error against its float64 result, for comparison: the worst over
    forms of the same function that float32 rounds otherwise. Every model's first layer also
    runs with its input features in four random orders (the input projection's sums in another
    order): a single order can land far below float32's usual error (seed 731's
    lstm_i16_h1_l3_t1_b1_st_k1_q2_quantile, whose first cell state is the residue of a
    cancellation: forward 2.7e-7 and backward 2.7e-6 in PyTorch's order, 4.4e-6 and 1.9e-5 over
    the five). A layer-normalised LSTM also runs both forms of the norm (F.layer_norm, and
    written out) and four random orders of its products' sums: on a norm of nearly constant rows
    float32 errors of the same function lie up to 10x apart (seed 671's
    lnlstm_i2_h8_l1_t33_b17_bi_k24_q5_quantile: 5.5e-6 in PyTorch's own order, 1.9e-5 over
    these forms)."""
    runs = [f32_errors(c, model, inputs, run)]
    features = c.get("i", c.get("e"))
    for seed in range(1, 5):
        order = torch.randperm(features, generator=torch.Generator().manual_seed(seed))
        runs.append(f32_errors(c, model, inputs, run, order))
    if c.get("cell") == "lnlstm":
        LayerNormLSTM.explicit_norm = True
        runs.append(f32_errors(c, model, inputs, run))
        LayerNormLSTM.explicit_norm = False
        for seed in range(1, 5):
            LayerNormLSTM.summation_order = torch.Generator().manual_seed(seed)
            runs.append(f32_errors(c, model, inputs, run))
        LayerNormLSTM.summation_order = None
    return tuple(max(errors) for errors in zip(*runs))


def with_feature_order(c, model, inputs, order):
    """The same model and inputs with the first layer's input features in `order`: the input's
    (or the embedding's) columns and the first layer's input weights' columns alike."""
    state = model.state_dict()
    for k, v in state.items():
        if k == "embedding.weight" or re.search(r"\.weight_ih_l0(_reverse)?$", k):
            state[k] = v[:, order]
    m = Model(c)
    m.load_state_dict(state)
    if "input.x" in inputs:
        inputs["input.x"] = inputs["input.x"][..., order]
    return m


def f32_errors(c, model, inputs, run, feature_order=None):
    """PyTorch's float32 error of the model as it is written now, with the first layer's input
    features in feature_order where one is given."""
    results = {}
    saved = dict(inputs)
    for dtype in (torch.float32, torch.float64):
        m = Model(c)
        m.load_state_dict(model.state_dict())
        if feature_order is not None:
            m = with_feature_order(c, m, inputs, feature_order)
        m.to(dtype)
        for k, v in inputs.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                inputs[k] = v.to(dtype)
        x, state, out, hn, cn, _ = run(m)
        fwd = [t for t in (out, hn, cn) if t is not None]
        bwd = [p.grad for p in m.parameters()] + ([] if "v" in c else [x.grad])
        results[dtype] = ([t.detach() for t in fwd], [t.detach() for t in bwd])
        inputs.update(saved)
    (f32_fwd, f32_bwd), (f64_fwd, f64_bwd) = results[torch.float32], results[torch.float64]
    return (max(max_rel_error(a, b) for a, b in zip(f32_fwd, f64_fwd)),
            max(max_rel_error(a, b) for a, b in zip(f32_bwd, f64_bwd)))


def f32(t):
    return t.float().double()


def make(c, seed):
    torch.manual_seed(seed)
    model = Model(c)  # PyTorch's default initialisation, in float32
    for p in model.parameters():
        p.data = f32(p.data)
    model.double()
    d = 2 if c.get("bi") else 1
    T, B, H, L = c["t"], c["b"], c["h"], c["l"]
    bf = bool(c.get("bf"))
    lead = (B, T) if bf else (T, B)
    inputs = {}
    if "v" in c:
        inputs["input.ids"] = torch.randint(0, c["v"], lead)
        targets = torch.randint(0, c["v"], lead)
        ignore = -100
        if c.get("ignore"):
            ignore = 3
            targets[..., 0] = 3
        inputs["meta_ignore"] = ignore
        inputs["input.target_ids"] = targets
        if c.get("weights"):
            inputs["input.class_weights"] = f32(torch.rand(c["v"]) + 0.5)
    else:
        inputs["input.x"] = f32(torch.randn(*lead, c["i"]))
        rows = B if c["head"] in ("last", "quantile") else T * B
        if c["head"] == "quantile":  # each target once per quantile
            inputs["input.target"] = f32(torch.randn(B, c["k"])).repeat_interleave(len(c["q"]), 1)
        else:
            inputs["input.target"] = f32(torch.randn(rows, 2 if c["head"] != "last" else 1))
        if c["head"] == "mask":
            mask = (torch.rand(rows) < 0.3).double()
            mask[0] = 1.0
            inputs["input.mask"] = mask
    if c.get("st"):
        for k in state_keys(c) + tuple("r" + k[0] for k in state_keys(c)):  # h0 [c0] rh [rc]
            width = (c.get("p") or H) if k in ("h0", "rh") else H  # h is proj_size wide
            inputs["input." + k] = f32(torch.randn(d * L, B, width) * (0.5 if k[0] != "r" else 0.1))

    def run(m):
        x = inputs["input.ids"] if "v" in c else inputs["input.x"].clone().requires_grad_(True)
        state = None
        if c.get("st"):
            state = tuple(inputs["input." + k].clone().requires_grad_(True) for k in state_keys(c))
        out, hn, cn = m(x, state)
        loss = loss_of(c, out, hn, cn, inputs)
        m.zero_grad()
        loss.backward()
        return x, state, out, hn, cn, loss

    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch_f32 = torch_f32_errors(c, model, inputs, run)
    x, state, out, hn, cn, loss = run(model)
    tensors = {("param." + k): v for k, v in initial.items()}
    tensors.update({k: v for k, v in inputs.items() if not k.startswith("meta")})
    tensors["out.y"] = out.detach()
    tensors["out.h_n"] = hn.detach()
    if cn is not None:
        tensors["out.c_n"] = cn.detach()
    tensors["out.loss"] = loss.detach().reshape(())
    for k, p in model.named_parameters():
        tensors["grad." + k] = p.grad.detach().clone()
    if "v" not in c:
        tensors["grad.x"] = x.grad.detach()
    if state is not None:
        for k, s in zip(state_keys(c), state):
            tensors["grad." + k] = s.grad.detach()

    # Two AdamW steps on the same batch, with the gradients each step used.
    opt = torch.optim.AdamW(model.parameters(), lr=LR_ADAMW, weight_decay=WD_ADAMW)
    for step in (1, 2):
        if step == 2:
            run(model)
        for k, p in model.named_parameters():
            tensors["adamw%d_grad.%s" % (step, k)] = p.grad.detach().clone()
        opt.step()
        for k, p in model.named_parameters():
            tensors["adamw%d.%s" % (step, k)] = p.detach().clone()

    # Two SGD-momentum steps (Nesterov on bidirectional configs), gradients clipped to half their
    # norm so the clipping is active.
    nesterov = bool(c.get("bi"))

    def sgd_steps(start=initial):
        model.load_state_dict(start)
        opt = torch.optim.SGD(model.parameters(), lr=LR_SGD, momentum=MOMENTUM, nesterov=nesterov)
        steps, clip = {}, {}
        for step in (1, 2):
            run(model)
            total = torch.sqrt(sum((p.grad ** 2).sum() for p in model.parameters()))
            clip[step] = float(total) * 0.5
            got = torch.nn.utils.clip_grad_norm_(model.parameters(), clip[step])
            steps["sgd%d.total_norm" % step] = got.detach().reshape(())
            opt.step()
            for k, p in model.named_parameters():
                steps["sgd%d.%s" % (step, k)] = p.detach().clone()
        return steps, clip

    steps, clip = sgd_steps()
    tensors.update(steps)
    # Two steps compound a layer norm's ill-conditioning (a norm over a few nearly equal values):
    # float64's own spread there, the same steps with the norms written out, and PyTorch's own
    # float32 error of the same steps (the conditioning, times float32's rounding) bound the f64
    # check.
    sgd_f64_spread = sgd_f32_error = 0.0
    if c.get("cell") == "lnlstm":
        LayerNormLSTM.explicit_norm = True
        other, _ = sgd_steps()
        LayerNormLSTM.explicit_norm = False
        sgd_f64_spread = max(max_rel_error(other[k], v) for k, v in steps.items())
        saved, model64 = dict(inputs), model
        model = Model(c)
        model.load_state_dict(initial)
        model.float()
        for k, v in saved.items():
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                inputs[k] = v.float()
        in_f32, _ = sgd_steps({k: v.float() for k, v in initial.items()})
        inputs.update(saved)
        model = model64
        sgd_f32_error = max(max_rel_error(in_f32[k].double(), v) for k, v in steps.items())

    meta = dict(c)
    meta.update(name=name_of(c), seed=seed, ignore_index=inputs.get("meta_ignore", -100),
                lr_adamw=LR_ADAMW, wd_adamw=WD_ADAMW, lr_sgd=LR_SGD, momentum=MOMENTUM,
                nesterov=nesterov, max_norm1=clip[1], max_norm2=clip[2],
                output_size=model.head.out_features, torch_f32_forward_error=torch_f32[0],
                torch_f32_backward_error=torch_f32[1], torch_f64_sgd_spread=sgd_f64_spread,
                torch_f32_sgd_error=sgd_f32_error)
    return meta, tensors


def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {}, [], 0
    for k, t in tensors.items():
        t = t.contiguous()
        dtype = {torch.float64: "F64", torch.int64: "I64"}[t.dtype]
        raw = t.numpy().tobytes()
        header[k] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"config": json.dumps(metadata)}
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def random_configs(seed, count):
    """count configurations drawn from Random(seed): LSTM, GRU, LayerNorm-LSTM and LSTM with
    projections, 1-3 layers, either direction, every head, given states or not."""
    rng = random.Random(seed)
    configs = []
    for _ in range(count):
        cell = rng.choice(["lstm", "lstm", "gru", "lnlstm"])
        c = dict(h=rng.choice([1, 2, 3, 5, 8, 15, 16, 17, 31, 32, 33, 64, 65, 100]),
                 l=rng.randint(1, 3), t=rng.choice([1, 2, 3, 7, 16, 17, 33]),
                 b=rng.choice([1, 2, 3, 5, 8, 16, 17]))
        if cell != "lstm":
            c["cell"] = cell
        if cell == "lnlstm":
            c["h"] = max(c["h"], 2)  # a layer norm needs two values
        if rng.random() < 0.3:
            c.update(v=rng.randint(2, 70), e=rng.randint(1, 20), head="ce")
            c["weights"] = rng.random() < 0.3
            c["ignore"] = rng.random() < 0.3 and c["b"] > 1 and c["t"] > 1  # some targets kept
        else:
            c.update(i=rng.choice([1, 2, 3, 7, 16, 17, 40]),
                     head=rng.choice(["last", "step", "mask", "quantile"]))
            if c["head"] == "quantile":
                levels = sorted(rng.sample(range(1, 20), rng.randint(1, 5)))
                c.update(k=rng.choice([1, 2, 5, 24]), q=[v / 20 for v in levels])
        c["bi"], c["bf"], c["st"] = (rng.random() < 0.5 for _ in range(3))
        if cell == "lstm" and c["h"] > 1 and rng.random() < 0.4:
            c["p"] = rng.randint(1, c["h"] - 1)
        configs.append({k: v for k, v in c.items() if v is not False})
    return configs


def out_dir_and_configs(fixed, random_configs):
    """The command line's OUT_DIR and configurations: `fixed`, or with --random SEED COUNT,
    random_configs(SEED, COUNT)."""
    args = sys.argv[1:]
    configs = fixed
    if "--random" in args:
        i = args.index("--random")
        configs = random_configs(int(args[i + 1]), int(args[i + 2]))
        args = args[:i] + args[i + 3:]
    return (args[0] if args else "tests/fixtures"), configs


def main():
    out, configs = out_dir_and_configs(CONFIGS, random_configs)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    names = []
    for n, c in enumerate(configs):
        meta, tensors = make(c, 1000 + n)
        write_safetensors(os.path.join(out, meta["name"] + ".safetensors"), tensors, meta)
        names.append(meta["name"])
    with open(os.path.join(out, "index.txt"), "w") as f:
        f.write("\n".join(names) + "\n")
    print("wrote %d PyTorch %s fixtures to %s" % (len(names), torch.__version__, out))


if __name__ == "__main__":
    main()
