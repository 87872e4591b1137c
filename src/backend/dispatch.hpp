#pragma once
// Calls fn.template operator()<T>() for the float dtype `dtype` (f32 or f64).
#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge {

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

}  // namespace seqforge
