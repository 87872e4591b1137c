#pragma once
// The recurrent cells' kernels, found by CellKind (the registration is in cells.cpp). Each cell
// has reference kernels (kernels/cells/<cell>.hpp, f32 and f64) and f32 SIMD kernels
// (kernels/cpu/<cell>_simd.cpp), over batch rows [r0, r1).
#include <cstdint>

#include "seqforge/backend/ops.hpp"

namespace seqforge {

struct CellKernels {
  using Forward = void (*)(const CellForward&, int64_t r0, int64_t r1);
  using Backward = void (*)(const CellBackward&, int64_t r0, int64_t r1);
  // The bias gradient's column sums go into `dbias` when not null (p.dbias is ignored), so that
  // threads can sum apart.
  using SimdBackward = void (*)(const CellBackward&, int64_t r0, int64_t r1, float* dbias);
  Forward forward_f32, forward_f64;
  Backward backward_f32, backward_f64;
  Forward simd_forward;
  SimdBackward simd_backward;
};
const CellKernels& cell_kernels(CellKind kind);

namespace simd {
void lstm_cell_forward(const CellForward& p, int64_t r0, int64_t r1);
void lstm_cell_backward(const CellBackward& p, int64_t r0, int64_t r1, float* dbias);
void gru_cell_forward(const CellForward& p, int64_t r0, int64_t r1);
void gru_cell_backward(const CellBackward& p, int64_t r0, int64_t r1, float* dbias);
void lnlstm_cell_forward(const CellForward& p, int64_t r0, int64_t r1);
void lnlstm_cell_backward(const CellBackward& p, int64_t r0, int64_t r1, float* dbias);
}  // namespace simd

}  // namespace seqforge
