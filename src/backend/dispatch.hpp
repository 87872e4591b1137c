#pragma once
// Shared by the host backends: dtype dispatch, and a reduction's value stored in their memory.
#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/tensor.hpp"

namespace seqforge {

// Calls fn.template operator()<T>() for the float dtype `dtype` (f32 or f64).
template <typename Fn>
decltype(auto) dispatch_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::f32:
      return fn.template operator()<float>();
    case DType::f64:
      return fn.template operator()<double>();
    default:
      fail("unsupported dtype ", dtype_name(dtype), " (expected f32 or f64)");
  }
}

// `value` into `out`, one f64 of host-addressable memory (a loss, a sum of squares).
inline void store_scalar(Tensor out, double value) {
  SF_CHECK(out.dtype() == DType::f64 && out.numel() == 1, "a scalar result goes to one f64, got ",
           dtype_name(out.dtype()), " ", out.shape().str());
  *static_cast<double*>(out.data()) = value;
}

}  // namespace seqforge
