#!/usr/bin/python3
"""The benchmark workloads of WORKLOADS.md in PyTorch, for side-by-side comparison with
`seqforge bench`: one training step = forward, backward, Adam step, on random data.

Usage: /usr/bin/python3 bench/pytorch_bench.py [W1|...|W6|W1g|W4g|W1p|W4p|W9|A5|A5k|all]
                                              [--precision fp32|bf16|fp16] [--device cpu|cuda]
                                               [--steps N] [--warmup N] [--threads N] [--json FILE]
Threads are tuned as WORKLOADS.md describes: torch.set_num_threads(cores), OMP_WAIT_POLICY=PASSIVE.
bf16 uses torch.autocast("cpu", dtype=torch.bfloat16) around forward and loss. On --device cuda,
what the GPU guides set by hand: cuDNN's fused LSTM/GRU with cudnn.benchmark, TF32 for fp32
GEMMs and convolutions, autocast (bf16; fp16 with a GradScaler), the fused Adam, and each step
timed after torch.cuda.synchronize().
W6 is W5 with DoRA rank 8 on every attention and MLP Linear, the rest frozen. W9 is a small
Llama (the modules of Hugging Face's Llama written out: RMS norm, rotate-half rotary embeddings,
grouped-query attention by repeated key/value heads, a SiLU gated MLP, an untied head) with DoRA
rank 8 on all seven Linears of every block, the rest frozen.
A5 and A5k are attention alone, forward and backward of causal self-attention (W5's heads at
T 256, and at T 1024): F.scaled_dot_product_attention where PyTorch has it (2.x: flash attention
on a GPU, in the precision's dtype), else the explicit softmax.
W1g and W4g are W1 and W4 with an nn.GRU in place of the nn.LSTM, W1p and W4p with an LSTM of
proj_size H/2; W5 is nanoGPT's Shakespeare-character model (its modules, with the explicit
(T, T) attention softmax: PyTorch 1.13 has no fused attention on the CPU); "all" runs them all.
"""
import math
import argparse
import json
import os
import resource
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

WORKLOADS = {
    "W1": dict(name="lstm_i8_h128_l2_t150_b256", cell="lstm", input=8, hidden=128, layers=2,
               bi=False, out=1, per_step=False, batch=256, steps=150, loss="mse"),
    "W2": dict(name="bilstm_i4_h128_l2_t105_b512_mae", cell="lstm", input=4, hidden=128, layers=2,
               bi=True, out=4, per_step=True, batch=512, steps=105, loss="mse_masked"),
    "W3": dict(name="lstm_i6_h64_l1_t24_b64", cell="lstm", input=6, hidden=64, layers=1, bi=False,
               out=1, per_step=False, batch=64, steps=24, loss="mse"),
    "W4": dict(name="charlm_v65_e64_h512_l2_t128_b64", cell="lstm", vocab=65, input=64, hidden=512,
               layers=2, bi=False, out=65, per_step=True, batch=64, steps=128, loss="ce"),
    "W1g": dict(name="gru_i8_h128_l2_t150_b256", cell="gru", input=8, hidden=128, layers=2,
                bi=False, out=1, per_step=False, batch=256, steps=150, loss="mse"),
    "W4g": dict(name="chargru_v65_e64_h512_l2_t128_b64", cell="gru", vocab=65, input=64,
                hidden=512, layers=2, bi=False, out=65, per_step=True, batch=64, steps=128,
                loss="ce"),
    "W1p": dict(name="lstm_i8_h128_p64_l2_t150_b256", cell="lstm", proj=64, input=8, hidden=128,
                layers=2, bi=False, out=1, per_step=False, batch=256, steps=150, loss="mse"),
    "W4p": dict(name="charlm_v65_e64_h512_p256_l2_t128_b64", cell="lstm", proj=256, vocab=65,
                input=64, hidden=512, layers=2, bi=False, out=65, per_step=True, batch=64,
                steps=128, loss="ce"),
    "W5": dict(name="gpt_v65_d384_l6_h6_t256_b16", cell="gpt", vocab=65, width=384, layers=6,
               heads=6, bi=False, out=65, per_step=True, batch=16, steps=256, loss="ce"),
    "W6": dict(name="gpt_v65_d384_l6_h6_t256_b16_dora_r8", cell="gpt", vocab=65, width=384,
               layers=6, heads=6, bi=False, out=65, per_step=True, batch=16, steps=256, loss="ce",
               dora=8),
    "W9": dict(name="llama_v2048_d384_f1024_l6_h6_kv2_t256_b16_dora_r8", cell="llama",
               vocab=2048, width=384, mlp=1024, layers=6, heads=6, kv=2, bi=False, out=2048,
               per_step=True, batch=16, steps=256, loss="ce", dora=8),
    "A5": dict(name="attention_h6_d64_t256_b16", cell="attention", heads=6, head_dim=64,
               batch=16, steps=256),
    "A5k": dict(name="attention_h6_d64_t1024_b4", cell="attention", heads=6, head_dim=64,
                batch=4, steps=1024),
}


class Dora(torch.nn.Module):
    """PEFT's DoRA on a frozen Linear: m (x V^T) / ||V|| + b, V = W0 + (alpha/r) B A, the norm
    per output row detached."""

    def __init__(self, base, r, alpha=16.0):
        super().__init__()
        self.base, self.s = base, alpha / r
        self.lora_A = torch.nn.Parameter(torch.randn(r, base.in_features) / base.in_features ** 0.5)
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, r))
        self.m = torch.nn.Parameter(base.weight.detach().norm(dim=1))
        base.requires_grad_(False)

    def forward(self, x):
        delta = (x @ self.lora_A.t()) @ self.lora_B.t() * self.s
        weight = self.base.weight + self.s * (self.lora_B @ self.lora_A)
        scale = self.m / weight.norm(dim=1).detach()
        y = scale * (x @ self.base.weight.t() + delta)
        return y if self.base.bias is None else y + self.base.bias


class Block(torch.nn.Module):
    """nanoGPT's pre-LayerNorm block: causal self-attention (its explicit form on the CPU, SDPA's
    flash attention on a GPU) and a GELU MLP."""

    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
        self.c_attn, self.attn_proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
        self.c_fc, self.mlp_proj = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        if x.is_cuda:  # flash attention, as the seed guides set it on GPUs
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(torch.nn.functional.gelu(self.c_fc(self.ln_2(x))))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
        att = att.masked_fill(causal, float("-inf"))
        y = (torch.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(torch.nn.functional.gelu(self.c_fc(self.ln_2(x))))


class Gpt(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        c = w["width"]
        self.wte = torch.nn.Embedding(w["vocab"], c)
        self.wpe = torch.nn.Embedding(w["steps"], c)
        self.h = torch.nn.ModuleList([Block(c, w["heads"]) for _ in range(w["layers"])])
        self.ln_f = torch.nn.LayerNorm(c)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        return (x @ self.wte.weight.t()).reshape(-1, self.wte.weight.shape[0])  # tied head


class RmsNorm(torch.nn.Module):
    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.ones(c)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaLayer(torch.nn.Module):
    """Hugging Face's LlamaDecoderLayer: RMS norm, q/k/v projections, rotary embeddings, key and
    value heads repeated for their query heads, causal attention (explicit on the CPU, SDPA on a
    GPU), o projection; RMS norm and the SiLU gated MLP."""

    def __init__(self, w):
        super().__init__()
        c, self.h, self.kv = w["width"], w["heads"], w["kv"]
        self.d = c // self.h
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = RmsNorm(c), RmsNorm(c)
        self.q_proj, self.k_proj = lin(c, self.h * self.d), lin(c, self.kv * self.d)
        self.v_proj, self.o_proj = lin(c, self.kv * self.d), lin(self.h * self.d, c)
        self.gate_proj, self.up_proj = lin(c, w["mlp"]), lin(c, w["mlp"])
        self.down_proj = lin(w["mlp"], c)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.h, self.d).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.kv, self.d).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(self.h // self.kv, dim=1)
        v = v.repeat_interleave(self.h // self.kv, dim=1)
        if x.is_cuda:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.d)
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
            y = torch.softmax(att.masked_fill(causal, float("-inf")), dim=-1) @ v
        x = x + self.o_proj(y.transpose(1, 2).reshape(B, T, self.h * self.d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(torch.nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        c = w["width"]
        self.embed_tokens = torch.nn.Embedding(w["vocab"], c)
        self.layers = torch.nn.ModuleList([LlamaLayer(w) for _ in range(w["layers"])])
        self.norm = RmsNorm(c)
        self.lm_head = torch.nn.Linear(c, w["vocab"], bias=False)
        d = c // w["heads"]
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        freqs = torch.arange(w["steps"], dtype=torch.float32)[:, None] * inv[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        T = ids.shape[1]
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        return self.lm_head(self.norm(x)).reshape(-1, self.lm_head.weight.shape[0])


class Model(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.w = w
        if "vocab" in w:
            self.embedding = torch.nn.Embedding(w["vocab"], w["input"])
        kw = dict(batch_first=True, bidirectional=w["bi"])
        if w["cell"] == "gru":
            self.rnn = torch.nn.GRU(w["input"], w["hidden"], w["layers"], **kw)
        else:
            self.rnn = torch.nn.LSTM(w["input"], w["hidden"], w["layers"],
                                     proj_size=w.get("proj", 0), **kw)
        width = w.get("proj") or w["hidden"]
        self.head = torch.nn.Linear((2 if w["bi"] else 1) * width, w["out"])

    def forward(self, x):
        if "vocab" in self.w:
            x = self.embedding(x)
        y, _ = self.rnn(x)  # LSTM: (y, (h_n, c_n)); GRU: (y, h_n)
        if self.w["per_step"]:
            return self.head(y.reshape(-1, y.shape[-1]))
        return self.head(y[:, -1])


def gflop(w):
    if w["cell"] == "attention":  # as seqforge bench counts it: q.k and p.v over T/2 keys, 3.5x
        T = w["steps"]
        return 3.5 * 2.0 * 2 * w["batch"] * w["heads"] * T * T / 2 * w["head_dim"] / 1e9
    if w["cell"] == "llama":  # as seqforge bench counts it
        c, n, L = w["width"], w["batch"] * w["steps"], w["layers"]
        kvd = w["kv"] * c // w["heads"]
        layer = c * (c + 2 * kvd) + c * c + 3 * c * w["mlp"]
        fwd = 2.0 * n * (L * layer + c * w["vocab"]) + 2.0 * n * w["steps"] * c * L
        return (2 if "dora" in w else 3) * fwd / 1e9
    if w["cell"] == "gpt":  # as seqforge bench counts it: 3x the forward pass, 2x when frozen
        c, n = w["width"], w["batch"] * w["steps"]
        fwd = 2.0 * n * (12 * w["layers"] * c * c + c * w["vocab"]) + \
            2.0 * n * w["steps"] * c * w["layers"]
        return (2 if "dora" in w else 3) * fwd / 1e9
    d = 2 if w["bi"] else 1
    gates = 3 if w["cell"] == "gru" else 4
    h, p = w["hidden"], w.get("proj") or w["hidden"]
    fwd = sum(d * 2.0 * w["batch"] * w["steps"] *
              (((w["input"] if l == 0 else d * p) + p) * gates * h + (h * p if p < h else 0))
              for l in range(w["layers"]))
    fwd += 2.0 * w["batch"] * (w["steps"] if w["per_step"] else 1) * d * p * w["out"]
    return 3 * fwd / 1e9


def attention(q, k, v):
    """Causal self-attention of (B, H, T, D) tensors."""
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=True)
    T = q.shape[-2]
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1),
                                float("-inf"))
    return scores.softmax(-1) @ v


def run_attention(wid, precision, steps, warmup, device):
    w = WORKLOADS[wid]
    torch.manual_seed(0)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    shape = (w["batch"], w["heads"], w["steps"], w["head_dim"])
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(shape, device=device, dtype=dtype)

    def step():
        attention(q, k, v).backward(dout)

    return timed(wid, w, precision, step, steps, warmup, device)


def timed(wid, w, precision, step, steps, warmup, device):
    """Times `step` as the training steps are timed; the result row of `wid`."""
    cuda = device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(warmup):
        step()
    sync()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    s = sorted(times)
    median = s[len(s) // 2] if len(s) % 2 else 0.5 * (s[len(s) // 2 - 1] + s[len(s) // 2])
    B = w["batch"]
    return dict(id=wid, name=w["name"], precision=precision, step_ms=times, median_ms=median,
                samples_per_s=B / (median / 1e3), gflops=gflop(w) / (median / 1e3),
                peak_mb=(torch.cuda.max_memory_allocated() / 2**20 if cuda else
                         resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0),
                threads=torch.get_num_threads(), torch=torch.__version__, device=device)


def run(wid, precision, steps, warmup, device="cpu"):
    w = WORKLOADS[wid]
    if w["cell"] == "attention":
        return run_attention(wid, precision, steps, warmup, device)
    torch.manual_seed(0)
    cuda = device == "cuda"
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = {"gpt": Gpt, "llama": Llama}.get(w["cell"], Model)(w)
    if "dora" in w:
        model.requires_grad_(False)
        if w["cell"] == "llama":
            blocks, names = model.layers, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                           "up_proj", "down_proj")
        else:
            blocks, names = model.h, ("c_attn", "attn_proj", "c_fc", "mlp_proj")
        for block in blocks:
            for name in names:
                setattr(block, name, Dora(getattr(block, name), w["dora"]))
    model = model.to(device)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(trained, lr=1e-3, fused=True) if cuda else torch.optim.Adam(trained,
                                                                                     lr=1e-3)
    scaler = torch.amp.GradScaler("cuda") if cuda and precision == "fp16" else None
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    B, T = w["batch"], w["steps"]
    rows = B * T if w["per_step"] else B
    if "vocab" in w:
        x = torch.randint(0, w["vocab"], (B, T))
        target = torch.randint(0, w["vocab"], (rows,))
    else:
        x = torch.randn(B, T, w["input"])
        target = torch.randn(rows, w["out"])
    mask = (torch.rand(rows) < 0.15) if w["loss"] == "mse_masked" else None
    x, target = x.to(device), target.to(device)
    mask = mask.to(device) if mask is not None else None

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=low or torch.bfloat16, enabled=low is not None):
            out = model(x)
            if w["loss"] == "ce":
                loss = torch.nn.functional.cross_entropy(out.float(), target)
            elif mask is not None:
                loss = ((out.float()[mask] - target[mask]) ** 2).mean()
            else:
                loss = torch.nn.functional.mse_loss(out.float(), target)
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()

    return timed(wid, w, precision, step, steps, warmup, device)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("workload", nargs="?", default="all")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    ids = list(WORKLOADS) if a.workload == "all" else [a.workload]
    results = []
    for wid in ids:
        if wid not in WORKLOADS:
            sys.exit("unknown workload %s (expected %s or all)" % (wid, ", ".join(WORKLOADS)))
        r = run(wid, a.precision, a.steps, a.warmup, a.device)
        results.append(r)
        print("%-3s %-34s %-5s %10.2f ms/step %10.0f samples/s %8.1f GFLOP/s %8.0f peak MB" %
              (wid, r["name"], a.precision, r["median_ms"], r["samples_per_s"], r["gflops"],
               r["peak_mb"]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
