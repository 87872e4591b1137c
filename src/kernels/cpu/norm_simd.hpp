#pragma once
// Layer norm and GELU in f32 SIMD, dispatched at run time (kernels/norm.hpp: the reference and
// the argument conventions).
#include <cstdint>

namespace seqforge::simd {

void gelu_forward(float* y, const float* x, int64_t i0, int64_t i1);
void gelu_backward(float* dx, const float* dy, const float* x, int64_t i0, int64_t i1);
void layer_norm_forward(float* y, float* saved, const float* x, const float* w, const float* b,
                        int64_t C, float eps, int64_t r0, int64_t r1);
void layer_norm_backward_input(float* dx, const float* residual, const float* dy, const float* x,
                               const float* w, const float* saved, int64_t C, int64_t r0,
                               int64_t r1);
void layer_norm_backward_params(float* dw, float* db, const float* dy, const float* x,
                                const float* saved, int64_t rows, int64_t C, int64_t c0,
                                int64_t c1);

}  // namespace seqforge::simd
