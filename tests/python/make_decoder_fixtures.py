#!/usr/bin/python3
"""Writes PyTorch reference fixtures for seqforge's Llama-family decoder parity tests.

The reference is written here after Hugging Face's modeling code for Llama and Qwen2 (Debian's
torch 1.13 has neither RMSNorm nor SDPA, so both are spelt out): token embeddings, blocks of
RMS norm, q/k/v projections (Qwen2: biases on q, k, v; Llama's attention_bias: on o too),
rotary embeddings in the rotate-half layout (Llama 3's rope scaling where set), grouped-query
attention by repeating each key/value head for its query heads, the explicit causal softmax
(Gemma 3's local layers and Qwen2's windowed ones: within the sliding window; Gemma's soft-capped
scores where attn_logit_softcapping is set), an o projection, RMS norm and a gated MLP (SiLU or
tanh-GELU), a final RMS norm and the head (tied to the embeddings or not; soft-capped where
final_logit_softcapping is set); PEFT's LoRA
and DoRA, with lora_dropout on seqforge's masks where a configuration sets `drop`.

Each configuration becomes a Hugging Face folder OUT_DIR/<name>/ (config.json, the weights as
model.safetensors or as shards named by model.safetensors.index.json, in f32 or bf16) that
seqforge loads as a user's model, and OUT_DIR/<name>/expected.safetensors: token ids and
targets, the logits, the mean cross-entropy and every parameter's gradient, computed in float64
from the stored (f32- or bf16-representable) weights, and PyTorch's own float32 error on them (the
worst of five summation orders and two runs with flash attention's backward). OUT_DIR/decoder_index.txt lists them.

Usage: /usr/bin/python3 tests/python/make_decoder_fixtures.py OUT_DIR [--random SEED COUNT]
  SEQFORGE_FIXTURE_DIR=OUT_DIR build/tests/seqforge_tests --gtest_filter='DecoderParity.*'
"""
import json
import math
import os
import random
import struct
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_parity_fixtures import max_rel_error, out_dir_and_configs  # noqa: E402
from make_transformer_fixtures import (  # noqa: E402
    SeqforgeRng, dropout_mask, float32_runs, mix_seed, softmax_pv)

# type: llama or qwen2; v vocabulary, c hidden, f MLP width, l layers, h query heads, kv
# key/value heads, d head size (given as head_dim when not c / h), t tokens, b batch; tie: tied
# head; bias: Llama's attention_bias, mlp: mlp_bias; act: hidden_act; theta: rope_theta; scaling:
# Llama 3's rope_scaling; shards: weights in that many files; dtype: the weights' F32 or BF16.
CONFIGS = [
    dict(type="llama", v=37, c=24, f=40, l=2, h=4, kv=2, t=13, b=2),
    dict(type="llama", v=29, c=16, f=24, l=1, h=4, kv=1, d=10, t=33, b=2, tie=True),
    dict(type="llama", v=23, c=24, f=36, l=2, h=3, kv=3, d=8, t=20, b=2, bias=True, mlp=True),
    dict(type="llama", v=31, c=24, f=32, l=1, h=2, kv=1, d=12, t=40, b=2, theta=500000.0,
         scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=16)),
    dict(type="qwen2", v=41, c=24, f=48, l=2, h=6, kv=2, t=17, b=3, tie=True),
    dict(type="llama", v=11, c=28, f=20, l=1, h=2, kv=2, d=14, t=1, b=1, act="gelu_pytorch_tanh"),
    dict(type="llama", v=50, c=32, f=44, l=3, h=4, kv=2, t=19, b=2, shards=2, dtype="BF16"),
    dict(type="qwen2", v=19, c=32, f=40, l=1, h=2, kv=1, d=16, t=130, b=1, shards=3),
    # adapters (PEFT's LoRA and DoRA, the base frozen) on Linears by HF's names
    dict(type="llama", v=23, c=24, f=40, l=2, h=4, kv=2, t=11, b=2, adapter="lora", r=4, a=8.0,
         targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    dict(type="qwen2", v=23, c=24, f=40, l=2, h=6, kv=2, t=11, b=2, adapter="dora", r=3, a=6.0,
         targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    dict(type="llama", v=17, c=20, f=28, l=1, h=2, kv=1, d=8, t=9, b=3, adapter="dora", r=2,
         a=2.0, targets=["q_proj", "v_proj"], bias=True),
    # adapter dropout, PEFT's lora_dropout, with seqforge's masks (adapter_masks)
    dict(type="llama", v=23, c=24, f=40, l=2, h=4, kv=2, t=11, b=2, adapter="dora", r=4, a=8.0,
         drop=0.25, bias=True,
         targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    dict(type="qwen2", v=19, c=24, f=32, l=2, h=6, kv=3, d=6, t=13, b=2, adapter="lora", r=3,
         a=6.0, drop=0.4, targets=["q_proj", "v_proj", "o_proj", "down_proj"]),
    # HF's sequence classification head on each row's last token (rows padded on the right);
    # with pad_token_id (pad), the last that is not it: rows ending in it (one all of it)
    dict(type="llama", v=29, c=24, f=32, l=2, h=4, kv=2, t=15, b=3, k=3, lens=[15, 9, 1]),
    dict(type="llama", v=29, c=24, f=32, l=2, h=4, kv=2, t=15, b=3, k=3, lens=[15, 9, 1], pad=5),
    dict(type="qwen2", v=29, c=24, f=32, l=1, h=2, kv=1, d=12, t=12, b=2, k=2, lens=[7, 12],
         adapter="dora", r=4, a=8.0, targets=["q_proj", "v_proj", "down_proj"], tie=True),
    # Gemma 3: (1 + w) norms, scaled embeddings, q/k norms, four norms a layer, its attention
    # scale, local layers with their own rotary base and a sliding window (longer or shorter than
    # the sequence), linear scaling of the global layers' rotation
    # Qwen2's sliding window (use_sliding_window) on the layers from max_window_layers on (mwl),
    # or on those layer_types names (types)
    dict(type="qwen2", v=23, c=24, f=32, l=3, h=4, kv=2, d=6, t=19, b=2, window=5, mwl=1),
    dict(type="qwen2", v=29, c=24, f=32, l=2, h=6, kv=2, d=4, t=14, b=3, window=3, mwl=0,
         k=3, lens=[14, 6, 2], adapter="dora", r=3, a=6.0, targets=["q_proj", "k_proj", "o_proj"]),
    dict(type="qwen2", v=19, c=16, f=24, l=2, h=2, kv=1, d=8, t=9, b=2, window=4,
         types=["sliding_attention", "full_attention"], adapter="lora", r=2, a=4.0,
         targets=["v_proj", "up_proj"]),
    dict(type="gemma3_text", v=37, c=24, f=40, l=3, h=4, kv=2, d=8, t=13, b=2, tie=True,
         qpas=16.0, window=16, pattern=2),
    dict(type="gemma3_text", v=29, c=20, f=28, l=2, h=2, kv=1, d=10, t=9, b=3, tie=True,
         qpas=8.0, window=9, pattern=6, scaling=dict(rope_type="linear", factor=8.0)),
    dict(type="gemma3_text", v=29, c=24, f=32, l=2, h=4, kv=2, d=6, t=11, b=2, tie=True,
         qpas=6.0, window=12, pattern=2, k=3, lens=[11, 4], adapter="dora", r=4, a=8.0,
         targets=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    dict(type="gemma3_text", v=31, c=24, f=32, l=3, h=4, kv=1, d=10, t=40, b=2, tie=True,
         qpas=10.0, window=7, pattern=3),
    dict(type="gemma3_text", v=23, c=20, f=24, l=2, h=6, kv=2, d=6, t=200, b=1, tie=True,
         qpas=6.0, window=33, pattern=2),
    dict(type="gemma3_text", v=29, c=24, f=32, l=2, h=4, kv=2, d=8, t=21, b=3, tie=True,
         qpas=8.0, window=1, pattern=2, k=2, lens=[21, 5, 13], adapter="dora", r=2, a=4.0,
         targets=["q_proj", "v_proj"]),
    dict(type="gemma3_text", v=29, c=20, f=24, l=2, h=4, kv=1, d=8, t=17, b=2, tie=True,
         qpas=8.0, window=6, pattern=2, adapter="dora", r=2, a=4.0, drop=0.1,
         targets=["q_proj", "o_proj", "up_proj"]),
    # soft-capping (attn_logit_softcapping, final_logit_softcapping), caps the scores and logits
    # reach
    dict(type="gemma3_text", v=31, c=24, f=32, l=2, h=4, kv=2, d=8, t=19, b=2, tie=True,
         qpas=2.0, window=7, pattern=2, acap=1.5, fcap=2.0),
    dict(type="gemma3_text", v=23, c=20, f=28, l=2, h=2, kv=1, d=10, t=12, b=3, tie=True,
         qpas=1.0, window=5, pattern=2, acap=0.8, fcap=0.5, adapter="dora", r=2, a=4.0,
         targets=["q_proj", "k_proj", "down_proj"]),
    dict(type="gemma3_text", v=29, c=24, f=32, l=1, h=4, kv=2, d=6, t=14, b=3, tie=True,
         qpas=1.0, window=20, pattern=6, acap=1.0, fcap=0.5, k=3, lens=[14, 9, 3]),
]


def draw_head_and_adapters(rng, c):
    """Adds to c, drawn from rng: HF's sequence classifier on rows of their own lengths (padded
    on the right), and PEFT's LoRA or DoRA on some Linears, with lora_dropout on seqforge's
    masks."""
    if rng.random() < 0.35:
        lens = [rng.randint(1, c["t"]) for _ in range(c["b"])]
        lens[rng.randrange(c["b"])] = c["t"]  # the batch is as long as its longest row
        c.update(k=rng.randint(2, 5), lens=lens)
    if rng.random() < 0.5:
        r = rng.randint(1, 6)
        c.update(adapter=rng.choice(["lora", "dora"]), r=r, a=float(rng.choice([r, 2 * r, 16])),
                 targets=sorted(rng.sample(LINEARS, rng.randint(1, len(LINEARS))),
                                key=LINEARS.index))
        if rng.random() < 0.4:
            c["drop"] = rng.choice([0.1, 0.25, 0.5])


def random_configs(seed, count):
    """count configurations drawn from Random(seed): Llama, Qwen2 or Gemma 3, GQA ratios 1-4, head
    sizes that are not multiples of 16, tied or untied, Llama 3 or linear scaling or none; some
    classifiers of padded rows, some with LoRA or DoRA adapters (and their dropout)."""
    rng = random.Random(seed)
    configs = []
    for _ in range(count):
        kv = rng.randint(1, 3)
        c = dict(type=rng.choice(["llama", "qwen2", "gemma3_text"]), v=rng.randint(2, 70), kv=kv,
                 h=kv * rng.randint(1, 4), d=2 * rng.randint(1, 12), l=rng.randint(1, 3),
                 t=rng.choice([1, 2, 5, 16, 17, 33, 65]), b=rng.randint(1, 3),
                 f=rng.randint(1, 50), c=rng.randint(2, 48), tie=rng.random() < 0.5)
        if c["type"] == "llama" and rng.random() < 0.3:
            c["bias"] = True
        if c["type"] == "gemma3_text":  # windows shorter and longer than the sequence
            c.update(tie=True, qpas=float(rng.choice([c["d"], 2 * c["d"], 7])),
                     window=rng.randint(1, c["t"] + 8), pattern=rng.randint(1, 6))
            if rng.random() < 0.3:
                c["scaling"] = dict(rope_type="linear", factor=rng.choice([2.0, 8.0]))
            if rng.random() < 0.4:
                c.update(acap=rng.choice([0.5, 2.0]), fcap=rng.choice([0.3, 1.0, 5.0]))
            draw_head_and_adapters(rng, c)
            configs.append(c)
            continue
        if c["type"] == "qwen2" and rng.random() < 0.4:
            c.update(window=rng.randint(1, c["t"] + 4), mwl=rng.randint(0, c["l"]))
        if rng.random() < 0.3:
            c.update(theta=500000.0, scaling=dict(
                rope_type="llama3", factor=rng.choice([2.0, 8.0]), low_freq_factor=1.0,
                high_freq_factor=4.0, original_max_position_embeddings=rng.choice([8, 32])))
        draw_head_and_adapters(rng, c)
        configs.append(c)
    return configs


def hf_config(c):
    d = c.get("d", c["c"] // c["h"])
    if c["type"] == "gemma3_text":
        pattern = c.get("pattern", 6)
        return {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
            "vocab_size": c["v"], "hidden_size": c["c"], "intermediate_size": c["f"],
            "num_hidden_layers": c["l"], "num_attention_heads": c["h"],
            "num_key_value_heads": c["kv"], "head_dim": d,
            "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 256,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": c.get("scaling"), "query_pre_attn_scalar": c["qpas"],
            "sliding_window": c["window"],
            "layer_types": ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                            for i in range(c["l"])],
            "attn_logit_softcapping": c.get("acap"), "final_logit_softcapping": c.get("fcap"),
            "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
            "initializer_range": 0.02, "torch_dtype": "float32", "bos_token_id": 2,
            "eos_token_id": 1, "pad_token_id": 0, "use_cache": True,
            "cache_implementation": "hybrid", "transformers_version": "4.53.0"}
    config = {
        "architectures": ["LlamaForCausalLM" if c["type"] == "llama" else "Qwen2ForCausalLM"],
        "model_type": c["type"], "vocab_size": c["v"], "hidden_size": c["c"],
        "intermediate_size": c["f"], "num_hidden_layers": c["l"],
        "num_attention_heads": c["h"], "num_key_value_heads": c["kv"], "head_dim": d,
        "hidden_act": c.get("act", "silu"), "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "rope_theta": c.get("theta", 10000.0),
        "rope_scaling": c.get("scaling"), "tie_word_embeddings": bool(c.get("tie")),
        "initializer_range": 0.02, "attention_dropout": 0.0, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2, "use_cache": True,
        "transformers_version": "4.46.0"}
    if "pad" in c:
        config["pad_token_id"] = c["pad"]
    if c["type"] == "llama":
        config.update(attention_bias=bool(c.get("bias")), mlp_bias=bool(c.get("mlp")),
                      pretraining_tp=1)
    else:
        config.update(use_sliding_window="window" in c, sliding_window=c.get("window", 4096),
                      max_window_layers=c.get("mwl", 28))
        if "types" in c:
            config["layer_types"] = c["types"]
    return config


def inverse_frequencies(config, local=False):
    """Hugging Face's default rotary frequencies, and Llama 3's or linear scaling of them; a
    Gemma 3 local layer's from its own base, unscaled."""
    d = config["head_dim"]
    base = config["rope_local_base_freq"] if local else config["rope_theta"]
    inv = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = config["rope_scaling"]
    if not s or local:
        return inv
    if s["rope_type"] == "linear":
        return inv / s["factor"]
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / s["low_freq_factor"], old / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s["factor"], inv)
    smooth = (old / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rms_norm(x, w, eps, gemma=False):
    return (1 + w if gemma else w) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def adapter_masks(c, config):
    """{(layer, Linear): (B, T, in) mask} of a training forward from Rng(1): each layer draws a
    seed, its Linear j (q, k, v, o, gate, up, down) hashes mix_seed(seed, 16 + j)."""
    rng, masks = SeqforgeRng(1), {}
    H, D = config["num_attention_heads"], config["head_dim"]
    widths = {"o_proj": H * D, "down_proj": c["f"]}
    for i in range(c["l"]):
        seed = rng.next()
        for j, target in enumerate(LINEARS):
            if target in c["targets"]:
                width = widths.get(target, c["c"])
                mask = dropout_mask(mix_seed(seed, 16 + j), c["drop"], c["b"] * c["t"], width)
                masks[(i, target)] = mask.view(c["b"], c["t"], width)
    return masks


def forward(config, p, ids, adapter=None, lens=None, order=None, masks=None, offset=0,
            flash=False):
    """Logits (B*T, V) of the reference decoder from parameters `p` (HF's names); with
    `adapter` (kind, scale) PEFT's LoRA or DoRA on the Linears whose A and B `p` holds as
    base_model.model.<name>.lora_A.weight ...; with `score.weight` in `p`, HF's sequence
    classification logits (B, K) on each row's last token (lens) that is not config's
    pad_token_id (transformers' rule; the row's first where every one is). With `order` (a generator),
    every Linear sums its inputs in a random order: the same function, rounded otherwise. With
    `masks` (adapter_masks) the adapters read the dropped input x' = x * mask, as PEFT's
    lora_dropout: LoRA adds s x' A^T B^T; DoRA keeps the base on x and adds
    (m / ||V|| - 1) x' W0^T + (m / ||V||) s x' A^T B^T. The positions start at `offset`. With `flash`, attention is
    differentiated as flash attention does (softmax_pv)."""
    B, T = ids.shape
    H, KV, D = (config["num_attention_heads"], config["num_key_value_heads"],
                config["head_dim"])
    eps = config["rms_norm_eps"]
    gemma = config["model_type"] == "gemma3_text"
    act = F.silu if config.get("hidden_act") == "silu" else (
        lambda x: F.gelu(x, approximate="tanh"))
    dtype = p["model.norm.weight"].dtype

    def tables(local):
        freqs = (offset + torch.arange(T, dtype=torch.float64))[:, None] * \
            inverse_frequencies(config, local)[None]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    rope = {False: tables(False), True: tables(True) if gemma else None}
    scale = config["query_pre_attn_scalar"] ** -0.5 if gemma else 1 / math.sqrt(D)

    def linear(x, w, b=None):
        if order is None:
            return F.linear(x, w, b)
        perm = torch.randperm(w.shape[1], generator=order)
        return F.linear(x[..., perm], w[:, perm], b)

    def lin(x, name):
        b = p.get(name + ".bias")
        w = p[name + ".weight"]
        key = "base_model.model." + name
        if key + ".lora_A.weight" not in p:
            return linear(x, w, b)
        kind, scale = adapter
        A, Bm = p[key + ".lora_A.weight"], p[key + ".lora_B.weight"]
        parts = name.split(".")
        mask = masks.get((int(parts[2]), parts[-1])) if masks else None
        if kind == "lora":
            xd = x if mask is None else x * mask.to(x.dtype)
            return linear(x, w, b) + scale * linear(linear(xd, A), Bm)
        v = w + scale * Bm @ A  # DoRA: the norm is a constant in backward, as in PEFT
        m = p[key + ".lora_magnitude_vector"]
        mag = m / v.norm(dim=1).detach()
        if mask is None:
            y = mag * linear(x, v)
            return y if b is None else y + b
        xd = x * mask.to(x.dtype)
        return linear(x, w, b) + (mag - 1) * linear(xd, w) + mag * scale * linear(linear(xd, A), Bm)

    x = p["model.embed_tokens.weight"][ids]
    if gemma:  # the embedding scale, rounded to the weights' dtype as HF rounds it
        x = x * torch.tensor(config["hidden_size"] ** 0.5, dtype=dtype)
    causal = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)
    # HF's sliding window on local layers: key j is seen by query i when i - window < j <= i.
    window = config.get("sliding_window")
    local_mask = causal.clone() if not window else causal.masked_fill(
        torch.ones(T, T, dtype=torch.bool).tril(-window), float("-inf"))
    layer_types = config.get("layer_types") or [
        "sliding_attention" if config.get("use_sliding_window") and i >= config["max_window_layers"]
        else "full_attention" for i in range(config["num_hidden_layers"])]
    for i in range(config["num_hidden_layers"]):
        pre = f"model.layers.{i}"
        local = layer_types[i] == "sliding_attention"
        cos, sin = rope[gemma and local]  # Gemma 3's local layers rotate by their own base
        h = rms_norm(x, p[pre + ".input_layernorm.weight"], eps, gemma)
        q = lin(h, pre + ".self_attn.q_proj").view(B, T, H, D).transpose(1, 2)
        k = lin(h, pre + ".self_attn.k_proj").view(B, T, KV, D).transpose(1, 2)
        v = lin(h, pre + ".self_attn.v_proj").view(B, T, KV, D).transpose(1, 2)
        if gemma:
            q = rms_norm(q, p[pre + ".self_attn.q_norm.weight"], eps, True)
            k = rms_norm(k, p[pre + ".self_attn.k_norm.weight"], eps, True)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)  # HF's repeat_kv
        v = v.repeat_interleave(H // KV, dim=1)
        scores = q @ k.transpose(-1, -2) * scale
        cap = config.get("attn_logit_softcapping")
        if cap:
            scores = cap * torch.tanh(scores / cap)
        scores = scores + (local_mask if local else causal)
        att = softmax_pv(scores, v, flash).transpose(1, 2).reshape(B, T, H * D)
        o = lin(att, pre + ".self_attn.o_proj")
        if gemma:
            o = rms_norm(o, p[pre + ".post_attention_layernorm.weight"], eps, True)
        x = x + o
        norm = ".pre_feedforward_layernorm.weight" if gemma else ".post_attention_layernorm.weight"
        h = rms_norm(x, p[pre + norm], eps, gemma)
        m = lin(act(lin(h, pre + ".mlp.gate_proj")) * lin(h, pre + ".mlp.up_proj"),
                pre + ".mlp.down_proj")
        if gemma:
            m = rms_norm(m, p[pre + ".post_feedforward_layernorm.weight"], eps, True)
        x = x + m
    x = rms_norm(x, p["model.norm.weight"], eps, gemma)
    if "score.weight" in p:
        last = [n - 1 for n in lens]
        pad = config.get("pad_token_id")
        for b in range(B):
            while pad is not None and last[b] > 0 and ids[b, last[b]] == pad:
                last[b] -= 1
        rows = x[torch.arange(B), torch.tensor(last)]
        return rows @ p["score.weight"].t()
    head = p["model.embed_tokens.weight" if config["tie_word_embeddings"] else "lm_head.weight"]
    logits = (x @ head.t()).reshape(B * T, -1)
    cap = config.get("final_logit_softcapping")  # Gemma's, on the language-model head only
    return logits if not cap else cap * torch.tanh(logits / cap)


def parameters(config, rng):
    """HF's parameters in their order, drawn as HF initialises them, then norms and biases
    perturbed so that every tensor matters."""
    C, Fw, V = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    H, KV, D = (config["num_attention_heads"], config["num_key_value_heads"],
                config["head_dim"])
    qwen = config["model_type"] == "qwen2"
    gemma = config["model_type"] == "gemma3_text"
    qkv_bias = qwen or config.get("attention_bias", False)
    o_bias = not qwen and config.get("attention_bias", False)
    mlp_bias = config.get("mlp_bias", False)
    shapes = [("model.embed_tokens.weight", (V, C))]
    for i in range(config["num_hidden_layers"]):
        pre = f"model.layers.{i}"
        shapes.append((pre + ".input_layernorm.weight", (C,)))
        if gemma:
            shapes += [(pre + ".self_attn.q_norm.weight", (D,)),
                       (pre + ".self_attn.k_norm.weight", (D,)),
                       (pre + ".pre_feedforward_layernorm.weight", (C,)),
                       (pre + ".post_feedforward_layernorm.weight", (C,))]
        for name, out, inp, bias in (("q_proj", H * D, C, qkv_bias), ("k_proj", KV * D, C, qkv_bias),
                                     ("v_proj", KV * D, C, qkv_bias), ("o_proj", C, H * D, o_bias)):
            shapes.append((f"{pre}.self_attn.{name}.weight", (out, inp)))
            if bias:
                shapes.append((f"{pre}.self_attn.{name}.bias", (out,)))
        shapes.append((pre + ".post_attention_layernorm.weight", (C,)))
        for name, out, inp in (("gate_proj", Fw, C), ("up_proj", Fw, C), ("down_proj", C, Fw)):
            shapes.append((f"{pre}.mlp.{name}.weight", (out, inp)))
            if mlp_bias:
                shapes.append((f"{pre}.mlp.{name}.bias", (out,)))
    shapes.append(("model.norm.weight", (C,)))
    if not config["tie_word_embeddings"]:
        shapes.append(("lm_head.weight", (V, C)))
    p = {}
    for name, shape in shapes:
        if name.endswith("norm.weight"):  # Gemma scales by 1 + w
            t = (0 if gemma else 1) + 0.3 * torch.randn(shape, generator=rng, dtype=torch.float64)
        elif name.endswith(".bias"):
            t = 0.1 * torch.randn(shape, generator=rng, dtype=torch.float64)
        else:  # wider than HF's 0.02 so that a few layers of a tiny model still move the logits
            t = 0.2 * torch.randn(shape, generator=rng, dtype=torch.float64)
        p[name] = t
    return p


def adapter_parameters(c, config, p, rng):
    """Adds the adapters' parameters (PEFT's names; B and the magnitudes away from their start so
    that they count) and a classifier's score head to `p`; returns their names."""
    names = []
    if c.get("k"):
        p["score.weight"] = f32(0.2 * torch.randn(c["k"], config["hidden_size"], generator=rng))
        names.append("score.weight")
    if not c.get("adapter"):
        return names
    r, scale = c["r"], c["a"] / c["r"]
    for i in range(config["num_hidden_layers"]):
        for t in c["targets"]:
            module = "self_attn" if t in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            name = f"model.layers.{i}.{module}.{t}"
            w = p[name + ".weight"]
            out, inp = w.shape
            key = "base_model.model." + name
            a = f32((torch.rand(r, inp, generator=rng) * 2 - 1) / math.sqrt(inp))
            b = f32(0.1 * torch.randn(out, r, generator=rng))
            p[key + ".lora_A.weight"], p[key + ".lora_B.weight"] = a, b
            names += [key + ".lora_A.weight", key + ".lora_B.weight"]
            if c["adapter"] == "dora":
                norms = (w + scale * b @ a).norm(dim=1)
                p[key + ".lora_magnitude_vector"] = f32(
                    norms * (1 + 0.2 * torch.randn(out, generator=rng, dtype=torch.float64)))
                names.append(key + ".lora_magnitude_vector")
    return names


def f32(t):
    return t.double().float().double()


def representable(t, dtype):
    return t.to(torch.bfloat16 if dtype == "BF16" else torch.float32).double()


def tensor_bytes(t, dtype):
    if dtype == "BF16":  # the top half of each float32
        raw = t.float().contiguous().numpy().tobytes()
        return b"".join(raw[i + 2:i + 4] for i in range(0, len(raw), 4))
    return t.to({"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}[dtype]) \
        .contiguous().numpy().tobytes()


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (tensor, dtype) with dtype F32, BF16, F64 or I64."""
    header, blobs, offset = {}, [], 0
    for name, (t, dtype) in tensors.items():
        raw = tensor_bytes(t, dtype)
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def write_folder(folder, config, p, shards, dtype):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    names = list(p)
    if shards <= 1:
        write_safetensors(os.path.join(folder, "model.safetensors"),
                          {n: (p[n], dtype) for n in names}, {"format": "pt"})
        return
    weight_map = {}
    per = -(-len(names) // shards)
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s * per:(s + 1) * per]
        write_safetensors(os.path.join(folder, file), {n: (p[n], dtype) for n in part},
                          {"format": "pt"})
        weight_map.update({n: file for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)


def name_of(c):
    parts = [c["type"].replace("_text", ""), f"v{c['v']}", f"c{c['c']}", f"f{c['f']}", f"l{c['l']}", f"h{c['h']}",
             f"kv{c['kv']}", f"d{c.get('d', c['c'] // c['h'])}", f"t{c['t']}", f"b{c['b']}"]
    for flag in ("tie", "bias", "mlp"):
        if c.get(flag):
            parts.append(flag)
    if c.get("scaling"):
        parts.append(c["scaling"]["rope_type"] + "rope")
    if c.get("act"):
        parts.append("gelu")
    if c.get("shards"):
        parts.append(f"shards{c['shards']}")
    if c.get("dtype"):
        parts.append(c["dtype"].lower())
    if c.get("adapter"):
        parts.append(f"{c['adapter']}{c['r']}_" + "_".join(t[:-5] for t in c["targets"]))
    if c.get("drop"):
        parts.append(f"drop{c['drop']:g}")
    if c.get("k"):
        parts.append(f"classify{c['k']}")
    if "pad" in c:
        parts.append(f"pad{c['pad']}")
    if c.get("acap"):
        parts.append(f"softcap{c['acap']:g}_{c['fcap']:g}")
    if c["type"] == "qwen2" and c.get("window"):
        parts.append(f"window{c['window']}" + ("_types" if "types" in c else f"_from{c['mwl']}"))
    return "_".join(parts)


def main():
    out, configs = out_dir_and_configs(CONFIGS, random_configs)
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(1)  # PyTorch's float32 yardsticks the same on every machine
    names = []
    for index, c in enumerate(configs):
        name = name_of(c)
        config = hf_config(c)
        rng = torch.Generator().manual_seed(1000 + index)
        dtype = c.get("dtype", "F32")
        p = {n: representable(t, dtype) for n, t in parameters(config, rng).items()}
        if c.get("k"):  # HF's classifier has no LM head
            p.pop("lm_head.weight", None)
        base = list(p)
        fresh = adapter_parameters(c, config, p, rng)
        B, T, V = c["b"], c["t"], c["v"]
        ids = torch.randint(0, V, (B, T), generator=rng)
        if "pad" in c:  # each row ends in the pad id, the first in two of them
            for b, n in enumerate(c["lens"]):
                ids[b, n - 1] = c["pad"]
            ids[0, c["lens"][0] - 2] = c["pad"]
        k = c.get("k", 0)
        targets = torch.randint(0, k if k else V, (B if k else B * T,), generator=rng)
        trained = fresh if c.get("adapter") else list(p)
        for n in trained:
            p[n].requires_grad_(True)
        adapter = (c["adapter"], c["a"] / c["r"]) if c.get("adapter") else None
        lens = c.get("lens", [T] * B)
        masks = adapter_masks(c, config) if c.get("drop") else None
        logits = forward(config, p, ids, adapter, lens, masks=masks)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        # PyTorch's own float32 error on the same weights, under the parity metric: the worst of
        # its run, of four runs whose Linears sum in other orders and of two whose attention is
        # differentiated as flash attention does. A small random model can be ill-conditioned (a
        # q/k norm over a projection whose terms nearly cancel), and one float32 run is then one
        # draw from a wide spread of roundings.
        # A gradient that is zero in exact arithmetic (q and k of one-token rows) is measured as
        # the parity test measures it: its noise against the largest gradient.
        scale = max(p[n].grad.abs().max().item() for n in trained)

        def grad_error(got, want):
            if want.abs().max().item() <= 1e-12 * scale:
                return got.double().abs().max().item() / scale
            return max_rel_error(got, want)

        torch_f32 = 0.0
        for order, flash in float32_runs():
            p32 = {n: t.detach().float().requires_grad_(n in trained) for n, t in p.items()}
            logits32 = forward(config, p32, ids, adapter, lens, order, masks, flash=flash)
            F.cross_entropy(logits32, targets).backward()
            torch_f32 = max([torch_f32, max_rel_error(logits32.detach(), logits.detach())] +
                            [grad_error(p32[n].grad, p[n].grad) for n in trained])
        folder = os.path.join(out, name)
        write_folder(folder, config, {n: p[n].detach() for n in base}, c.get("shards", 1), dtype)
        if fresh:
            write_safetensors(os.path.join(folder, "adapter.safetensors"),
                              {n: (p[n].detach(), "F32") for n in fresh})
        expected = {"ids": (ids, "I64"), "targets": (targets, "I64"),
                    "logits": (logits.detach(), "F64"), "loss": (loss.detach().reshape(1), "F64"),
                    "lengths": (torch.tensor(lens), "I64")}
        for n in trained:
            expected["grad." + n] = (p[n].grad, "F64")
        if k and min(lens) < T and not masks:
            # HF's scores of the batch padded on the left (tokenizer_config.json's padding_side
            # "left"): pads first, masked as keys, so a row's tokens sit at positions T - len ...
            # T - 1; each row on its own is that.
            with torch.no_grad():
                left = [forward(config, p, ids[b:b + 1, :lens[b]], adapter, [lens[b]],
                                offset=T - lens[b]) for b in range(B)]
            expected["logits_left"] = (torch.cat(left), "F64")
        fixture = {key: c[key] for key in ("adapter", "r", "a", "targets", "k", "drop") if key in c}
        write_safetensors(os.path.join(folder, "expected.safetensors"), expected,
                          {"torch_f32": repr(torch_f32), "fixture": json.dumps(fixture)})
        names.append(name)
    with open(os.path.join(out, "decoder_index.txt"), "w") as f:
        f.write("\n".join(names) + "\n")
    print(f"wrote {len(names)} decoder fixtures to {out}")


if __name__ == "__main__":
    main()
