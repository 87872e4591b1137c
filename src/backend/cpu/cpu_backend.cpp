// The CPU backend: f32 GEMMs through oneDNN, f32 pointwise kernels split over the OpenMP pool
// (the same runtime oneDNN uses, so no two pools compete for the cores). Everything else, and
// every f64 op, runs on the reference kernels.
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <vector>

#include "backend/cpu/blas_gemm.hpp"
#include "backend/cpu/cpu_gemm.hpp"
#include "backend/cpu/isa_cap.hpp"
#include "backend/dispatch.hpp"
#include "kernels/adapter.hpp"
#include "kernels/attention.hpp"
#include "kernels/cells.hpp"
#include "kernels/cpu/decoder_simd.hpp"
#include "kernels/cpu/gemm_narrow.hpp"
#include "kernels/cpu/norm_simd.hpp"
#include "kernels/cpu/pointwise_simd.hpp"
#include "kernels/decoder_ops.hpp"
#include "kernels/reference.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/threads.hpp"

namespace seqforge {

namespace {

// Highway's target names as instruction sets.
std::string simd_name(const std::string& target) {
  if (target.rfind("AVX3", 0) == 0) return "AVX-512";
  if (target == "AVX2" || target == "SSE4") return target;
  return "scalar";
}

// Below this many element operations a parallel region costs more than it saves.
constexpr int64_t kMinParallelWork = 65536;

const float* floats_or_null(const Tensor& t) { return t.empty() ? nullptr : t.data_as<float>(); }

simd::GluMaps glu_maps(const GluAffine& a) {
  return {floats_or_null(a.gate.scale), floats_or_null(a.gate.bias), floats_or_null(a.up.scale),
          floats_or_null(a.up.bias)};
}

// How many threads parallel_rows() splits n rows over: 1 when the work is not worth a parallel
// region, or when already inside one.
int row_threads(int64_t n, int64_t work_per_row) {
  const int threads = omp_get_max_threads();
  if (threads <= 1 || omp_in_parallel() || n < 2 || n * work_per_row < kMinParallelWork) return 1;
  return threads;
}

// Splits [0, n) into one contiguous chunk per thread: fn(r0, r1, chunk index).
template <typename Fn>
void parallel_chunks(int64_t n, int threads, Fn&& fn) {
  if (threads <= 1) return fn(int64_t{0}, n, 0);
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    fn(n * t / nt, n * (t + 1) / nt, static_cast<int>(t));
  }
}
template <typename Fn>
void parallel_rows(int64_t n, int64_t work_per_row, Fn&& fn) {
  parallel_chunks(n, row_threads(n, work_per_row),
                  [&](int64_t r0, int64_t r1, int) { fn(r0, r1); });
}

// Whether y is f32 or bf16, the outputs the f32 kernels write (bf16 through in_f32_blocks).
bool f32_or_bf16(const Tensor& y) { return y.dtype() == DType::f32 || y.dtype() == DType::bf16; }

// Elements [e0, e1) of the bf16 tensor y, written by f(out, b0, b1) into f32 scratch small enough
// for the caches (out[0] stands for element b0), a block of whole units at a time, then rounded
// into y: an f32 kernel writing bf16 without an f32 copy of its whole output.
template <class F>
void in_f32_blocks(Tensor y, int64_t e0, int64_t e1, int64_t unit, F&& f) {
  constexpr int64_t kBlockFloats = 4096;
  thread_local std::vector<float> out;
  const int64_t block = std::max<int64_t>(1, kBlockFloats / unit) * unit;
  out.resize(static_cast<size_t>(block));
  for (int64_t b0 = e0; b0 < e1; b0 += block) {
    const int64_t b1 = std::min(e1, b0 + block);
    f(out.data(), b0, b1);
    simd::convert_to_bf16(static_cast<bf16*>(y.data()) + b0, out.data(), b1 - b0);
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() : ref_(make_reference_backend()) {
    cpu::cap_library_dispatch();
    if (flush_denormals_wanted()) set_flush_denormals(true);
  }
  std::string_view name() const override { return "cpu"; }
  std::string description() const override {
    const dnnl_version_t* v = dnnl_version();
    const std::string onednn = "oneDNN " + std::to_string(v->major) + "." +
                               std::to_string(v->minor) + "." + std::to_string(v->patch);
    std::string blas;
    for (cpu::BlasLibrary library : {cpu::BlasLibrary::openblas, cpu::BlasLibrary::blis})
      if (const cpu::BlasGemm* lib = cpu::BlasGemm::get(library))
        blas += (blas.empty() ? "" : " and ") + lib->description();
    // "cpu: oneDNN 2.6.3 GEMMs, f32 raced against OpenBLAS ..., Zen kernels and BLIS ...; AVX2
    // kernels, ...": the libraries' own descriptions hold commas, so the parts end with ';'.
    return "cpu: " + onednn + " GEMMs" + (blas.empty() ? "" : ", f32 raced against " + blas) +
           "; " + simd_name(simd::target_name()) + " kernels" +
           (flushes_denormals() ? ", denormals flushed to zero" : ", denormals kept");
  }
  // f32 on its own kernels, f64 on the reference's; bf16 GEMMs where the CPU has bf16 dot
  // products (AVX512-BF16 or AMX-BF16).
  bool supports(Op op, DType d) const override {
    if (op == Op::memory) return true;
    if (op == Op::gemm && d == DType::bf16)
      return cpu_features().avx512_bf16 || cpu_features().amx_bf16;
    return d == DType::f32 || d == DType::f64;
  }

  int concurrency() const override { return omp_get_max_threads(); }
  void run_concurrently(int n, const std::function<void(int)>& fn) override {
    SF_CHECK(n >= 1 && n <= concurrency(), "run_concurrently(", n, ") with ", concurrency(),
             " threads");
    if (n == 1) {  // on the calling thread, its ops limited to it
      struct OneThread {
        const int threads = omp_get_max_threads();
        OneThread() { omp_set_num_threads(1); }
        ~OneThread() { omp_set_num_threads(threads); }
      } scope;
      return fn(0);
    }
    // OpenMP may give fewer threads than asked (a call nested in a worker gets one): each runs
    // its share of the workers in order, which keeps a worker waiting only on earlier ones.
    std::exception_ptr error;
#pragma omp parallel num_threads(n)
    {
      const int team = omp_get_num_threads();
      for (int w = omp_get_thread_num(); w < n; w += team) {
        try {
          fn(w);
        } catch (...) {
#pragma omp critical
          error = std::current_exception();
        }
      }
    }
    if (error) std::rethrow_exception(error);
  }

  void* alloc(size_t bytes) override { return ref_->alloc(bytes); }
  void free(void* p) override { ref_->free(p); }
  // Large copies and fills split over the threads: one core alone does not reach the memory's
  // bandwidth.
  void copy(Tensor dst, Tensor src) override {
    SF_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), dst.shape().str(), " <- ",
             src.shape().str());
    char* out = static_cast<char*>(dst.data());
    const char* in = static_cast<const char*>(src.data());
    const size_t n = dst.nbytes();
    if (n == 0 || out == in) return;
    if (out < in + n && in < out + n) return void(std::memmove(out, in, n));  // overlapping
    parallel_rows(static_cast<int64_t>(n), 1, [&](int64_t b0, int64_t b1) {
      std::memcpy(out + b0, in + b0, static_cast<size_t>(b1 - b0));
    });
  }
  void fill(Tensor dst, double value) override {
    if (dst.dtype() != DType::f32) return ref_->fill(dst, value);
    float* out = dst.data_as<float>();
    parallel_rows(dst.numel(), 1, [&](int64_t i0, int64_t i1) {
      std::fill(out + i0, out + i1, static_cast<float>(value));
    });
  }
  void upload(Tensor dst, const void* host) override { ref_->upload(dst, host); }
  void download(void* host, Tensor src) override { ref_->download(host, src); }
  bool host_addressable() const override { return true; }
  void convert(Tensor dst, Tensor src) override {
    SF_CHECK(dst.numel() == src.numel(), dst.shape().str(), " <- ", src.shape().str());
    if (src.dtype() == DType::f32 && dst.dtype() == DType::bf16)
      return parallel_rows(src.numel(), 1, [&](int64_t i0, int64_t i1) {
        simd::convert_to_bf16(static_cast<bf16*>(dst.data()) + i0, src.data_as<float>() + i0,
                              i1 - i0);
      });
    const size_t e_src = dtype_size(src.dtype()), e_dst = dtype_size(dst.dtype());
    parallel_rows(src.numel(), 1, [&](int64_t i0, int64_t i1) {
      seqforge::convert(static_cast<const char*>(src.data()) + i0 * e_src, src.dtype(),
                        static_cast<char*>(dst.data()) + i0 * e_dst, dst.dtype(),
                        static_cast<size_t>(i1 - i0));
    });
  }

  // bf16 GEMMs only where the CPU has bf16 dot products: oneDNN would emulate them on plain
  // AVX-512, slower than f32, and has no kernel at all on AVX2.
  void check_gemm_dtype(const GemmShape& s, DType dtype) const {
    if (dtype == DType::bf16 && !supports(Op::gemm, DType::bf16))
      fail("GEMM ", s.m, "x", s.n, "x", s.k,
           " with bf16 operands: this CPU has no bf16 dot products (AVX512-BF16 or AMX-BF16); "
           "dispatch reaches ",
           isa_tier_name(isa_tier()), isa_cap() ? " under SEQFORGE_MAX_ISA" : "");
  }

  void run_gemm(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
                const void* bias) override {
    check_gemm_dtype(s, dtype);
    if (dtype != DType::f32 && dtype != DType::bf16) return ref_->gemm(s, dtype, a, b, c, bias);
    if (simd::gemm_tn_narrow_fits(s))
      return gemm_tn_narrow(s, dtype, a, b, static_cast<float*>(c), false);
    // A narrow side of another form: the own kernel races the libraries.
    cpu::OwnGemm own;
    if (simd::gemm_tn_narrow_fits(swapped(s))) {
      own = [&](float* out) { gemm_tn_narrow(swapped(s), dtype, b, a, out, true); };
    } else if (simd::gemm_nt_narrow_fits(s)) {
      own = [&](float* out) { gemm_nt_narrow(s, dtype, a, b, out); };
    }
    gemm_.run(s, dtype, a, b, static_cast<float*>(c), static_cast<const float*>(bias),
              own ? &own : nullptr);
  }

  // C = A^T B with A narrow (m small) as (B^T A)^T: the narrow-B kernel with the operands
  // swapped, whose (n, m) accumulator is then C itself.
  static GemmShape swapped(const GemmShape& s) {
    GemmShape t = s;
    t.m = s.n;
    t.n = s.m;
    t.lda = s.ldb;
    t.ldb = s.lda;
    return t;
  }

  // A^T B for narrow B: the rows of A and B split over threads, each summing blocks of rows
  // into its own (n, m) accumulator (a long f32 sum in one accumulator would lose digits); the
  // accumulators are added in thread order. `accumulator_is_c`: C is (n, m) (swapped operands).
  static void gemm_tn_narrow(const GemmShape& s, DType dtype, const void* a, const void* b,
                             float* c, bool accumulator_is_c) {
    constexpr int64_t kBlockRows = 256;
    const int64_t m = s.m, n = s.n;
    const int threads = row_threads(s.k, m * n);
    thread_local std::vector<float> acc_buffer;
    acc_buffer.assign(static_cast<size_t>(2 * threads * n * m), 0.0f);
    float* acc = acc_buffer.data();  // the caller's, also inside the parallel region
    parallel_chunks(s.k, threads, [&](int64_t p0, int64_t p1, int t) {
      float* total = acc + t * n * m;
      float* block = acc + (threads + t) * n * m;
      for (int64_t q = p0; q < p1; q += kBlockRows) {
        std::fill(block, block + n * m, 0.0f);
        simd::gemm_tn_narrow_rows(s, dtype == DType::bf16, a, b, q, std::min(q + kBlockRows, p1),
                                  block);
        for (int64_t i = 0; i < n * m; ++i) total[i] += block[i];
      }
    });
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        float sum = 0.0f;
        for (int t = 0; t < threads; ++t) sum += acc[(t * n + i) * m + r];
        float& out = accumulator_is_c ? c[i * s.ldc + r] : c[r * s.ldc + i];
        out = static_cast<float>(s.alpha) * sum +
              (s.beta == 0.0 ? 0.0f : static_cast<float>(s.beta) * out);
      }
    }
  }

  // A B^T (or A B) for narrow B^T: A's rows split over threads; a plain B (k, n) is first
  // transposed, n rows of k.
  void gemm_nt_narrow(GemmShape s, DType dtype, const void* a, const void* b, float* c) {
    if (!s.trans_b) {
      thread_local std::vector<char> transposed;
      transposed.resize(static_cast<size_t>(s.n * s.k) * dtype_size(dtype));
      copy_transposed(transposed.data(), s.k, b, s.ldb, s.k, s.n, dtype);
      b = transposed.data();
      s.trans_b = true;
      s.ldb = s.k;
    }
    parallel_rows(s.m, s.n * s.k, [&](int64_t r0, int64_t r1) {
      simd::gemm_nt_narrow_rows(s, dtype == DType::bf16, a, b, r0, r1, c);
    });
  }

  void pack_b(const GemmShape& s, DType dtype, const void* b,
              std::unique_ptr<PackedB>* packed) override {
    check_gemm_dtype(s, dtype);
    if (dtype == DType::f32 || dtype == DType::bf16) return gemm_.pack(s, dtype, b, packed);
    packed->reset();
  }
  void run_gemm_packed(const GemmShape& s, DType dtype, const void* a, const void* b,
                       const PackedB& packed, void* c, const void* bias) override {
    gemm_.run_packed(s, dtype, a, b, packed, static_cast<float*>(c),
                     static_cast<const float*>(bias));
  }

  void sum_rows_acc(Tensor db, Tensor dy) override {
    if (dy.dtype() != DType::f32) return ref_->sum_rows_acc(db, dy);
    const int64_t n = db.numel(), rows = n ? dy.numel() / n : 0;
    SF_CHECK(rows * n == dy.numel(), db.shape().str(), " vs rows of ", dy.shape().str());
    const float* in = dy.data_as<float>();
    sum_over_rows(rows, row_threads(rows, n), n, db.data_as<float>(),
                  [&](int64_t r0, int64_t r1, float* acc) { simd::sum_rows(in, n, r0, r1, acc); });
  }
  // One pass over dy: each thread's rows converted to bf16 while their column sums are taken.
  void sum_rows_acc_and_convert(Tensor db, Tensor dy, Tensor dy_low) override {
    if (dy.dtype() != DType::f32 || dy_low.dtype() != DType::bf16)
      return Backend::sum_rows_acc_and_convert(db, dy, dy_low);
    const int64_t n = db.numel(), rows = n ? dy.numel() / n : 0;
    SF_CHECK(rows * n == dy.numel() && dy_low.numel() == dy.numel(), db.shape().str(),
             " vs rows of ", dy.shape().str(), " into ", dy_low.shape().str());
    const float* in = dy.data_as<float>();
    bf16* out = static_cast<bf16*>(dy_low.data());
    sum_over_rows(rows, row_threads(rows, n), n, db.data_as<float>(),
                  [&](int64_t r0, int64_t r1, float* acc) {
                    simd::sum_rows_to_bf16(out, in, n, r0, r1, acc);
                  });
  }
  void add(Tensor y, Tensor x) override {
    if (y.dtype() != DType::f32) return ref_->add(y, x);
    SF_CHECK(y.numel() == x.numel(), y.shape().str(), " += ", x.shape().str());
    float* out = y.data_as<float>();
    const float* in = x.data_as<float>();
    parallel_rows(y.numel(), 1, [&](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) out[i] += in[i];
    });
  }
  void mul(Tensor y, Tensor a, Tensor b) override {
    if (y.dtype() != DType::f32) return ref_->mul(y, a, b);
    SF_CHECK(y.numel() == a.numel() && y.numel() == b.numel(), "mul sizes");
    float* out = y.data_as<float>();
    const float *pa = a.data_as<float>(), *pb = b.data_as<float>();
    parallel_rows(y.numel(), 1, [&](int64_t i0, int64_t i1) {
#pragma omp simd
      for (int64_t i = i0; i < i1; ++i) out[i] = pa[i] * pb[i];
    });
  }
  void set_seed_base(const uint64_t* base) override {
    Backend::set_seed_base(base);
    ref_->set_seed_base(base);
  }
  void dropout_mask(Tensor mask, double p, uint64_t seed) override {
    if (mask.dtype() != DType::f32) return ref_->dropout_mask(mask, p, seed);
    seed = ref::seed_with_base(seed_base_, seed);
    const uint64_t below = ref::uniform_below(p);
    const float keep = static_cast<float>(1.0 / (1.0 - p));
    parallel_rows(mask.numel(), 8, [&](int64_t i0, int64_t i1) {
      simd::dropout_mask(mask.data_as<float>() + i0, seed, i0, i1, below, keep);
    });
  }
  // (d0, d1, f) -> (d1, d0, f): rows of f elements copied, split over threads; single 4-byte
  // elements (a matrix transpose) in 32 x 32 tiles.
  void transpose01(Tensor dst, Tensor src) override {
    SF_CHECK(src.shape().rank() == 3 && dst.shape() == Shape({src.dim(1), src.dim(0), src.dim(2)}),
             dst.shape().str(), " <- transpose ", src.shape().str());
    const int64_t d0 = src.dim(0), d1 = src.dim(1), f = src.dim(2);
    const size_t e = dtype_size(src.dtype()), row = f * e;
    const char* in = static_cast<const char*>(src.data());
    char* out = static_cast<char*>(dst.data());
    if (f == 1 && e == 4) {
      constexpr int64_t kTile = 32;
      const auto* s = reinterpret_cast<const uint32_t*>(in);
      auto* o = reinterpret_cast<uint32_t*>(out);
      parallel_rows((d0 + kTile - 1) / kTile, kTile * d1, [&](int64_t b0, int64_t b1) {
        for (int64_t i0 = b0 * kTile; i0 < std::min(d0, b1 * kTile); i0 += kTile)
          for (int64_t j0 = 0; j0 < d1; j0 += kTile)
            for (int64_t i = i0; i < std::min(d0, i0 + kTile); ++i)
              for (int64_t j = j0; j < std::min(d1, j0 + kTile); ++j) o[j * d0 + i] = s[i * d1 + j];
      });
      return;
    }
    parallel_rows(d0, d1 * f, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t j = 0; j < d1; ++j)
          std::memcpy(out + (j * d0 + i) * row, in + (i * d1 + j) * row, row);
    });
  }
  void copy_rows(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                 int64_t n, DType dtype) override {
    ref_->copy_rows(dst, ld_dst, src, ld_src, rows, n, dtype);
  }
  // In blocks of 8 source rows per thread.
  void copy_transposed(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                       int64_t cols, DType dtype) override {
    const size_t e = dtype_size(dtype);
    if (e != 2 && e != 4) return ref_->copy_transposed(dst, ld_dst, src, ld_src, rows, cols, dtype);
    parallel_rows((rows + 7) / 8, 8 * cols, [&](int64_t b0, int64_t b1) {
      const int64_t r0 = 8 * b0, n = std::min(rows, 8 * b1) - r0;
      const char* s = static_cast<const char*>(src) + r0 * ld_src * e;
      char* d = static_cast<char*>(dst) + r0 * e;
      if (e == 2)
        simd::transpose16(reinterpret_cast<uint16_t*>(d), ld_dst,
                          reinterpret_cast<const uint16_t*>(s), ld_src, n, cols);
      else
        simd::transpose32(reinterpret_cast<uint32_t*>(d), ld_dst,
                          reinterpret_cast<const uint32_t*>(s), ld_src, n, cols);
    });
  }

  void cell_forward(CellKind cell, const CellForward& a, DType dtype) override {
    // The SIMD kernels write bf16 copies only; f16 ones (a reference-checked path) go through the
    // reference kernels.
    if (dtype != DType::f32 || a.low != DType::bf16) return ref_->cell_forward(cell, a, dtype);
    const auto forward = cell_kernels(cell).simd_forward;
    parallel_rows(a.batch, cell_type(cell).gates * a.hidden,
                  [&](int64_t r0, int64_t r1) { forward(a, r0, r1); });
  }
  void cell_backward(CellKind cell, const CellBackward& a, DType dtype) override {
    if (dtype != DType::f32 || a.low != DType::bf16) return ref_->cell_backward(cell, a, dtype);
    const auto backward = cell_kernels(cell).simd_backward;
    const CellType& type = cell_type(cell);
    const int64_t work = type.gates * a.hidden;
    if (!a.dbias)
      return parallel_rows(a.batch, work,
                           [&](int64_t r0, int64_t r1) { backward(a, r0, r1, nullptr); });
    sum_over_rows(a.batch, row_threads(a.batch, work), bias_grad_columns(type, a.hidden),
                  static_cast<float*>(a.dbias),
                  [&](int64_t r0, int64_t r1, float* acc) { backward(a, r0, r1, acc); });
  }

  // f32 over the OpenMP pool (y in f32 or bf16); other dtypes through the reference.
  void layer_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, Tensor b,
                          double eps) override {
    if (x.dtype() != DType::f32 || !f32_or_bf16(y))
      return ref_->layer_norm_forward(y, saved, x, w, b, eps);
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(y.numel() == x.numel() && saved.numel() == 2 * N && w.numel() == C && b.numel() == C,
             "layer_norm_forward shapes");
    const float *xs = x.data_as<float>(), *ws = w.data_as<float>(), *bs = b.data_as<float>();
    float* ss = saved.data_as<float>();
    parallel_rows(N, 4 * C, [&](int64_t r0, int64_t r1) {
      if (y.dtype() == DType::f32)
        return simd::layer_norm_forward(y.data_as<float>(), ss, xs, ws, bs, C, float(eps), r0, r1);
      in_f32_blocks(y, r0 * C, r1 * C, C, [&](float* out, int64_t e0, int64_t e1) {
        simd::layer_norm_forward(out, ss + 2 * (e0 / C), xs + e0, ws, bs, C, float(eps), 0,
                                 (e1 - e0) / C);
      });
    });
  }
  void layer_norm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w,
                           Tensor saved, Tensor residual) override {
    if (x.dtype() != DType::f32)
      return ref_->layer_norm_backward(dx, dw, db, dy, x, w, saved, residual);
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(residual.empty() || residual.numel() == x.numel(), "layer_norm_backward residual");
    const float* res = residual.empty() ? nullptr : residual.data_as<float>();
    // Each thread's sums of dw and db side by side, then added in thread order.
    const int threads = row_threads(N, 8 * C);
    const int64_t block = simd::norm_block_floats(C);
    partial_.assign(static_cast<size_t>(threads * (2 * C + block)), 0.0f);
    parallel_chunks(N, threads, [&](int64_t r0, int64_t r1, int t) {
      float* own = partial_.data() + t * (2 * C + block);
      simd::layer_norm_backward(dx.data_as<float>(), own, own + C, own + 2 * C, res,
                                dy.data_as<float>(), x.data_as<float>(), w.data_as<float>(),
                                saved.data_as<float>(), C, r0, r1);
    });
    float *pw = dw.data_as<float>(), *pb = db.data_as<float>();
    for (int t = 0; t < threads; ++t) {
      const float* own = partial_.data() + t * (2 * C + block);
      for (int64_t j = 0; j < C; ++j) pw[j] += own[j], pb[j] += own[C + j];
    }
  }
  void gelu_forward(Tensor y, Tensor x, const ColumnMap& map) override {
    if (x.dtype() != DType::f32 || !f32_or_bf16(y)) return ref_->gelu_forward(y, x, map);
    SF_CHECK(y.numel() == x.numel(), "gelu sizes");
    const int64_t C = map.width(x);
    if (x.numel() == 0) return;
    const float *xs = x.data_as<float>(), *scale = floats_or_null(map.scale),
                *bias = floats_or_null(map.bias);
    parallel_rows(x.numel() / C, 20 * C, [&](int64_t r0, int64_t r1) {
      if (y.dtype() == DType::f32)
        return simd::gelu_forward(y.data_as<float>(), xs, scale, bias, C, r0, r1);
      in_f32_blocks(y, r0 * C, r1 * C, C, [&](float* out, int64_t e0, int64_t e1) {
        simd::gelu_forward(out, xs + e0, scale, bias, C, 0, (e1 - e0) / C);
      });
    });
  }
  void gelu_backward(Tensor dx, Tensor dy, Tensor x, const ColumnMap& map) override {
    if (x.dtype() != DType::f32) return ref_->gelu_backward(dx, dy, x, map);
    SF_CHECK(dx.numel() == x.numel() && dy.numel() == x.numel(), "gelu sizes");
    const int64_t C = map.width(x), rows = C ? x.numel() / C : 0;
    const float *scale = floats_or_null(map.scale), *bias = floats_or_null(map.bias);
    const auto rows_of = [&](int64_t r0, int64_t r1, float* sums) {
      simd::gelu_backward(dx.data_as<float>(), sums, dy.data_as<float>(), x.data_as<float>(), scale,
                          bias, C, r0, r1);
    };
    if (map.dscale.empty())
      return parallel_rows(rows, 30 * C, [&](int64_t r0, int64_t r1) { rows_of(r0, r1, nullptr); });
    column_sums_.assign(static_cast<size_t>(C), 0.0f);
    sum_over_rows(rows, row_threads(rows, 30 * C), C, column_sums_.data(), rows_of);
    std::copy_n(column_sums_.data(), C, map.dscale.data_as<float>());
  }
  // The decoder ops: the scalar kernels over row ranges on the pool (f32; f64 on the reference).
  void rms_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, double offset,
                        double eps) override {
    if (x.dtype() != DType::f32) return ref_->rms_norm_forward(y, saved, x, w, offset, eps);
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(
        y.numel() == x.numel() && saved.numel() == N && w.numel() == C && y.dtype() == DType::f32,
        "rms_norm_forward shapes");
    parallel_rows(N, 3 * C, [&](int64_t r0, int64_t r1) {
      simd::rms_norm_forward(y.data_as<float>(), saved.data_as<float>(), x.data_as<float>(),
                             w.data_as<float>(), float(offset), C, float(eps), r0, r1);
    });
  }
  void rms_norm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, double offset,
                         Tensor saved, Tensor residual) override {
    if (x.dtype() != DType::f32)
      return ref_->rms_norm_backward(dx, dw, dy, x, w, offset, saved, residual);
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(dx.numel() == x.numel() && dy.numel() == x.numel() && saved.numel() == N &&
                 w.numel() == C && dw.numel() == C &&
                 (residual.empty() || residual.numel() == x.numel()),
             "rms_norm_backward shapes");
    const float* res = residual.empty() ? nullptr : residual.data_as<float>();
    // Each thread's sums of dw, then added in thread order.
    const int threads = row_threads(N, 7 * C);
    const int64_t block = simd::norm_block_floats(C);
    partial_.assign(static_cast<size_t>(threads * (C + block)), 0.0f);
    parallel_chunks(N, threads, [&](int64_t r0, int64_t r1, int t) {
      float* own = partial_.data() + t * (C + block);
      simd::rms_norm_backward(dx.data_as<float>(), own, own + C, res, dy.data_as<float>(),
                              x.data_as<float>(), w.data_as<float>(), float(offset),
                              saved.data_as<float>(), C, r0, r1);
    });
    float* pw = dw.data_as<float>();
    for (int t = 0; t < threads; ++t) {
      const float* own = partial_.data() + t * (C + block);
      for (int64_t j = 0; j < C; ++j) pw[j] += own[j];
    }
  }
  void rotary(const Rotary& a, DType dtype) override {
    if (dtype != DType::f32) return ref_->rotary(a, dtype);
    parallel_rows(a.rows, 4 * a.heads * a.head_dim,
                  [&](int64_t r0, int64_t r1) { simd::rotary(a, r0, r1); });
  }
  void glu_forward(Tensor y, Tensor gate, Tensor up, GluKind kind,
                   const GluAffine& affine) override {
    if (y.dtype() != DType::f32) return ref_->glu_forward(y, gate, up, kind, affine);
    const int64_t C = affine.width(gate);
    SF_CHECK(y.numel() == gate.numel() && up.numel() == gate.numel(), "glu_forward sizes");
    if (gate.numel() == 0) return;
    const simd::GluMaps maps = glu_maps(affine);
    parallel_rows(y.numel() / C, 20 * C, [&](int64_t r0, int64_t r1) {
      simd::glu_forward(y.data_as<float>(), gate.data_as<float>(), up.data_as<float>(), maps, kind,
                        C, r0, r1);
    });
  }
  void glu_backward(Tensor dgate, Tensor dup, Tensor dy, Tensor gate, Tensor up, GluKind kind,
                    const GluAffine& affine) override {
    if (dy.dtype() != DType::f32) return ref_->glu_backward(dgate, dup, dy, gate, up, kind, affine);
    const int64_t C = affine.width(gate), rows = C ? dy.numel() / C : 0;
    SF_CHECK(dgate.numel() == dy.numel() && dup.numel() == dy.numel() &&
                 gate.numel() == dy.numel() && up.numel() == dy.numel(),
             "glu_backward sizes");
    const simd::GluMaps maps = glu_maps(affine);
    const bool gate_sums = !affine.gate.dscale.empty(), up_sums = !affine.up.dscale.empty();
    const auto rows_of = [&](int64_t r0, int64_t r1, float* sums) {
      simd::glu_backward(dgate.data_as<float>(), dup.data_as<float>(), gate_sums ? sums : nullptr,
                         up_sums ? sums + C : nullptr, dy.data_as<float>(), gate.data_as<float>(),
                         up.data_as<float>(), maps, kind, C, r0, r1);
    };
    if (!gate_sums && !up_sums)
      return parallel_rows(rows, 30 * C, [&](int64_t r0, int64_t r1) { rows_of(r0, r1, nullptr); });
    column_sums_.assign(static_cast<size_t>(2 * C), 0.0f);  // the gate's, then up's
    sum_over_rows(rows, row_threads(rows, 30 * C), 2 * C, column_sums_.data(), rows_of);
    if (gate_sums) std::copy_n(column_sums_.data(), C, affine.gate.dscale.data_as<float>());
    if (up_sums) std::copy_n(column_sums_.data() + C, C, affine.up.dscale.data_as<float>());
  }
  void soft_cap_forward(Tensor y, Tensor x, double cap) override {
    if (y.dtype() != DType::f32) return ref_->soft_cap_forward(y, x, cap);
    SF_CHECK(y.numel() == x.numel() && cap > 0, "soft_cap_forward sizes or cap ", cap);
    parallel_rows(y.numel(), 20, [&](int64_t i0, int64_t i1) {
      kernels::soft_cap_forward(y.data_as<float>(), x.data_as<float>(), cap, i0, i1);
    });
  }
  void soft_cap_backward(Tensor dx, Tensor dy, Tensor y, double cap) override {
    if (dy.dtype() != DType::f32) return ref_->soft_cap_backward(dx, dy, y, cap);
    SF_CHECK(dx.numel() == dy.numel() && y.numel() == dy.numel() && cap > 0,
             "soft_cap_backward sizes or cap ", cap);
    parallel_rows(dy.numel(), 4, [&](int64_t i0, int64_t i1) {
      kernels::soft_cap_backward(dx.data_as<float>(), dy.data_as<float>(), y.data_as<float>(), cap,
                                 i0, i1);
    });
  }
  void run_scale_columns(Tensor y, int64_t ldy, const void* addend, Tensor x, Tensor s,
                         Tensor b) override {
    if (x.dtype() != DType::f32) return ref_->scale_columns(y, x, s, b, ldy, addend);
    const int64_t C = s.numel();
    SF_CHECK(
        y.numel() == x.numel() && x.numel() % C == 0 && (b.empty() || b.numel() == C) && ldy >= C,
        "scale_columns shapes");
    parallel_rows(x.numel() / C, C, [&](int64_t r0, int64_t r1) {
      kernels::scale_columns(y.data_as<float>(), ldy, static_cast<const float*>(addend),
                             x.data_as<float>(), s.data_as<float>(),
                             b.empty() ? nullptr : b.data_as<float>(), C, r0, r1);
    });
  }
  void run_dora_backward(Tensor dpre, Tensor dm, Tensor dy, int64_t ldy, Tensor pre, Tensor scale,
                         Tensor inv_norm) override {
    if (dy.dtype() != DType::f32)
      return ref_->dora_backward(dpre, dm, dy, pre, scale, inv_norm, ldy);
    const int64_t C = scale.numel(), rows = C ? dy.numel() / C : 0;
    SF_CHECK(dpre.numel() == dy.numel() && pre.numel() == dy.numel() && rows * C == dy.numel() &&
                 dm.numel() == C && inv_norm.numel() == C && ldy >= C,
             "dora_backward shapes");
    column_sums_.assign(static_cast<size_t>(C), 0.0f);
    sum_over_rows(rows, row_threads(rows, 2 * C), C, column_sums_.data(),
                  [&](int64_t r0, int64_t r1, float* sums) {
                    simd::dora_backward_rows(dpre.data_as<float>(), sums, dy.data_as<float>(), ldy,
                                             pre.data_as<float>(), scale.data_as<float>(), C, r0,
                                             r1);
                  });
    float* out = dm.data_as<float>();
    const float* inv = inv_norm.data_as<float>();
    for (int64_t j = 0; j < C; ++j) out[j] += column_sums_[j] * inv[j];
  }
  void dora_norm(Tensor scale, Tensor inv_norm, Tensor v, Tensor m) override {
    if (v.dtype() != DType::f32) return ref_->dora_norm(scale, inv_norm, v, m);
    const int64_t R = m.numel(), C = R ? v.numel() / R : 0;
    SF_CHECK(scale.numel() == R && inv_norm.numel() == R && R * C == v.numel(), "dora_norm shapes");
    parallel_rows(R, C, [&](int64_t r0, int64_t r1) {
      simd::dora_norm(scale.data_as<float>(), inv_norm.data_as<float>(), v.data_as<float>(),
                      m.data_as<float>(), C, r0, r1);
    });
  }
  // f32 fused kernels; with bf16 products allowed and bf16 dot products on the CPU, their bf16
  // form.
  void attention_forward(const AttentionForward& given, DType dtype) override {
    if (dtype != DType::f32) return ref_->attention_forward(given, dtype);
    AttentionForward a = given;
    a.shape.seed = ref::seed_with_base(seed_base_, given.shape.seed);
    const AttentionShape& s = a.shape;
    kernels::check_attention_shape(s);
    SF_CHECK(a.first_row >= 0 && a.first_row <= s.seq, "attention first row ", a.first_row, " of ",
             s.seq);
    const auto kernel = bf16_attention(s) ? kernels::attention_forward_fused_bf16
                                          : kernels::attention_forward_fused;
    parallel_rows(s.batch * s.heads, (s.seq - a.first_row) * s.seq * s.head_dim,
                  [&](int64_t p0, int64_t p1) { kernel(a, p0, p1); });
  }
  void attention_backward(const AttentionBackward& given, DType dtype) override {
    if (dtype != DType::f32) return ref_->attention_backward(given, dtype);
    AttentionBackward a = given;
    a.shape.seed = ref::seed_with_base(seed_base_, given.shape.seed);
    const AttentionShape& s = a.shape;
    kernels::check_attention_shape(s);
    const auto kernel = bf16_attention(s) ? kernels::attention_backward_fused_bf16
                                          : kernels::attention_backward_fused;
    parallel_rows(s.batch * s.kv(), 2 * s.group() * s.seq * s.seq * s.head_dim,
                  [&](int64_t g0, int64_t g1) { kernel(a, g0, g1); });
  }
  static bool bf16_attention(const AttentionShape& s) {
    return s.bf16_products && cpu_features().avx512_bf16 &&
           std::string_view(simd::target_name()).rfind("AVX3", 0) == 0;
  }

  void embedding_forward(Tensor out, Tensor table, Tensor ids) override {
    ref_->embedding_forward(out, table, ids);
  }
  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids) override {
    ref_->embedding_backward(dtable, dout, ids);
  }
  void regression_loss(const RegressionLoss& kind, Tensor pred, Tensor target, Tensor mask,
                       Tensor dpred, Tensor loss) override {
    ref_->regression_loss(kind, pred, target, mask, dpred, loss);
  }
  // f32 rows on the threads, each row's exponentials taken once; the loss summed in double per
  // chunk, the chunks added in order.
  void cross_entropy_loss(Tensor logits, Tensor targets, Tensor weights, int64_t ignore_index,
                          Tensor dlogits, Tensor loss) override {
    if (logits.dtype() != DType::f32 || dlogits.dtype() != DType::f32 ||
        logits.shape().rank() != 2 || (!weights.empty() && weights.dtype() != DType::f32))
      return ref_->cross_entropy_loss(logits, targets, weights, ignore_index, dlogits, loss);
    const int64_t rows = logits.dim(0), classes = logits.dim(1);
    SF_CHECK(targets.numel() == rows, "cross-entropy: ", rows, " rows of logits, ", targets.numel(),
             " targets");
    SF_CHECK(weights.empty() || weights.numel() == classes, "class weights ", weights.shape().str(),
             " for ", classes, " classes");
    SF_CHECK(dlogits.numel() == logits.numel(), "cross-entropy: dlogits ", dlogits.shape().str(),
             " for logits ", logits.shape().str());
    SF_CHECK(targets.dtype() == DType::i32 || targets.dtype() == DType::i64,
             "ids must be i32 or i64, got ", dtype_name(targets.dtype()));
    const auto target = [&](int64_t r) -> int64_t {
      return targets.dtype() == DType::i32 ? targets.data_as<int32_t>()[r]
                                           : targets.data_as<int64_t>()[r];
    };
    const float* w = weights.empty() ? nullptr : weights.data_as<float>();
    double total_weight = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t y = target(r);
      if (y == ignore_index) continue;
      if (y < 0 || y >= classes)
        fail("target class ", y, " at row ", r, " outside [0, ", classes, ")");
      total_weight += w ? double(w[y]) : 1.0;
    }
    const float* x = logits.data_as<float>();
    float* d = dlogits.data_as<float>();
    const int threads = row_threads(rows, 3 * classes);
    std::vector<double> partial(static_cast<size_t>(threads), 0.0);
    parallel_chunks(rows, threads, [&](int64_t r0, int64_t r1, int chunk) {
      double acc = 0;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t y = target(r);
        float* dr = d + r * classes;
        if (y == ignore_index || total_weight == 0) {
          std::fill_n(dr, classes, 0.0f);
          continue;
        }
        const double wy = w ? double(w[y]) : 1.0;
        acc += wy * simd::cross_entropy_row(dr, x + r * classes, classes, y,
                                            static_cast<float>(wy / total_weight));
      }
      partial[static_cast<size_t>(chunk)] = acc;
    });
    double total = 0;
    for (double v : partial) total += v;
    store_scalar(loss, total_weight > 0 ? total / total_weight : 0.0);
  }
  // Per-thread partial sums in double, added in chunk order.
  void sum_squares(Tensor x, Tensor out) override {
    if (x.dtype() != DType::f32) return ref_->sum_squares(x, out);
    const float* p = x.data_as<float>();
    const int threads = row_threads(x.numel(), 1);
    std::vector<double> partial(static_cast<size_t>(threads), 0.0);
    parallel_chunks(x.numel(), threads, [&](int64_t i0, int64_t i1, int chunk) {
      partial[static_cast<size_t>(chunk)] = simd::sum_squares(p + i0, i1 - i0);
    });
    double total = 0;
    for (double v : partial) total += v;
    store_scalar(out, total);
  }
  void scale(Tensor x, double alpha) override { ref_->scale(x, alpha); }

  void adam_step(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamParams& a) override {
    if (params.dtype() != DType::f32) return ref_->adam_step(params, grads, m, v, a);
    float *p = params.data_as<float>(), *mp = m.data_as<float>(), *vp = v.data_as<float>();
    float* g = grads.data_as<float>();
    parallel_rows(params.numel(), 1,
                  [&](int64_t i0, int64_t i1) { ref::adam_step<float>(p, g, mp, vp, a, i0, i1); });
  }
  void sgd_step(Tensor params, Tensor grads, Tensor momentum, const SgdParams& a) override {
    if (params.dtype() != DType::f32) return ref_->sgd_step(params, grads, momentum, a);
    float* p = params.data_as<float>();
    float* buf = momentum.empty() ? nullptr : momentum.data_as<float>();
    const float* g = grads.data_as<float>();
    parallel_rows(params.numel(), 1,
                  [&](int64_t i0, int64_t i1) { ref::sgd_step<float>(p, g, buf, a, i0, i1); });
  }

 private:
  std::unique_ptr<Backend> ref_;
  cpu::CpuGemm gemm_;
  // out(n) += column sums that fn(r0, r1, acc) adds into acc over rows [r0, r1): straight into
  // out on one thread, else into a partial per thread, added in thread order so that the result
  // does not depend on timing.
  template <typename Fn>
  void sum_over_rows(int64_t rows, int threads, int64_t n, float* out, Fn&& fn) {
    if (threads <= 1) return fn(int64_t{0}, rows, out);
    if (partial_.size() < static_cast<size_t>(threads * n)) partial_.resize(threads * n);
    std::fill(partial_.begin(), partial_.begin() + threads * n, 0.0f);
    float* partial = partial_.data();
    parallel_chunks(rows, threads,
                    [&](int64_t r0, int64_t r1, int t) { fn(r0, r1, partial + t * n); });
    for (int t = 0; t < threads; ++t)
      for (int64_t j = 0; j < n; ++j) out[j] += partial[t * n + j];
  }

  std::vector<float> partial_;      // per-thread column sums
  std::vector<float> column_sums_;  // dora_backward's before the scaling, glu_backward's
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace seqforge
