#pragma once
// Layer norm and GELU in f32 SIMD, dispatched at run time (kernels/norm.hpp: the reference and
// the argument conventions).
#include <cstdint>

namespace seqforge::simd {

// Rows [r0, r1) of GELU over x (rows of C) mapped per column (scale, bias null: left out); the
// backward's sums (C), where given, gain the scale's gradient (kernels/norm.hpp).
void gelu_forward(float* y, const float* x, const float* scale, const float* bias, int64_t C,
                  int64_t r0, int64_t r1);
void gelu_backward(float* dx, float* sums, const float* dy, const float* x, const float* scale,
                   const float* bias, int64_t C, int64_t r0, int64_t r1);
void layer_norm_forward(float* y, float* saved, const float* x, const float* w, const float* b,
                        int64_t C, float eps, int64_t r0, int64_t r1);
// Rows [r0, r1) of layer norm's backward: dx (+ residual where given) and these rows' sums added
// into dw, db; `block`: scratch of 2 C floats rounded up to whole vectors (layer_norm_block).
void layer_norm_backward(float* dx, float* dw, float* db, float* block, const float* residual,
                         const float* dy, const float* x, const float* w, const float* saved,
                         int64_t C, int64_t r0, int64_t r1);
// The floats of a norm's backward scratch for rows of C: a block of sums per parameter vector.
int64_t norm_block_floats(int64_t C);

}  // namespace seqforge::simd
