#!/usr/bin/python3
"""Writes PyTorch reference fixtures for seqforge's transformer parity tests.

The reference is a GPT-2 style model written here in nanoGPT's manner (model.py): token and
learned position embeddings, pre-LayerNorm blocks of multi-head self-attention computed with the
explicit (T, T) softmax and a GELU MLP, a final LayerNorm and a head tied to the token embedding.
As a classifier (k classes): optional segment embeddings transformer.wse (seg of them), padded
rows (keys past a row's length are never attended to), and a head `classifier` on the mean of
ln_f's outputs over each row's tokens.
For every configuration: the parameters (nanoGPT's initialisation, then biases and LayerNorm
parameters perturbed so that every tensor matters), token ids and targets, the logits, the
cross-entropy loss and every parameter gradient, computed in float64 from float32-representable
parameters, and the trained parameters after one AdamW step with nanoGPT's decay groups.
With adapter dropout (drop), the pass is a training one whose adapter dropout masks are seqforge's:
drawn per block from Rng(1) and hashed per element, as the engine draws them (see DropoutMasks).

Usage: /usr/bin/python3 tests/python/make_transformer_fixtures.py OUT_DIR [--random SEED COUNT]
Each fixture is OUT_DIR/<name>.safetensors; OUT_DIR/transformer_index.txt lists them. With
--random, COUNT random configurations (at least 17 for the parity tests) replace CONFIGS:
  SEQFORGE_FIXTURE_DIR=OUT_DIR build/tests/seqforge_tests --gtest_filter='PyTorchParity.Transformer*'

"""
import math
import os
import random
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_parity_fixtures import (  # noqa: E402
    f32, max_rel_error, out_dir_and_configs, write_safetensors)

# v vocabulary, c width, l layers, h heads (head size c / h), t tokens, b batch, bs block size;
# adapter: "lora" or "dora" on the Linears named in targets, of rank r and alpha a (base frozen),
# drop its dropout.
CONFIGS = [
    dict(v=5, c=4, l=1, h=1, t=1, b=1, bs=1),
    dict(v=11, c=12, l=1, h=2, t=7, b=3, bs=8),
    dict(v=65, c=30, l=2, h=3, t=33, b=2, bs=40),          # head size 10
    dict(v=17, c=21, l=2, h=3, t=17, b=2, bs=17),          # head size 7
    dict(v=40, c=48, l=3, h=2, t=64, b=2, bs=64),          # head size 24
    dict(v=9, c=64, l=1, h=1, t=130, b=1, bs=130),         # head size 64, T beyond a tile
    dict(v=23, c=36, l=2, h=6, t=29, b=4, bs=32, causal=False),
    dict(v=13, c=20, l=1, h=4, t=100, b=2, bs=128, causal=False),
    dict(v=17, c=24, l=2, h=3, t=19, b=3, bs=24, adapter="lora", r=4, a=8.0,
         targets=["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]),
    dict(v=17, c=24, l=2, h=3, t=19, b=3, bs=24, adapter="dora", r=4, a=8.0,
         targets=["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]),
    dict(v=11, c=30, l=1, h=5, t=33, b=2, bs=40, adapter="dora", r=2, a=2.0,
         targets=["attn.c_attn", "mlp.c_proj"]),
    dict(v=11, c=30, l=1, h=5, t=33, b=2, bs=40, adapter="lora", r=3, a=1.5,
         targets=["mlp.c_fc"], causal=False),
    # alpha / rank not a float (8/3, 16/5): scaled in the GEMMs' own precision
    dict(v=17, c=24, l=2, h=3, t=19, b=3, bs=24, adapter="lora", r=3, a=8.0,
         targets=["attn.c_attn", "mlp.c_fc"]),
    dict(v=13, c=20, l=1, h=2, t=17, b=2, bs=20, adapter="dora", r=5, a=16.0,
         targets=["attn.c_proj", "mlp.c_proj"]),
    # classifiers: k classes, seg segments, padded rows
    dict(v=19, c=24, l=2, h=3, t=21, b=4, bs=24, causal=False, k=3, seg=2),
    dict(v=11, c=20, l=1, h=2, t=37, b=3, bs=40, k=2),                      # causal, no segments
    dict(v=13, c=36, l=2, h=4, t=130, b=2, bs=130, causal=False, k=2, seg=2),  # head size 9
    dict(v=17, c=24, l=2, h=3, t=19, b=3, bs=24, causal=False, k=2, seg=2, adapter="dora", r=4,
         a=8.0, targets=["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]),
    dict(v=17, c=24, l=1, h=2, t=16, b=5, bs=16, causal=False, k=4, seg=2, adapter="lora", r=2,
         a=4.0, targets=["attn.c_attn", "mlp.c_fc"]),
    # adapter dropout, PEFT's lora_dropout
    dict(v=17, c=24, l=2, h=3, t=19, b=3, bs=24, adapter="dora", r=4, a=8.0, drop=0.25,
         targets=["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]),
    dict(v=11, c=30, l=2, h=5, t=23, b=2, bs=24, adapter="lora", r=3, a=6.0, drop=0.4,
         targets=["attn.c_attn", "mlp.c_proj"]),
    dict(v=13, c=20, l=1, h=2, t=17, b=4, bs=24, causal=False, k=3, seg=2, adapter="dora", r=2,
         a=2.0, drop=0.1, targets=["attn.c_proj", "mlp.c_fc"]),
    # no biases in the Linears and LayerNorms (nanoGPT's bias=False, its train.py default)
    dict(v=15, c=24, l=2, h=3, t=33, b=2, bs=40, bias=False),
    dict(v=17, c=24, l=2, h=3, t=19, b=3, bs=24, causal=False, k=3, seg=2, adapter="dora", r=4,
         a=8.0, drop=0.2, targets=["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"],
         bias=False),
]


def name_of(c):
    kind = "gpt" if c.get("causal", True) else "encoder"
    name = "%s_v%d_c%d_l%d_h%d_t%d_b%d" % (kind, c["v"], c["c"], c["l"], c["h"], c["t"], c["b"])
    if "k" in c:
        name += "_cls%d_seg%d" % (c["k"], c.get("seg", 0))
    if "adapter" in c:
        name += "_%s_r%d_%dtargets" % (c["adapter"], c["r"], len(c["targets"]))
    if c.get("drop"):
        name += "_drop%g" % c["drop"]
    if not c.get("bias", True):
        name += "_nobias"
    return name


MASK64 = (1 << 64) - 1


def splitmix_finalize(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


class SeqforgeRng:
    """seqforge's Rng: xoshiro256** seeded through splitmix64."""

    def __init__(self, seed):
        self.s = []
        for _ in range(4):
            seed = (seed + 0x9E3779B97F4A7C15) & MASK64
            self.s.append(splitmix_finalize(seed))

    def next(self):
        s = self.s
        rotl = lambda x, k: ((x << k) | (x >> (64 - k))) & MASK64  # noqa: E731
        result = (rotl((s[1] * 5) & MASK64, 7) * 9) & MASK64
        t = (s[1] << 17) & MASK64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result


def dropout_mask(seed, p, rows, cols):
    """seqforge's dropout mask of a (rows, cols) tensor: element i (row-major) is dropped when the
    top 53 bits of a counter hash of (seed, i), as a fraction, fall below p; kept ones are
    1 / (1 - p)."""
    below = math.ceil(math.ldexp(p, 53))
    keep = 1.0 / (1.0 - p)
    out = []
    for i in range(rows * cols):
        z = seed ^ ((i * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & MASK64)
        out.append(0.0 if (splitmix_finalize(z) >> 11) < below else keep)
    return torch.tensor(out, dtype=torch.float64).view(rows, cols)


def mix_seed(a, b):
    return splitmix_finalize((splitmix_finalize(a) + b * 0x9E3779B97F4A7C15) & MASK64)


LINEARS = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]


def adapter_masks(c):
    """{(block, target): (B, T, in) mask} of a training forward from Rng(1): each block draws a seed
    (nothing else draws without model dropout), its Linear j hashes mix_seed(seed, 16 + j)."""
    rng, masks = SeqforgeRng(1), {}
    for i in range(c["l"]):
        seed = rng.next()
        for j, target in enumerate(LINEARS):
            if target in c["targets"]:
                width = 4 * c["c"] if target == "mlp.c_proj" else c["c"]
                mask = dropout_mask(mix_seed(seed, 16 + j), c["drop"], c["b"] * c["t"], width)
                masks[(i, target)] = mask.view(c["b"], c["t"], width)
    return masks


class Adapted(torch.nn.Module):
    """A frozen Linear with a LoRA or DoRA adapter, as PEFT computes it: the DoRA weight norm
    ||W0 + s B A|| per output row is detached (a constant in backward). With a dropout mask, the
    adapter reads the dropped input x' = x * mask: LoRA adds s x' A^T B^T; DoRA keeps the base on x
    and adds (m / ||V|| - 1) x' W0^T + (m / ||V||) s x' A^T B^T."""

    def __init__(self, base, kind, r, alpha):
        super().__init__()
        self.base, self.kind, self.s = base, kind, alpha / r
        self.lora_A = torch.nn.Parameter(torch.empty(r, base.in_features))
        self.lora_B = torch.nn.Parameter(torch.empty(base.out_features, r))
        if kind == "dora":
            self.lora_magnitude_vector = torch.nn.Parameter(torch.empty(base.out_features))
        for p in base.parameters():
            p.requires_grad_(False)
        self.mask = None

    def forward(self, x):
        xd = x if self.mask is None else x * self.mask.to(x.dtype)
        delta = (xd @ self.lora_A.t()) @ self.lora_B.t() * self.s
        if self.kind == "lora":
            return self.base(x) + delta
        weight = self.base.weight + self.s * (self.lora_B @ self.lora_A)
        scale = self.lora_magnitude_vector / weight.norm(dim=1).detach()
        if self.mask is None:
            out = scale * (x @ self.base.weight.t() + delta)
            return out if self.base.bias is None else out + self.base.bias
        return self.base(x) + (scale - 1) * (xd @ self.base.weight.t()) + scale * delta


# With a generator here, every Linear sums its inputs in a random order: the same function, rounded
# otherwise (PyTorch's own float32 error is the worst of several such orders).
SUMMATION_ORDER = None
# With FLASH_BACKWARD, attention is differentiated as flash attention differentiates it.
FLASH_BACKWARD = False


class FlashSoftmaxPV(torch.autograd.Function):
    """softmax(scores) @ v whose backward takes each row's sum of dP * P from the output, as flash
    attention does: dscores = P (dP - rowsum(dO * O)) rather than P (dP - rowsum(P * dP)). The
    same gradient, rounded otherwise: where a row's probabilities nearly cancel (two keys, one of
    them dominant), float32's spread between the two is part of its own error."""

    @staticmethod
    def forward(ctx, scores, v):
        p = torch.softmax(scores, dim=-1)
        o = p @ v
        ctx.save_for_backward(p, v, o)
        return o

    @staticmethod
    def backward(ctx, do):
        p, v, o = ctx.saved_tensors
        dp = do @ v.transpose(-1, -2)
        return p * (dp - (do * o).sum(-1, keepdim=True)), p.transpose(-1, -2) @ do


def softmax_pv(scores, v, flash=None):
    """softmax(scores) @ v over the last axis of scores; flash (default FLASH_BACKWARD) as
    FlashSoftmaxPV differentiates it."""
    if FLASH_BACKWARD if flash is None else flash:
        return FlashSoftmaxPV.apply(scores, v)
    return torch.softmax(scores, dim=-1) @ v


class Linear(torch.nn.Linear):
    def forward(self, x):
        if SUMMATION_ORDER is None:
            return super().forward(x)
        perm = torch.randperm(self.in_features, generator=SUMMATION_ORDER)
        return torch.nn.functional.linear(x[..., perm], self.weight[:, perm], self.bias)


def float32_runs(probes=5, flash_probes=2):
    """(summation order, flash) of PyTorch's float32 runs: its own order, then probes - 1 random
    ones, then flash_probes runs (its own order, then random ones) whose attention is
    differentiated as flash attention does."""
    for probe in range(probes + flash_probes):
        flash = probe >= probes
        seed = probe - probes if flash else probe
        yield (torch.Generator().manual_seed(seed) if seed else None), flash


def float32_probes():
    """Sets SUMMATION_ORDER and FLASH_BACKWARD for each of float32_runs in turn."""
    global SUMMATION_ORDER, FLASH_BACKWARD
    for probe, (SUMMATION_ORDER, FLASH_BACKWARD) in enumerate(float32_runs()):
        yield probe
    SUMMATION_ORDER, FLASH_BACKWARD = None, False


def note_float32_errors(errors, logits32, logits64, grads32, grads64):
    """Raises errors' torch_f32_forward and _backward to one float32 run's errors, if larger."""
    errors["torch_f32_forward"] = max(errors["torch_f32_forward"],
                                      max_rel_error(logits32.detach(), logits64.detach()))
    errors["torch_f32_backward"] = max([errors["torch_f32_backward"]] +
                                       [max_rel_error(grads32[n], g) for n, g in grads64.items()])


class SelfAttention(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = Linear(c["c"], 3 * c["c"], bias=c.get("bias", True))
        self.c_proj = Linear(c["c"], c["c"], bias=c.get("bias", True))
        self.heads, self.causal = c["h"], c.get("causal", True)

    def forward(self, x, lengths):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.causal:
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
            att = att.masked_fill(~mask, float("-inf"))
        if lengths is not None:  # padding: keys at and past a row's length
            keys = torch.arange(T).view(1, 1, 1, T) < lengths.view(B, 1, 1, 1)
            att = att.masked_fill(~keys, float("-inf"))
        y = softmax_pv(att, v)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Mlp(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Linear(c["c"], 4 * c["c"], bias=c.get("bias", True))
        self.gelu = torch.nn.GELU()
        self.c_proj = Linear(4 * c["c"], c["c"], bias=c.get("bias", True))

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class LayerNorm(torch.nn.Module):
    """nanoGPT's LayerNorm: its bias optional (torch 1.13's nn.LayerNorm has no bias=False)."""

    def __init__(self, c):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(c["c"]))
        self.bias = torch.nn.Parameter(torch.zeros(c["c"])) if c.get("bias", True) else None

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c)
        self.attn = SelfAttention(c)
        self.ln_2 = LayerNorm(c)
        self.mlp = Mlp(c)

    def forward(self, x, lengths):
        x = x + self.attn(self.ln_1(x), lengths)
        return x + self.mlp(self.ln_2(x))


class Gpt(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        modules = dict(wte=torch.nn.Embedding(c["v"], c["c"]),
                       wpe=torch.nn.Embedding(c["bs"], c["c"]))
        if c.get("seg"):
            modules["wse"] = torch.nn.Embedding(c["seg"], c["c"])
        modules["h"] = torch.nn.ModuleList([Block(c) for _ in range(c["l"])])
        modules["ln_f"] = LayerNorm(c)
        self.transformer = torch.nn.ModuleDict(modules)
        if "k" in c:
            self.classifier = Linear(c["c"], c["k"])
        else:
            self.lm_head = Linear(c["c"], c["v"], bias=False)
            self.lm_head.weight = self.transformer.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * c["l"]))
            elif name.endswith(".weight") and p.dim() == 2:
                torch.nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".bias"):
                torch.nn.init.zeros_(p)

    def forward(self, ids, lengths=None, segments=None):
        T = ids.shape[1]
        x = self.transformer.wte(ids) + self.transformer.wpe(torch.arange(T))
        if segments is not None:
            x = x + self.transformer.wse(segments)
        for block in self.transformer.h:
            x = block(x, lengths)
        z = self.transformer.ln_f(x)
        if not hasattr(self, "classifier"):
            return self.lm_head(z)
        valid = (torch.arange(T).view(1, T) < lengths.view(-1, 1)).to(z.dtype)  # (B, T)
        pooled = (z * valid.unsqueeze(-1)).sum(1) / lengths.view(-1, 1).to(z.dtype)
        return self.classifier(pooled)


def inputs(c):
    """Token ids and targets; a classifier's rows padded to random lengths (the first full),
    text B's segment starting at a random point of each row, random ids in the padding."""
    B, T = c["b"], c["t"]
    ids = torch.randint(0, c["v"], (B, T))
    if "k" not in c:
        return dict(ids=ids, targets=torch.randint(0, c["v"], (B, T)))
    lengths = torch.randint(1, T + 1, (B,))
    lengths[0] = T
    out = dict(ids=ids, targets=torch.randint(0, c["k"], (B,)), lengths=lengths)
    if c.get("seg"):
        segments = torch.zeros(B, T, dtype=torch.int64)
        for b in range(B):
            start = int(torch.randint(1, int(lengths[b]) + 1, (1,)))
            segments[b, start:int(lengths[b])] = 1
        out["segments"] = segments
    return out


def run(model, x):
    logits = model(x["ids"], x.get("lengths"), x.get("segments"))
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), x["targets"].view(-1))
    loss.backward()
    return logits.reshape(-1, V), loss


def add_adapters(model, c):
    """Wraps the targeted Linears; returns {PEFT name: parameter}."""
    named = {}
    for i, block in enumerate(model.transformer.h):
        for target in c["targets"]:
            parent_name, attr = target.split(".")
            parent = getattr(block, parent_name)
            adapted = Adapted(getattr(parent, attr), c["adapter"], c["r"], c["a"])
            if c.get("drop"):
                adapted.mask = c["masks"][(i, target)]
            setattr(parent, attr, adapted)
            prefix = "base_model.model.transformer.h.%d.%s." % (i, target)
            named[prefix + "lora_A.weight"] = adapted.lora_A
            named[prefix + "lora_B.weight"] = adapted.lora_B
            if c["adapter"] == "dora":
                named[prefix + "lora_magnitude_vector"] = adapted.lora_magnitude_vector
    adapter_ids = {id(p) for p in named.values()}
    for n, p in model.named_parameters():  # PEFT freezes the base model but a new head
        p.requires_grad_(id(p) in adapter_ids or n.startswith(("classifier.", "transformer.wse.")))
    return named


ADAMW_LR, ADAMW_DECAY = 1e-2, 0.1


def adamw_step(params, tensors):
    """One AdamW step from the gradients with nanoGPT's groups (decay on parameters of two or more
    dimensions only); records every parameter after it as adamw.<name>."""
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW_DECAY},
                       {"params": no_decay, "weight_decay": 0.0}], lr=ADAMW_LR).step()
    for n, p in params.items():
        tensors["adamw." + n] = p.detach().clone()


def make(c, seed):
    torch.manual_seed(seed)
    model = Gpt(c)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # biases and LayerNorm parameters: not their 0 / 1, so each counts
                p.add_(0.1 * torch.randn_like(p))
            p.copy_(f32(p))
    if "adapter" in c:
        return make_adapted(c, model)
    x = inputs(c)
    tensors = {}
    m = Gpt(c)
    m.load_state_dict(model.state_dict())
    m.to(torch.float64)
    logits, loss = run(m, x)
    grads = {n: p.grad.detach() for n, p in m.named_parameters()}
    for n, p in m.named_parameters():
        tensors["param." + n] = p.detach().clone()
        tensors["grad." + n] = grads[n]
    tensors.update(x)
    tensors["logits"] = logits.detach()
    tensors["loss"] = loss.detach().reshape(1)
    adamw_step(dict(m.named_parameters()), tensors)
    errors = dict(torch_f32_forward=0.0, torch_f32_backward=0.0)
    for _ in float32_probes():
        m32 = Gpt(c)
        m32.load_state_dict(model.state_dict())
        logits32, _ = run(m32, x)
        note_float32_errors(errors, logits32, logits,
                            {n: p.grad for n, p in m32.named_parameters()}, grads)
    meta = dict(c, name=name_of(c), causal=c.get("causal", True), **errors)
    return meta, tensors


def make_adapted(c, base):
    """The base frozen under adapters whose B and magnitudes are away from their starting zeros
    and norms, so that every adapter gradient counts."""
    x = inputs(c)
    if c.get("drop"):
        c = dict(c, masks=adapter_masks(c))
    adapters = {}

    def adapted_run(dtype):
        """The model with its adapters in dtype after a forward and backward pass: the model,
        its adapters, the trained parameters (the adapters and a new head), logits and loss."""
        m = Gpt(c)
        m.load_state_dict(base.state_dict())
        named = add_adapters(m, c)
        with torch.no_grad():
            for n, p in named.items():
                if n not in adapters:
                    if n.endswith("lora_magnitude_vector"):
                        w = m.get_submodule(n[len("base_model.model."):-len(".lora_magnitude_vector")])
                        adapters[n] = f32(w.base.weight.norm(dim=1) * (1 + 0.2 * torch.randn(p.shape[0])))
                    elif n.endswith("lora_A.weight"):  # PEFT's Kaiming-uniform bound
                        bound = 1 / math.sqrt(p.shape[1])
                        adapters[n] = f32(torch.empty(p.shape).uniform_(-bound, bound))
                    else:  # B as after some training: s B A about as large as W0
                        adapters[n] = f32(0.02 * torch.randn(p.shape))
                p.copy_(adapters[n])
        m.to(dtype)
        for p in m.parameters():
            p.grad = None
        logits, loss = run(m, x)
        trained = dict(named)
        for n, p in m.named_parameters():
            if n.startswith(("classifier.", "transformer.wse.")):
                trained[n] = p
        return m, named, trained, logits, loss

    m, named, trained, logits, loss = adapted_run(torch.float64)
    for n, p in m.named_parameters():
        if not n.endswith(("lora_A", "lora_B", "lora_magnitude_vector")) and n not in trained:
            assert p.grad is None, n  # the base is frozen
    tensors = {}
    for n, p in base.named_parameters():
        tensors["param." + n] = p.detach().double()
        if n in trained:
            tensors["grad." + n] = trained[n].grad.detach()
    for n, p in named.items():
        tensors["param." + n] = p.detach().clone()
        tensors["grad." + n] = p.grad.detach()
    tensors.update(x)
    tensors["logits"] = logits.detach()
    tensors["loss"] = loss.detach().reshape(1)
    grads = {n: p.grad.detach() for n, p in trained.items()}
    adamw_step(trained, tensors)
    errors = dict(torch_f32_forward=0.0, torch_f32_backward=0.0)
    for _ in float32_probes():
        _, _, trained32, logits32, _ = adapted_run(torch.float32)
        note_float32_errors(errors, logits32, logits,
                            {n: p.grad for n, p in trained32.items()}, grads)
    c = {k: v for k, v in c.items() if k != "masks"}
    meta = dict(c, name=name_of(c), causal=c.get("causal", True), **errors)
    return meta, tensors


def random_configs(seed, count):
    """count configurations drawn from Random(seed): heads, head sizes (1 to 48, widths of 8 and
    more), T (1 to 130), causal or not, classifiers with segments, LoRA or DoRA on random targets
    with dropout."""
    rng = random.Random(seed)
    linears = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    configs = []
    for _ in range(count):
        h = rng.randint(1, 6)
        t = rng.choice([1, 2, 3, 15, 16, 17, 31, 33, 63, 64, 65, 97, 128, 130])
        head = rng.choice([1, 3, 5, 7, 8, 13, 16, 17, 24, 33, 48])
        while h * head < 8:  # LayerNorms over fewer values are ill-conditioned in float32
            head += 1
        c = dict(v=rng.randint(2, 70), c=h * head, l=rng.randint(1, 3), h=h, t=t,
                 b=rng.randint(1, 4), bs=t + rng.choice([0, 3, 20]))
        if rng.random() < 0.4:
            c["causal"] = False
        if rng.random() < 0.3:
            c["bias"] = False
        if rng.random() < 0.35:
            c["k"] = rng.randint(2, 5)
            if rng.random() < 0.6:
                c["seg"] = rng.randint(2, 3)
        if rng.random() < 0.5:
            c.update(adapter=rng.choice(["lora", "dora"]), r=rng.randint(1, 8),
                     a=rng.choice([1.0, 2.0, 8.0, 16.0]),
                     targets=sorted(rng.sample(linears, rng.randint(1, 4)), key=linears.index))
            if rng.random() < 0.4:
                c["drop"] = rng.choice([0.1, 0.3, 0.5])
        configs.append(c)
    return configs


def main():
    out, configs = out_dir_and_configs(CONFIGS, random_configs)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)
    names = []
    for n, c in enumerate(configs):
        meta, tensors = make(c, 5000 + n)
        write_safetensors(os.path.join(out, meta["name"] + ".safetensors"), tensors, meta)
        names.append(meta["name"])
    with open(os.path.join(out, "transformer_index.txt"), "w") as f:
        f.write("\n".join(names) + "\n")
    print("wrote %d PyTorch %s transformer fixtures to %s" % (len(names), torch.__version__, out))


if __name__ == "__main__":
    main()
