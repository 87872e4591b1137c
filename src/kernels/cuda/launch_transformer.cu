// The launchers (launch.hpp) of the transformer's kernels: norms, GELU, rotary embeddings, gated
// units, soft caps and attention.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/decoder.cuh"
#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch.hpp"
#include "kernels/cuda/norm.cuh"

namespace seqforge::cuda {

void layer_norm_forward(void* y, DType y_type, void* saved, const void* x, const void* w,
                        const void* b, DType dtype, int64_t rows, int64_t C, double eps,
                        cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    dispatch_output<T>(y_type, "layer_norm_forward", [&]<typename Y>() {
      SF_LAUNCH(blocks_for(rows * kThreads), kThreads, 0, stream, layer_norm_forward_kernel<T, Y>)
      (static_cast<Y*>(y), static_cast<T*>(saved), static_cast<const T*>(x),
       static_cast<const T*>(w), static_cast<const T*>(b), rows, C, eps);
    });
  });
}

int64_t layer_norm_partial_chunks(int64_t rows) {
  return std::clamp<int64_t>((rows + 63) / 64, 1, 256);
}

void layer_norm_backward(void* dx, void* dw, void* db, const void* residual, const void* dy,
                         const void* x, const void* w, const void* saved, double* partial,
                         DType dtype, int64_t rows, int64_t C, cudaStream_t stream) {
  if (rows == 0 || C == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows * kThreads), kThreads, 0, stream, layer_norm_backward_input_kernel<T>)
    (static_cast<T*>(dx), static_cast<const T*>(residual), static_cast<const T*>(dy),
     static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(saved), rows, C);
    const int64_t chunks = layer_norm_partial_chunks(rows);
    SF_LAUNCH(band_blocks(chunks, C), kThreads, 0, stream, layer_norm_params_partial_kernel<T>)
    (partial, static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(saved),
     rows, C, chunks);
    SF_LAUNCH(blocks_for(C), kThreads, 0, stream, layer_norm_params_final_kernel<T>)
    (static_cast<T*>(dw), static_cast<T*>(db), partial, C, chunks);
  });
}

void gelu_forward(void* y, DType y_type, const void* x, const void* scale, const void* bias,
                  DType dtype, int64_t n, int64_t C, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    dispatch_output<T>(y_type, "gelu_forward", [&]<typename Y>() {
      SF_LAUNCH(blocks_for(n), kThreads, 0, stream, gelu_forward_kernel<T, Y>)
      (static_cast<Y*>(y), static_cast<const T*>(x), static_cast<const T*>(scale),
       static_cast<const T*>(bias), n, C);
    });
  });
}

void gelu_backward(void* dx, void* dscale, const void* dy, const void* x, const void* scale,
                   const void* bias, double* partial, DType dtype, int64_t n, int64_t C,
                   cudaStream_t stream) {
  if (C == 0 || (n == 0 && !dscale)) return;
  dispatch_float(dtype, [&]<typename T>() {
    const T *s = static_cast<const T*>(scale), *b = static_cast<const T*>(bias);
    if (!dscale) {
      SF_LAUNCH(blocks_for(n), kThreads, 0, stream, gelu_backward_kernel<T>)
      (static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), s, b, n, C);
      return;
    }
    const int64_t rows = n / C, chunks = layer_norm_partial_chunks(rows);
    SF_LAUNCH(band_blocks(chunks, C), kThreads, 0, stream, gelu_backward_partial_kernel<T>)
    (partial, static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), s, b, rows,
     C, chunks);
    SF_LAUNCH(blocks_for(C), kThreads, 0, stream, column_sums_final_kernel<T>)
    (static_cast<T*>(dscale), partial, C, chunks, false);
  });
}

void rms_norm_forward(void* y, void* saved, const void* x, const void* w, double offset,
                      DType dtype, int64_t rows, int64_t C, double eps, cudaStream_t stream) {
  if (rows == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows * kThreads), kThreads, 0, stream, rms_norm_forward_kernel<T>)
    (static_cast<T*>(y), static_cast<T*>(saved), static_cast<const T*>(x), static_cast<const T*>(w),
     offset, rows, C, eps);
  });
}

void rms_norm_backward(void* dx, void* dw, const void* residual, const void* dy, const void* x,
                       const void* w, double offset, const void* saved, double* partial,
                       DType dtype, int64_t rows, int64_t C, cudaStream_t stream) {
  if (rows == 0 || C == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(rows * kThreads), kThreads, 0, stream, rms_norm_backward_input_kernel<T>)
    (static_cast<T*>(dx), static_cast<const T*>(residual), static_cast<const T*>(dy),
     static_cast<const T*>(x), static_cast<const T*>(w), offset, static_cast<const T*>(saved), rows,
     C);
    const int64_t chunks = layer_norm_partial_chunks(rows);
    SF_LAUNCH(band_blocks(chunks, C), kThreads, 0, stream, rms_norm_params_partial_kernel<T>)
    (partial, static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(saved),
     rows, C, chunks);
    SF_LAUNCH(blocks_for(C), kThreads, 0, stream, rms_norm_params_final_kernel<T>)
    (static_cast<T*>(dw), partial, C, chunks);
  });
}

void rotary(const Rotary& a, DType dtype, cudaStream_t stream) {
  const int64_t n = a.rows * a.heads * (a.head_dim / 2);
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, rotary_kernel<T>)(a);
  });
}

template <typename T>
GluMaps<T> glu_maps(const GluColumns& c) {
  const auto at = [](const void* p) { return static_cast<const T*>(p); };
  return {at(c.gate_scale), at(c.gate_bias), at(c.up_scale), at(c.up_bias)};
}

void glu_forward(void* y, const void* gate, const void* up, const GluColumns& cols, GluKind kind,
                 DType dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, glu_forward_kernel<T>)
    (static_cast<T*>(y), static_cast<const T*>(gate), static_cast<const T*>(up), glu_maps<T>(cols),
     kind, n, cols.C);
  });
}

void soft_cap_forward(void* y, const void* x, double cap, DType dtype, int64_t n,
                      cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, soft_cap_forward_kernel<T>)
    (static_cast<T*>(y), static_cast<const T*>(x), cap, n);
  });
}

void soft_cap_backward(void* dx, const void* dy, const void* y, double cap, DType dtype, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return;
  dispatch_float(dtype, [&]<typename T>() {
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, soft_cap_backward_kernel<T>)
    (static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(y), cap, n);
  });
}

void glu_backward(void* dgate, void* dup, const void* dy, const void* gate, const void* up,
                  const GluColumns& cols, GluKind kind, double* partial, DType dtype, int64_t n,
                  cudaStream_t stream) {
  if (cols.C == 0 || (n == 0 && !cols.dgate_scale && !cols.dup_scale)) return;
  dispatch_float(dtype, [&]<typename T>() {
    if (cols.dgate_scale || cols.dup_scale) {
      const int64_t rows = n / cols.C, chunks = layer_norm_partial_chunks(rows);
      SF_LAUNCH(band_blocks(chunks, cols.C), kThreads, 0, stream, glu_backward_partial_kernel<T>)
      (partial, static_cast<T*>(dgate), static_cast<T*>(dup), static_cast<const T*>(dy),
       static_cast<const T*>(gate), static_cast<const T*>(up), glu_maps<T>(cols), kind, rows,
       cols.C, chunks);
      SF_LAUNCH(blocks_for(cols.C), kThreads, 0, stream, glu_backward_final_kernel<T>)
      (static_cast<T*>(cols.dgate_scale), static_cast<T*>(cols.dup_scale), partial, cols.C, chunks);
      return;
    }
    SF_LAUNCH(blocks_for(n), kThreads, 0, stream, glu_backward_kernel<T>)
    (static_cast<T*>(dgate), static_cast<T*>(dup), static_cast<const T*>(dy),
     static_cast<const T*>(gate), static_cast<const T*>(up), glu_maps<T>(cols), kind, n, cols.C);
  });
}

namespace {

// The tile of R query (or key) rows: the largest power of two up to 32 whose shared memory,
// `tiles` (R, D) tiles, `squares` (R, R) ones and `vectors` (R) ones, fits the default 48 KB.
size_t attention_shared(int64_t R, int64_t D, int tiles, int squares, int vectors, size_t element) {
  return static_cast<size_t>(tiles * R * tile_ld(D) + squares * R * tile_ld(R) + vectors * R) *
         element;
}
int64_t attention_tile(int64_t D, int tiles, int squares, int vectors, size_t element) {
  int64_t R = 32;
  while (R > 1 && attention_shared(R, D, tiles, squares, vectors, element) > (48u << 10)) R /= 2;
  return R;
}

AttentionDropout attention_dropout(const AttentionShape& s) {
  AttentionDropout d;
  if (s.dropout > 0) {
    d.threshold = kernels::attention_drop_threshold(s.dropout);
    d.keep_scale = 1.0 / (1.0 - s.dropout);
  }
  return d;
}

// Blocks for tiles of R of `rows` rows in each of `units` (pairs, or key/value groups).
unsigned attention_blocks(int64_t units, int64_t rows, int64_t R) {
  const int64_t tiles = units * ((rows + R - 1) / R);
  return static_cast<unsigned>(std::clamp<int64_t>(tiles, 1, 65535));
}

// Tensor cores (attention_tc.cuh): per kernel the first of these tiles (rows, other), in order of
// preference, whose shared memory this GPU offers a block; none where none fits (a head over 368
// with 99 KiB). (64, 16) is left out: (32, 32) comes before it and needs less for every head.
struct TensorCoreTiles {
  TcTile forward, dkdv, dq;
  explicit operator bool() const {
    return static_cast<bool>(forward) && static_cast<bool>(dkdv) && static_cast<bool>(dq);
  }
};
TensorCoreTiles tensor_core_tiles(const AttentionShape& s) {
  int device = 0, optin = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  auto tile = [&](size_t (*shared)(int64_t, TcTile)) -> TcTile {
    for (const TcTile t : {TcTile{64, 64}, TcTile{64, 32}, TcTile{32, 64}, TcTile{32, 32},
                           TcTile{16, 64}, TcTile{32, 16}, TcTile{16, 32}, TcTile{16, 16}})
      if (shared(s.head_dim, t) <= static_cast<size_t>(optin)) return t;
    return {};
  };
  return {tile(tc_forward_shared), tile(tc_dkdv_shared), tile(tc_dq_shared)};
}

}  // namespace

// Tensor cores for bf16 or fp16 products of f32 tensors where SEQFORGE_CUDA_ATTENTION=
// tensor_cores asks for them (until they have run on a GPU, the tiles are the default) and their
// tiles fit.
AttentionKernels attention_kernels(const AttentionShape& s, DType dtype) {
  const char* choice = std::getenv("SEQFORGE_CUDA_ATTENTION");
  if (!choice || std::string_view(choice) == "" || std::string_view(choice) == "f32")
    return AttentionKernels::tiles;
  if (std::string_view(choice) != "tensor_cores")
    fail("SEQFORGE_CUDA_ATTENTION: unknown value '", choice, "' (expected f32 or tensor_cores)");
  if (dtype != DType::f32 || !(s.bf16_products || s.fp16_products) || !tensor_core_tiles(s))
    return AttentionKernels::tiles;
  return AttentionKernels::tensor_cores;
}

namespace {

// fn.template operator()<H>() with H the operands' type of tensor-core products.
template <typename Fn>
void dispatch_products(const AttentionShape& s, Fn&& fn) {
  if (s.fp16_products) return fn.template operator()<__half>();
  SF_CHECK(s.bf16_products, "attention on tensor cores without bf16 or fp16 products");
  fn.template operator()<__nv_bfloat16>();
}

}  // namespace

void attention_forward(const AttentionForward& a, DType dtype, AttentionKernels kernels,
                       cudaStream_t stream) {
  const AttentionShape& s = a.shape;
  if (s.batch * s.heads == 0 || a.first_row >= s.seq) return;
  if (kernels == AttentionKernels::tensor_cores) {
    const TensorCoreTiles tiles = tensor_core_tiles(s);
    SF_CHECK(dtype == DType::f32 && tiles, "attention on tensor cores for ", dtype_name(dtype),
             " tensors, head size ", s.head_dim);
    const size_t shared = tc_forward_shared(s.head_dim, tiles.forward);
    dispatch_products(s, [&]<typename H>() {
      allow_shared(attention_forward_tc_kernel<H>, shared, "attention's forward", "head size");
      SF_LAUNCH(attention_blocks(s.batch * s.heads, s.seq - a.first_row, tiles.forward.rows),
                kTcThreads, shared, stream, attention_forward_tc_kernel<H>)
      (a, tiles.forward, attention_dropout(s));
    });
    return;
  }
  dispatch_float(dtype, [&]<typename T>() {
    const int64_t D = s.head_dim, R = attention_tile(D, 4, 1, 3, sizeof(T));
    const size_t shared = attention_shared(R, D, 4, 1, 3, sizeof(T));
    allow_shared(attention_forward_kernel<T>, shared, "attention's forward", "head size");
    SF_LAUNCH(attention_blocks(s.batch * s.heads, s.seq - a.first_row, R), kThreads, shared, stream,
              attention_forward_kernel<T>)
    (a, R, attention_dropout(s));
  });
}

void attention_backward(const AttentionBackward& a, void* delta, DType dtype,
                        AttentionKernels kernels, cudaStream_t stream) {
  const AttentionShape& s = a.shape;
  if (s.batch * s.heads * s.seq == 0) return;
  const AttentionDropout drop = attention_dropout(s);
  if (kernels == AttentionKernels::tensor_cores) {
    const TensorCoreTiles tiles = tensor_core_tiles(s);
    SF_CHECK(dtype == DType::f32 && tiles, "attention on tensor cores for ", dtype_name(dtype),
             " tensors, head size ", s.head_dim);
    float* d = static_cast<float*>(delta);
    const size_t shared_k = tc_dkdv_shared(s.head_dim, tiles.dkdv),
                 shared_q = tc_dq_shared(s.head_dim, tiles.dq);
    dispatch_products(s, [&]<typename H>() {
      SF_LAUNCH(blocks_for(s.batch * s.heads * s.seq), kThreads, 0, stream,
                attention_delta_tc_kernel<H>)
      (d, static_cast<const float*>(a.out), static_cast<const float*>(a.dout), s);
      allow_shared(attention_dkdv_tc_kernel<H>, shared_k, "attention's backward", "head size");
      SF_LAUNCH(attention_blocks(s.batch * s.kv(), s.seq, tiles.dkdv.rows), kTcThreads, shared_k,
                stream, attention_dkdv_tc_kernel<H>)
      (a, d, tiles.dkdv, drop);
      allow_shared(attention_dq_tc_kernel<H>, shared_q, "attention's backward", "head size");
      SF_LAUNCH(attention_blocks(s.batch * s.heads, s.seq, tiles.dq.rows), kTcThreads, shared_q,
                stream, attention_dq_tc_kernel<H>)
      (a, d, tiles.dq, drop);
    });
    return;
  }
  dispatch_float(dtype, [&]<typename T>() {
    const int64_t D = s.head_dim;
    T* d = static_cast<T*>(delta);
    SF_LAUNCH(blocks_for(s.batch * s.heads * s.seq), kThreads, 0, stream, attention_delta_kernel<T>)
    (d, static_cast<const T*>(a.out), static_cast<const T*>(a.dout), s);
    const int64_t Rk = attention_tile(D, 6, 2, 2, sizeof(T));
    const size_t shared_k = attention_shared(Rk, D, 6, 2, 2, sizeof(T));
    allow_shared(attention_dkdv_kernel<T>, shared_k, "attention's backward", "head size");
    SF_LAUNCH(attention_blocks(s.batch * s.kv(), s.seq, Rk), kThreads, shared_k, stream,
              attention_dkdv_kernel<T>)
    (a, d, Rk, drop);
    const int64_t Rq = attention_tile(D, 5, 2, 2, sizeof(T));
    const size_t shared_q = attention_shared(Rq, D, 5, 2, 2, sizeof(T));
    allow_shared(attention_dq_kernel<T>, shared_q, "attention's backward", "head size");
    SF_LAUNCH(attention_blocks(s.batch * s.heads, s.seq, Rq), kThreads, shared_q, stream,
              attention_dq_kernel<T>)
    (a, d, Rq, drop);
  });
}

}  // namespace seqforge::cuda
