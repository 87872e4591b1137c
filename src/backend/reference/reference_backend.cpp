// The reference backend: every op as a plain scalar loop, f32 and f64.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backend/dispatch.hpp"
#include "kernels/adapter.hpp"
#include "kernels/attention.hpp"
#include "kernels/cells.hpp"
#include "kernels/decoder_ops.hpp"
#include "kernels/norm.hpp"
#include "kernels/reference.hpp"
#include "seqforge/backend/backend.hpp"

namespace seqforge {

namespace {

template <typename T>
kernels::GluMaps<T> glu_maps(const GluAffine& a) {
  const auto at = [](const Tensor& t) { return static_cast<const T*>(t.data()); };
  return {at(a.gate.scale), at(a.gate.bias), at(a.up.scale), at(a.up.bias)};
}

int64_t row_count(Tensor t) { return t.shape().rank() ? t.dim(0) : 1; }
int64_t row_size(Tensor t) {
  return t.shape().rank() ? t.numel() / std::max<int64_t>(t.dim(0), 1) : 1;
}

int64_t id_at(Tensor ids, int64_t i) {
  if (ids.dtype() == DType::i32) return static_cast<const int32_t*>(ids.data())[i];
  if (ids.dtype() == DType::i64) return static_cast<const int64_t*>(ids.data())[i];
  fail("ids must be i32 or i64, got ", dtype_name(ids.dtype()));
}

class ReferenceBackend final : public Backend {
 public:
  std::string_view name() const override { return "reference"; }
  bool supports(Op op, DType d) const override {
    if (op == Op::memory) return true;
    // bf16 and f16 operands, f32 accumulation
    if (op == Op::gemm && (d == DType::bf16 || d == DType::f16)) return true;
    return d == DType::f32 || d == DType::f64;
  }

  // Buffers of 2 MiB and more are aligned to and asked for huge pages (best effort, where
  // transparent huge pages are on or madvise): a step's activation buffers span hundreds of MB,
  // and strided passes over them (a GEMM operand read transposed) would otherwise miss the
  // TLB on every page.
  void* alloc(size_t bytes) override {
    constexpr size_t kHugePage = size_t{2} << 20;
    const size_t align = bytes >= kHugePage ? kHugePage : 64;
    const size_t rounded = (std::max<size_t>(bytes, 1) + align - 1) / align * align;
    void* p = std::aligned_alloc(align, rounded);
    if (!p) fail("out of memory allocating ", bytes, " bytes");
    if (align == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);
    std::memset(p, 0, rounded);
    return p;
  }
  void free(void* p) override { std::free(p); }

  void copy(Tensor dst, Tensor src) override {
    SF_CHECK(dst.dtype() == src.dtype() && dst.numel() == src.numel(), dst.shape().str(), " <- ",
             src.shape().str());
    if (dst.nbytes()) std::memmove(dst.data(), src.data(), dst.nbytes());
  }

  void upload(Tensor dst, const void* host) override {
    if (dst.nbytes()) std::memcpy(dst.data(), host, dst.nbytes());
  }
  void download(void* host, Tensor src) override {
    if (src.nbytes()) std::memcpy(host, src.data(), src.nbytes());
  }
  bool host_addressable() const override { return true; }

  void fill(Tensor dst, double value) override {
    dispatch_float(dst.dtype(), [&]<typename T>() {
      T* p = static_cast<T*>(dst.data());
      for (int64_t i = 0; i < dst.numel(); ++i) p[i] = static_cast<T>(value);
    });
  }

  void convert(Tensor dst, Tensor src) override {
    SF_CHECK(dst.numel() == src.numel(), dst.shape().str(), " <- ", src.shape().str());
    seqforge::convert(src.data(), src.dtype(), dst.data(), dst.dtype(),
                      static_cast<size_t>(src.numel()));
  }
  // y = what f writes into a tensor of y's shape in dtype, converted to y's dtype.
  template <class F>
  void into_dtype(Tensor y, DType dtype, F&& f) {
    std::vector<char> bytes(static_cast<size_t>(y.numel()) * dtype_size(dtype));
    Tensor t(bytes.data(), dtype, y.shape());
    f(t);
    convert(y, t);
  }

  void run_gemm(const GemmShape& s, DType dtype, const void* a, const void* b, void* c,
                const void* bias) override {
    if (dtype == DType::bf16) {
      ref::gemm(s, static_cast<const bf16*>(a), static_cast<const bf16*>(b), static_cast<float*>(c),
                static_cast<const float*>(bias), 0, s.m);
      return;
    }
    if (dtype == DType::f16) {
      ref::gemm(s, static_cast<const f16*>(a), static_cast<const f16*>(b), static_cast<float*>(c),
                static_cast<const float*>(bias), 0, s.m);
      return;
    }
    dispatch_float(dtype, [&]<typename T>() {
      ref::gemm<T>(s, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c),
                   static_cast<const T*>(bias), 0, s.m);
    });
  }

  void sum_rows_acc(Tensor db, Tensor dy) override {
    const int64_t n = row_size(dy);
    SF_CHECK(db.numel() == n, db.shape().str(), " vs rows of ", dy.shape().str());
    dispatch_float(dy.dtype(), [&]<typename T>() {
      T* out = static_cast<T*>(db.data());
      const T* in = static_cast<const T*>(dy.data());
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t r = 0; r < row_count(dy); ++r) acc += in[r * n + j];
        out[j] += static_cast<T>(acc);
      }
    });
  }

  void add(Tensor y, Tensor x) override {
    SF_CHECK(y.numel() == x.numel(), y.shape().str(), " += ", x.shape().str());
    dispatch_float(y.dtype(), [&]<typename T>() {
      T* out = static_cast<T*>(y.data());
      const T* in = static_cast<const T*>(x.data());
      for (int64_t i = 0; i < y.numel(); ++i) out[i] += in[i];
    });
  }

  void mul(Tensor y, Tensor a, Tensor b) override {
    SF_CHECK(y.numel() == a.numel() && y.numel() == b.numel(), "mul sizes");
    dispatch_float(y.dtype(), [&]<typename T>() {
      T* out = static_cast<T*>(y.data());
      const T* pa = static_cast<const T*>(a.data());
      const T* pb = static_cast<const T*>(b.data());
      for (int64_t i = 0; i < y.numel(); ++i) out[i] = pa[i] * pb[i];
    });
  }

  void dropout_mask(Tensor mask, double p, uint64_t seed) override {
    seed = ref::seed_with_base(seed_base_, seed);
    dispatch_float(mask.dtype(), [&]<typename T>() {
      T* out = static_cast<T*>(mask.data());
      const T keep = static_cast<T>(1.0 / (1.0 - p));
      for (int64_t i = 0; i < mask.numel(); ++i)
        out[i] = ref::hash_uniform(seed, static_cast<uint64_t>(i)) < p ? T(0) : keep;
    });
  }

  void transpose01(Tensor dst, Tensor src) override {
    SF_CHECK(src.shape().rank() == 3 && dst.shape() == Shape({src.dim(1), src.dim(0), src.dim(2)}),
             dst.shape().str(), " <- transpose ", src.shape().str());
    const int64_t d0 = src.dim(0), d1 = src.dim(1), f = src.dim(2);
    const size_t row = f * dtype_size(src.dtype());
    for (int64_t i = 0; i < d0; ++i)
      for (int64_t j = 0; j < d1; ++j)
        std::memcpy(static_cast<char*>(dst.data()) + (j * d0 + i) * row,
                    static_cast<const char*>(src.data()) + (i * d1 + j) * row, row);
  }

  void copy_rows(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                 int64_t n, DType dtype) override {
    const size_t e = dtype_size(dtype);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * ld_dst * e,
                  static_cast<const char*>(src) + r * ld_src * e, n * e);
  }

  void copy_transposed(void* dst, int64_t ld_dst, const void* src, int64_t ld_src, int64_t rows,
                       int64_t cols, DType dtype) override {
    const size_t e = dtype_size(dtype);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        std::memcpy(static_cast<char*>(dst) + (c * ld_dst + r) * e,
                    static_cast<const char*>(src) + (r * ld_src + c) * e, e);
  }

  void cell_forward(CellKind cell, const CellForward& a, DType dtype) override {
    const CellKernels& k = cell_kernels(cell);
    SF_CHECK(dtype == DType::f32 || dtype == DType::f64, "cell step in ", dtype_name(dtype));
    (dtype == DType::f32 ? k.forward_f32 : k.forward_f64)(a, 0, a.batch);
  }
  void cell_backward(CellKind cell, const CellBackward& a, DType dtype) override {
    const CellKernels& k = cell_kernels(cell);
    SF_CHECK(dtype == DType::f32 || dtype == DType::f64, "cell step in ", dtype_name(dtype));
    (dtype == DType::f32 ? k.backward_f32 : k.backward_f64)(a, 0, a.batch);
  }

  void layer_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, Tensor b,
                          double eps) override {
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(y.numel() == x.numel() && saved.numel() == 2 * N && w.numel() == C && b.numel() == C,
             "layer_norm_forward shapes");
    if (y.dtype() != x.dtype())  // in x's dtype, then rounded to y's
      return into_dtype(y, x.dtype(),
                        [&](Tensor t) { layer_norm_forward(t, saved, x, w, b, eps); });
    dispatch_float(x.dtype(), [&]<typename T>() {
      kernels::layer_norm_forward(static_cast<T*>(y.data()), static_cast<T*>(saved.data()),
                                  static_cast<const T*>(x.data()), static_cast<const T*>(w.data()),
                                  static_cast<const T*>(b.data()), C, eps, 0, N);
    });
  }
  void layer_norm_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w,
                           Tensor saved, Tensor residual) override {
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(residual.empty() || residual.numel() == x.numel(), "layer_norm_backward residual");
    dispatch_float(x.dtype(), [&]<typename T>() {
      const T *pdy = static_cast<const T*>(dy.data()), *px = static_cast<const T*>(x.data()),
              *ps = static_cast<const T*>(saved.data());
      kernels::layer_norm_backward_input(static_cast<T*>(dx.data()),
                                         static_cast<const T*>(residual.data()), pdy, px,
                                         static_cast<const T*>(w.data()), ps, C, 0, N);
      kernels::layer_norm_backward_params(static_cast<T*>(dw.data()), static_cast<T*>(db.data()),
                                          pdy, px, ps, N, C, 0, C);
    });
  }
  void gelu_forward(Tensor y, Tensor x, const ColumnMap& map) override {
    SF_CHECK(y.numel() == x.numel(), "gelu sizes");
    const int64_t C = map.width(x);
    if (y.dtype() != x.dtype())
      return into_dtype(y, x.dtype(), [&](Tensor t) { gelu_forward(t, x, map); });
    dispatch_float(x.dtype(), [&]<typename T>() {
      kernels::gelu_forward(static_cast<T*>(y.data()), static_cast<const T*>(x.data()),
                            static_cast<const T*>(map.scale.data()),
                            static_cast<const T*>(map.bias.data()), C, 0, x.numel());
    });
  }
  void gelu_backward(Tensor dx, Tensor dy, Tensor x, const ColumnMap& map) override {
    SF_CHECK(dx.numel() == x.numel() && dy.numel() == x.numel(), "gelu sizes");
    const int64_t C = map.width(x);
    dispatch_float(x.dtype(), [&]<typename T>() {
      std::vector<double> sums(static_cast<size_t>(map.dscale.empty() ? 0 : C), 0.0);
      kernels::gelu_backward(static_cast<T*>(dx.data()), sums.empty() ? nullptr : sums.data(),
                             static_cast<const T*>(dy.data()), static_cast<const T*>(x.data()),
                             static_cast<const T*>(map.scale.data()),
                             static_cast<const T*>(map.bias.data()), C, 0, x.numel());
      for (size_t c = 0; c < sums.size(); ++c)
        static_cast<T*>(map.dscale.data())[c] = static_cast<T>(sums[c]);
    });
  }
  void rms_norm_forward(Tensor y, Tensor saved, Tensor x, Tensor w, double offset,
                        double eps) override {
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(
        y.numel() == x.numel() && saved.numel() == N && w.numel() == C && y.dtype() == x.dtype(),
        "rms_norm_forward shapes");
    dispatch_float(x.dtype(), [&]<typename T>() {
      kernels::rms_norm_forward(static_cast<T*>(y.data()), static_cast<T*>(saved.data()),
                                static_cast<const T*>(x.data()), static_cast<const T*>(w.data()),
                                offset, C, eps, 0, N);
    });
  }
  void rms_norm_backward(Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w, double offset,
                         Tensor saved, Tensor residual) override {
    const int64_t C = x.shape()[x.shape().rank() - 1], N = x.numel() / C;
    SF_CHECK(dx.numel() == x.numel() && dy.numel() == x.numel() && saved.numel() == N &&
                 w.numel() == C && dw.numel() == C &&
                 (residual.empty() || residual.numel() == x.numel()),
             "rms_norm_backward shapes");
    dispatch_float(x.dtype(), [&]<typename T>() {
      const T *pdy = static_cast<const T*>(dy.data()), *px = static_cast<const T*>(x.data()),
              *ps = static_cast<const T*>(saved.data());
      kernels::rms_norm_backward_input(static_cast<T*>(dx.data()),
                                       static_cast<const T*>(residual.data()), pdy, px,
                                       static_cast<const T*>(w.data()), offset, ps, C, 0, N);
      kernels::rms_norm_backward_params(static_cast<T*>(dw.data()), pdy, px, ps, N, C, 0, C);
    });
  }
  void rotary(const Rotary& a, DType dtype) override {
    dispatch_float(dtype, [&]<typename T>() { kernels::rotary<T>(a, 0, a.rows); });
  }
  void glu_forward(Tensor y, Tensor gate, Tensor up, GluKind kind,
                   const GluAffine& affine) override {
    const int64_t C = affine.width(gate);
    SF_CHECK(y.numel() == gate.numel() && up.numel() == gate.numel(), "glu_forward sizes");
    if (gate.numel() == 0) return;
    dispatch_float(y.dtype(), [&]<typename T>() {
      kernels::glu_forward(static_cast<T*>(y.data()), static_cast<const T*>(gate.data()),
                           static_cast<const T*>(up.data()), glu_maps<T>(affine), kind, C, 0,
                           y.numel() / C);
    });
  }
  void glu_backward(Tensor dgate, Tensor dup, Tensor dy, Tensor gate, Tensor up, GluKind kind,
                    const GluAffine& affine) override {
    const int64_t C = affine.width(gate);
    SF_CHECK(dgate.numel() == dy.numel() && dup.numel() == dy.numel() &&
                 gate.numel() == dy.numel() && up.numel() == dy.numel(),
             "glu_backward sizes");
    dispatch_float(dy.dtype(), [&]<typename T>() {
      std::vector<double> gate_sums(static_cast<size_t>(C), 0.0), up_sums = gate_sums;
      if (dy.numel() > 0)
        kernels::glu_backward(static_cast<T*>(dgate.data()), static_cast<T*>(dup.data()),
                              gate_sums.data(), up_sums.data(), static_cast<const T*>(dy.data()),
                              static_cast<const T*>(gate.data()), static_cast<const T*>(up.data()),
                              glu_maps<T>(affine), kind, C, 0, dy.numel() / C);
      for (const auto& [out, sums] :
           {std::pair{affine.gate.dscale, &gate_sums}, std::pair{affine.up.dscale, &up_sums}})
        if (!out.empty())
          for (int64_t c = 0; c < C; ++c)
            static_cast<T*>(out.data())[c] = static_cast<T>((*sums)[size_t(c)]);
    });
  }
  void soft_cap_forward(Tensor y, Tensor x, double cap) override {
    SF_CHECK(y.numel() == x.numel() && cap > 0, "soft_cap_forward sizes or cap ", cap);
    dispatch_float(y.dtype(), [&]<typename T>() {
      kernels::soft_cap_forward(static_cast<T*>(y.data()), static_cast<const T*>(x.data()), cap, 0,
                                y.numel());
    });
  }
  void soft_cap_backward(Tensor dx, Tensor dy, Tensor y, double cap) override {
    SF_CHECK(dx.numel() == dy.numel() && y.numel() == dy.numel() && cap > 0,
             "soft_cap_backward sizes or cap ", cap);
    dispatch_float(dy.dtype(), [&]<typename T>() {
      kernels::soft_cap_backward(static_cast<T*>(dx.data()), static_cast<const T*>(dy.data()),
                                 static_cast<const T*>(y.data()), cap, 0, dy.numel());
    });
  }
  void run_scale_columns(Tensor y, int64_t ldy, const void* addend, Tensor x, Tensor s,
                         Tensor b) override {
    const int64_t C = s.numel();
    SF_CHECK(
        y.numel() == x.numel() && x.numel() % C == 0 && (b.empty() || b.numel() == C) && ldy >= C,
        "scale_columns shapes");
    dispatch_float(x.dtype(), [&]<typename T>() {
      kernels::scale_columns(static_cast<T*>(y.data()), ldy, static_cast<const T*>(addend),
                             static_cast<const T*>(x.data()), static_cast<const T*>(s.data()),
                             b.empty() ? nullptr : static_cast<const T*>(b.data()), C, 0,
                             x.numel() / C);
    });
  }
  void run_dora_backward(Tensor dpre, Tensor dm, Tensor dy, int64_t ldy, Tensor pre, Tensor scale,
                         Tensor inv_norm) override {
    const int64_t C = scale.numel();
    SF_CHECK(dpre.numel() == dy.numel() && pre.numel() == dy.numel() && dy.numel() % C == 0 &&
                 dm.numel() == C && inv_norm.numel() == C && ldy >= C,
             "dora_backward shapes");
    dispatch_float(dy.dtype(), [&]<typename T>() {
      std::vector<double> sums(static_cast<size_t>(C), 0.0);
      kernels::dora_backward_rows(static_cast<T*>(dpre.data()), sums.data(),
                                  static_cast<const T*>(dy.data()), ldy,
                                  static_cast<const T*>(pre.data()),
                                  static_cast<const T*>(scale.data()), C, 0, dy.numel() / C);
      T* out = static_cast<T*>(dm.data());
      const T* inv = static_cast<const T*>(inv_norm.data());
      for (int64_t j = 0; j < C; ++j) out[j] += static_cast<T>(sums[j] * double(inv[j]));
    });
  }
  void dora_norm(Tensor scale, Tensor inv_norm, Tensor v, Tensor m) override {
    const int64_t R = m.numel();
    SF_CHECK(scale.numel() == R && inv_norm.numel() == R && v.numel() % R == 0, "dora_norm shapes");
    dispatch_float(v.dtype(), [&]<typename T>() {
      kernels::dora_norm(static_cast<T*>(scale.data()), static_cast<T*>(inv_norm.data()),
                         static_cast<const T*>(v.data()), static_cast<const T*>(m.data()),
                         v.numel() / R, 0, R);
    });
  }
  void attention_forward(const AttentionForward& a, DType dtype) override {
    kernels::check_attention_shape(a.shape);
    SF_CHECK(a.first_row >= 0 && a.first_row <= a.shape.seq, "attention first row ", a.first_row,
             " of ", a.shape.seq);
    AttentionForward b = a;
    b.shape.seed = ref::seed_with_base(seed_base_, a.shape.seed);
    dispatch_float(dtype, [&]<typename T>() {
      kernels::attention_forward_reference<T>(b, 0, b.shape.batch * b.shape.heads);
    });
  }
  void attention_backward(const AttentionBackward& a, DType dtype) override {
    kernels::check_attention_shape(a.shape);
    AttentionBackward b = a;
    b.shape.seed = ref::seed_with_base(seed_base_, a.shape.seed);
    dispatch_float(dtype, [&]<typename T>() {
      kernels::attention_backward_reference<T>(b, 0, b.shape.batch * b.shape.kv());
    });
  }

  void embedding_forward(Tensor out, Tensor table, Tensor ids) override {
    const int64_t vocab = table.dim(0), e = table.dim(1);
    SF_CHECK(out.numel() == ids.numel() * e, "embedding output ", out.shape().str());
    const size_t row = e * dtype_size(table.dtype());
    for (int64_t i = 0; i < ids.numel(); ++i) {
      const int64_t id = id_at(ids, i);
      if (id < 0 || id >= vocab)
        fail("token id ", id, " at position ", i, " outside [0, ", vocab, ")");
      std::memcpy(static_cast<char*>(out.data()) + i * row,
                  static_cast<const char*>(table.data()) + id * row, row);
    }
  }

  void embedding_backward(Tensor dtable, Tensor dout, Tensor ids) override {
    const int64_t vocab = dtable.dim(0), e = dtable.dim(1);
    dispatch_float(dtable.dtype(), [&]<typename T>() {
      T* dt = static_cast<T*>(dtable.data());
      const T* d = static_cast<const T*>(dout.data());
      for (int64_t i = 0; i < ids.numel(); ++i) {
        const int64_t id = id_at(ids, i);
        if (id < 0 || id >= vocab) fail("token id ", id, " outside [0, ", vocab, ")");
        for (int64_t j = 0; j < e; ++j) dt[id * e + j] += d[i * e + j];
      }
    });
  }

  void regression_loss(const RegressionLoss& kind, Tensor pred, Tensor target, Tensor mask,
                       Tensor dpred, Tensor loss) override {
    store_scalar(loss, regression(kind, pred, target, mask, dpred));
  }
  void cross_entropy_loss(Tensor logits, Tensor targets, Tensor weights, int64_t ignore_index,
                          Tensor dlogits, Tensor loss) override {
    store_scalar(loss, cross_entropy(logits, targets, weights, ignore_index, dlogits));
  }
  void sum_squares(Tensor x, Tensor out) override {
    store_scalar(out, dispatch_float(x.dtype(), [&]<typename T>() {
                   const T* p = static_cast<const T*>(x.data());
                   double acc = 0;
                   for (int64_t i = 0; i < x.numel(); ++i) acc += double(p[i]) * double(p[i]);
                   return acc;
                 }));
  }

  void scale(Tensor x, double alpha) override {
    dispatch_float(x.dtype(), [&]<typename T>() {
      T* p = static_cast<T*>(x.data());
      for (int64_t i = 0; i < x.numel(); ++i) p[i] *= static_cast<T>(alpha);
    });
  }

  void adam_step(Tensor params, Tensor grads, Tensor m, Tensor v, const AdamParams& a) override {
    dispatch_float(params.dtype(), [&]<typename T>() {
      ref::adam_step<T>(params.data_as<T>(), grads.data_as<T>(), m.data_as<T>(), v.data_as<T>(), a,
                        0, params.numel());
    });
  }
  void sgd_step(Tensor params, Tensor grads, Tensor momentum, const SgdParams& a) override {
    dispatch_float(params.dtype(), [&]<typename T>() {
      ref::sgd_step<T>(params.data_as<T>(), grads.data_as<T>(),
                       momentum.empty() ? nullptr : momentum.data_as<T>(), a, 0, params.numel());
    });
  }

 private:
  double regression(const RegressionLoss& kind, Tensor pred, Tensor target, Tensor mask,
                    Tensor dpred) {
    SF_CHECK(pred.numel() == target.numel() && pred.numel() == dpred.numel(), "loss: prediction ",
             pred.shape().str(), " vs target ", target.shape().str());
    const int64_t rows = row_count(pred), f = row_size(pred);
    SF_CHECK(mask.empty() || mask.numel() == rows, "mse mask ", mask.shape().str(), " for ", rows,
             " rows");
    return dispatch_float(pred.dtype(), [&]<typename T>() {
      const T* p = static_cast<const T*>(pred.data());
      const T* t = static_cast<const T*>(target.data());
      const T* m = mask.empty() ? nullptr : static_cast<const T*>(mask.data());
      T* d = static_cast<T*>(dpred.data());
      int64_t selected = 0;
      for (int64_t r = 0; r < rows; ++r) selected += (!m || m[r] != T(0));
      const double denom = double(selected) * double(f);
      double loss = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const bool on = !m || m[r] != T(0);
        for (int64_t j = 0; j < f; ++j) {
          const double diff = double(p[r * f + j]) - double(t[r * f + j]);
          double value, grad;
          ref::regression_term(kind, diff, j, &value, &grad);
          if (on) loss += value;
          d[r * f + j] = on ? static_cast<T>(grad / denom) : T(0);
        }
      }
      return selected ? loss / denom : 0.0;
    });
  }

  double cross_entropy(Tensor logits, Tensor targets, Tensor weights, int64_t ignore_index,
                       Tensor dlogits) {
    const int64_t rows = logits.dim(0), classes = logits.dim(1);
    SF_CHECK(targets.numel() == rows, "cross-entropy: ", rows, " rows of logits, ", targets.numel(),
             " targets");
    SF_CHECK(weights.empty() || weights.numel() == classes, "class weights ", weights.shape().str(),
             " for ", classes, " classes");
    return dispatch_float(logits.dtype(), [&]<typename T>() {
      const T* x = static_cast<const T*>(logits.data());
      const T* w = weights.empty() ? nullptr : static_cast<const T*>(weights.data());
      T* d = static_cast<T*>(dlogits.data());
      double total_weight = 0, loss = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t y = id_at(targets, r);
        if (y == ignore_index) continue;
        if (y < 0 || y >= classes)
          fail("target class ", y, " at row ", r, " outside [0, ", classes, ")");
        total_weight += w ? double(w[y]) : 1.0;
      }
      for (int64_t r = 0; r < rows; ++r) {
        const T* xr = x + r * classes;
        T* dr = d + r * classes;
        const int64_t y = id_at(targets, r);
        if (y == ignore_index || total_weight == 0) {
          for (int64_t j = 0; j < classes; ++j) dr[j] = T(0);
          continue;
        }
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < classes; ++j) mx = std::max(mx, double(xr[j]));
        double sum = 0;
        for (int64_t j = 0; j < classes; ++j) sum += std::exp(double(xr[j]) - mx);
        const double lse = mx + std::log(sum);
        const double wy = w ? double(w[y]) : 1.0;
        loss += wy * (lse - double(xr[y]));
        const double coef = wy / total_weight;
        for (int64_t j = 0; j < classes; ++j)
          dr[j] = static_cast<T>(coef * (std::exp(double(xr[j]) - lse) - (j == y ? 1.0 : 0.0)));
      }
      return total_weight > 0 ? loss / total_weight : 0.0;
    });
  }
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace seqforge
