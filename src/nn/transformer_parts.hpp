#pragma once
// The transformer's parts that its two sources share: transformer.cpp runs the blocks (forward,
// backward, decoding, the heads); transformer_linears.cpp runs the blocks' Linears, their
// LoRA/DoRA adapters included, and readies their weights for each step.
#include "seqforge/backend/buffer.hpp"
#include "seqforge/nn/transformer.hpp"

namespace seqforge {

// One of a block's Linears (y = x W^T + b), with its adapter when it has one.
struct Transformer::Proj {
  int64_t in = 0, out = 0;
  size_t w = 0, b = kNone;      // W0 (out, in), b (out) unless the model has no biases
  size_t A = kNone, B = kNone;  // adapter: A (rank, in), B (out, rank)
  size_t m = kNone;             // DoRA: magnitudes (out)
  Buffer v, scale, inv_norm;    // DoRA: V = W0 + s B A (out, in) (f32 GEMMs), m / ||V||,
                                // 1 / ||V|| (out)
  Buffer low;                   // bf16 copy of the weight the GEMMs use (W0, or V)
  Buffer base_low;              // DoRA with dropout: bf16 copy of W0 (out, in) when it is f32
  Buffer a_low;                 // bf16 copy of A (rank, in)
  static constexpr size_t kNone = SIZE_MAX;
};

// A block's parameters and its output.
struct Transformer::Block {
  size_t ln1_w = kNone, ln1_b = kNone, ln2_w = kNone, ln2_b = kNone;
  Proj p[4];          // attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
  Buffer out;         // (N, C) the next block's input
  uint64_t seed = 0;  // its dropout masks in the last forward
};

// What a block's backward needs of its forward: one per block, or one for all when activations
// are recomputed in backward.
struct Transformer::Acts {
  Buffer ln1, ln1_saved;                       // (N, C), (N, 2) mean and 1/std
  Buffer qkv;                                  // (N, 3C) q, k, v of every head
  Buffer att, lse;                             // (N, C) heads side by side, (B, H, T)
  Buffer mid;                                  // (N, C) x + attention branch
  Buffer ln2, ln2_saved;                       // (N, C), (N, 2)
  Buffer fc, gelu;                             // (N, 4C) before and after GELU
  Buffer mask1, mask2;                         // (N, C) dropout masks of the two branches
  Buffer ln1_low, att_low, ln2_low, gelu_low;  // bf16 GEMM operands (N, C), (N, C), (N, C), (N, 4C)
  // Per Linear with an adapter: x A^T (N, rank); DoRA: x V^T before scaling (N, out); LoRA with
  // dropout: the adapter's dropped input and its mask (N, in).
  Buffer xa[4], pre[4], xd[4], xd_mask[4];
};

// One block's scratch at a time, forward and backward.
struct Transformer::Scratch {
  Buffer ln, gelu;  // bf16 GEMMs: (N, C) a LayerNorm's output, (N, 4C) GELU's, before their bf16
                    // copies (which backward reads instead)
  Buffer branch;    // (N, C) a residual branch before it joins the stream
  Buffer dc1, dc2;  // (N, C)
  Buffer dmid;      // (N, C) gradient at x + attention branch
  Buffer d4;        // (N, 4C) d GELU output, then d fc
  Buffer dscale;    // (4C) DoRA in GELU: the first MLP Linear's scale gradient
  Buffer dqkv;      // (N, 3C)
  Buffer d_low;     // bf16 copy of the gradient a GEMM reads, up to (N, 4C)
  Buffer dx[2];     // (N, C) the gradient flowing down, block by block
  Buffer g, g_low;  // adapters: (N, rank) the gradient at x A^T, and its bf16 copy
  Buffer dp;        // adapters: (N, out) DoRA's gradient at x V^T
  Buffer t;         // adapters: (N, in) a with-dropout term of dx
  Buffer rest, rest_low;    // DoRA with dropout: (N, in) x minus the adapter's dropped input, and
                            // its bf16 copy
  Buffer dnorm_w, dnorm_b;  // (C) LayerNorm gradients of a frozen base (or of no bias), discarded
  Buffer zero_bias;         // (C) the LayerNorms' bias in a model without biases
  Buffer dz;                // (N, C) at ln_f's output
  Buffer v;                 // (out, in) DoRA's V before its bf16 copy, with bf16 GEMMs
  Buffer x0_mask;           // (N, C) embedding dropout
};

namespace nn {

// y(N, out) = x(N, in) W(out, in)^T (+ b when given, + beta y); in w_low's half type (bf16 or
// f16) on copies of x (made here into x_low, unless x is in it already: then x_low's tensor
// itself) and of W (w_low, made once per step) when w_low is given.
void linear_forward(Backend& be, Tensor y, Tensor x, Buffer& x_low, Tensor w, Tensor w_low,
                    Tensor b, double beta = 0.0);

}  // namespace nn
}  // namespace seqforge
