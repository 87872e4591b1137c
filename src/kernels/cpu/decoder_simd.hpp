#pragma once
// The decoders' RMS norm and gated activations, and the cross-entropy of a row of logits, in f32
// SIMD dispatched at run time (kernels/decoder_ops.hpp and the reference backend's
// cross-entropy: the scalar forms and the argument conventions).
#include <cstdint>

#include "kernels/decoder_ops.hpp"
#include "seqforge/backend/ops.hpp"

namespace seqforge::simd {

// Rows [r0, r1) of a GLU over gate, up (R, C) with per-column input maps (kernels/decoder_ops.hpp:
// glu_forward, glu_backward; the column sums in f32, added into gate_sums, up_sums where given).
using GluMaps = kernels::GluMaps<float>;
void glu_forward(float* y, const float* gate, const float* up, const GluMaps& maps, GluKind kind,
                 int64_t C, int64_t r0, int64_t r1);
void glu_backward(float* dgate, float* dup, float* gate_sums, float* up_sums, const float* dy,
                  const float* gate, const float* up, const GluMaps& maps, GluKind kind, int64_t C,
                  int64_t r0, int64_t r1);
void rms_norm_forward(float* y, float* saved, const float* x, const float* w, float offset,
                      int64_t C, float eps, int64_t r0, int64_t r1);
// Rows [r0, r1) of RMS norm's backward: dx (+ residual where given) and these rows' sums added
// into dw; `block`: scratch of norm_block_floats(C) / 2 floats (norm_simd.hpp).
void rms_norm_backward(float* dx, float* dw, float* block, const float* residual, const float* dy,
                       const float* x, const float* w, float offset, const float* saved, int64_t C,
                       int64_t r0, int64_t r1);
// Rows [r0, r1) of rotary embeddings in place, f32 (kernels/decoder_ops.hpp: rotary).
void rotary(const Rotary& a, int64_t r0, int64_t r1);
// One row x (C) of logits against class y: d = coef (softmax(x) - onehot(y)); returns the row's
// log-sum-exp minus x[y].
double cross_entropy_row(float* d, const float* x, int64_t C, int64_t y, float coef);

}  // namespace seqforge::simd
