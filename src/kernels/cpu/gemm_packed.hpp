#pragma once
// f32 GEMMs on a B packed once for many GEMMs (the recurrent weights, at every time step): op(B)
// (k, n) rearranged into panels of gemm_panel_width() columns, each panel k rows of that width,
// zero-padded, so that the micro-kernel reads B as one sequential stream (see gemm_packed.cpp).
#include <cstdint>

#include "seqforge/backend/ops.hpp"

namespace seqforge::simd {

// Columns per panel on this CPU's dispatch target (two vectors).
int64_t gemm_panel_width();

// Whether gemm_panels takes the shape: A plain (not transposed).
inline bool gemm_panels_fit(const GemmShape& s) { return !s.trans_a && s.m > 0 && s.n > 0; }

// Panels of op(B) (k, n) for s (B is (k, n) rows ldb apart, or (n, k) with trans_b): floats
// needed, and the packing, panels of `width` columns.
int64_t gemm_panels_floats(const GemmShape& s, int64_t width);
void pack_gemm_panels(const GemmShape& s, const float* b, int64_t width, float* panels);

// C (m, columns of panels [j0, j1)) = alpha A (m, k) op(B) + beta C (+ bias over rows), on the
// panels pack_gemm_panels wrote with this target's width.
void gemm_panels(const GemmShape& s, const float* a, const float* panels, int64_t j0, int64_t j1,
                 float* c, const float* bias);

}  // namespace seqforge::simd
