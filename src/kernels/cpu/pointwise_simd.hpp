#pragma once
// f32 SIMD pointwise kernels, dispatched at run time to the best instruction set available.
#include <cstdint>

#include "seqforge/backend/backend.hpp"

namespace seqforge::simd {

void lstm_cell_forward(const LstmCellForward& p, int64_t r0, int64_t r1);
// Column sums of the rows' dgates go into `dbias` (4H) when it is not null (p.dbias is ignored).
void lstm_cell_backward(const LstmCellBackward& p, int64_t r0, int64_t r1, float* dbias);
// acc(n) += column sums of dy rows [r0, r1).
void sum_rows(const float* dy, int64_t n, int64_t r0, int64_t r1, float* acc);
const char* target_name();  // "AVX3", "AVX2", ...

}  // namespace seqforge::simd
