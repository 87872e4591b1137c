#pragma once
// The decoder's parts that its two sources share: decoder.cpp runs the layers (forward,
// backward, the heads); decoder_linears.cpp runs the layers' Linears with their LoRA/DoRA
// adapters.
#include <string>

#include "seqforge/backend/buffer.hpp"
#include "seqforge/nn/decoder.hpp"

namespace seqforge {

// One of a layer's Linears (y = x W^T + b) by its HF name, with its adapter when it has one.
struct Decoder::Proj {
  std::string name;  // "model.layers.0.self_attn.q_proj"
  int64_t in = 0, out = 0;
  size_t w = kNone, b = kNone;
  size_t A = kNone, B = kNone, m = kNone;  // adapter: A (rank, in), B (out, rank); DoRA: m (out)
  Buffer v, scale, inv_norm;  // DoRA, per step: V = W0 + s B A (out, in), m / ||V||, 1 / ||V||
  Buffer w_low;               // bf16 GEMMs: W0, or DoRA's V, in bf16 (out, in)
  Buffer base_low;            // bf16 GEMMs, DoRA with adapter dropout: W0 in bf16 (out, in)
  uint64_t seed = 0;          // adapter dropout: the mask's seed of this forward
  // In the layer's activations (Acts), bound by the layer's forward:
  Buffer* xa = nullptr;       // adapter: in A^T (N, rank) of the last forward
  Buffer* pre = nullptr;      // DoRA: in V^T (N, out) of the last forward
  Buffer* xd = nullptr;       // adapter dropout: in = x * mask (N, in), the adapter's input
  Buffer* xd_mask = nullptr;  // adapter dropout: the mask (N, in), 0 or 1 / (1 - p)
};

// What a layer's backward needs of its forward, N = batch * seq rows; C hidden, H query heads and
// KV key/value heads of D, F the MLP's width, W = (H + 2 KV) D. Each layer has its own set, or,
// with activation checkpointing, all layers share one that backward refills layer by layer.
struct Decoder::Acts {
  Buffer h1, saved1;        // (N, C) input_layernorm's output, (N) its 1 / rms
  Buffer qkv;               // (N, W) q, k (rotated) and v of every head
  Buffer att, lse;          // (N, H D) the heads side by side, (B, H, T)
  Buffer mid;               // (N, C) the stream after the attention branch
  Buffer h2, saved2;        // (N, C), (N) post_attention_layernorm's
  Buffer gate_out, up_out;  // (N, F) before the product
  Buffer act;               // (N, F) act(gate) * up
  // Gemma 3: q and k before their norms (N, H D), (N, KV D), the norms' 1 / rms (N H), (N KV);
  // o_proj's and down_proj's outputs before their norms (N, C) and those norms' (N).
  Buffer q_raw, k_raw, q_saved, k_saved, o_out, o_saved, mlp_out, mlp_saved;
  // bf16 GEMMs: the Linears' inputs h1, att, h2 and act as bf16 operands, kept for backward.
  Buffer h1_low, att_low, h2_low, act_low;
  // The seven Linears' adapter activations (Proj::xa, Proj::pre, Proj::xd, Proj::xd_mask).
  Buffer xa[7], pre[7], xd[7], xd_mask[7];
};

// A layer's parameters, its output and its activations.
struct Decoder::Layer {
  size_t ln1 = kNone, ln2 = kNone;  // the norms before attention and before the MLP
  // Gemma 3: q and k normed per head (head_dim), each branch normed before it joins the stream.
  size_t q_norm = kNone, k_norm = kNone, post_attn = kNone, post_mlp = kNone;
  bool local = false;  // Gemma 3's local layer: its own rotary base and sliding window
  Proj q, k, v, o, gate, up, down;
  Buffer out;                   // (N, C) the next layer's input, kept either way
  Acts* a = nullptr;            // its activations, bound by its forward
  Proj* projs() { return &q; }  // the seven, in declaration order
  void bind(Acts& acts) {
    a = &acts;
    for (int i = 0; i < 7; ++i) {
      Proj& p = projs()[i];
      p.xa = &acts.xa[i], p.pre = &acts.pre[i], p.xd = &acts.xd[i], p.xd_mask = &acts.xd_mask[i];
    }
  }
};

struct Decoder::Scratch {
  Buffer dact, dgate, dup;   // (N, F)
  Buffer dh, dnorm, dmid;    // (N, C)
  Buffer datt;               // (N, H D)
  Buffer dqkv;               // (N, W)
  Buffer ones;               // (N) for the bias gradients of column slices
  Buffer dx[2];              // (N, C) the gradient flowing down
  Buffer dpre, g;            // adapters: (N, out) DoRA's gradient at x V^T, (N, rank)
  Buffer dscale[2];          // DoRA in the gated activation: (F) gate's and up's scale gradients
  Buffer dnorm_w;            // (C) a frozen norm's gradient, discarded
  Buffer dhead_w;            // (D) a frozen q or k norm's gradient, discarded
  Buffer dbranch_out;        // Gemma 3: (N, C) at a branch's output before its norm
  Buffer dq_normed, dq_raw;  // Gemma 3: (N, H D) at q after and before its norm (k: the same)
  Buffer dpooled;            // (B, C) a classifier's gradient at its rows
  Buffer d_low, d_packed;    // bf16 GEMMs: a Linear's output gradient in bf16, packed first
  Buffer rest, rest_low;     // adapter dropout, DoRA: (N, in) x - in, and its bf16 operand
  Buffer own, own2;          // adapter dropout: (N, in) a Linear's own input gradient parts
};

}  // namespace seqforge
