#pragma once
// The decoders' RMS norm and gated activations, and the cross-entropy of a row of logits, in f32
// SIMD dispatched at run time (kernels/decoder_ops.hpp and the reference backend's
// cross-entropy: the scalar forms and the argument conventions).
#include <cstdint>

#include "seqforge/backend/ops.hpp"

namespace seqforge::simd {

void glu_forward(float* y, const float* gate, const float* up, GluKind kind, int64_t i0,
                 int64_t i1);
void glu_backward(float* dgate, float* dup, const float* dy, const float* gate, const float* up,
                  GluKind kind, int64_t i0, int64_t i1);
void rms_norm_forward(float* y, float* saved, const float* x, const float* w, float offset,
                      int64_t C, float eps, int64_t r0, int64_t r1);
void rms_norm_backward_input(float* dx, const float* dy, const float* x, const float* w,
                             float offset, const float* saved, int64_t C, int64_t r0, int64_t r1);
void rms_norm_backward_params(float* dw, const float* dy, const float* x, const float* saved,
                              int64_t rows, int64_t C, int64_t c0, int64_t c1);
// One row x (C) of logits against class y: d = coef (softmax(x) - onehot(y)); returns the row's
// log-sum-exp minus x[y].
double cross_entropy_row(float* d, const float* x, int64_t C, int64_t y, float coef);

}  // namespace seqforge::simd
