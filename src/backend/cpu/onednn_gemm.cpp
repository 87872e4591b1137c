#include "backend/cpu/onednn_gemm.hpp"

#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>

namespace seqforge::cpu {

namespace {
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                       float, bool, DType>;
Key key_of(const GemmShape& s, DType operands) {
  return {s.trans_a, s.trans_b, s.m, s.n, s.k, s.lda, s.ldb, s.ldc, s.alpha, s.beta, s.bias,
          operands};
}
}  // namespace

struct OneDnnGemm::Impl {
  struct Entry {
    dnnl::matmul prim;
    dnnl::memory a, b, c, bias;
  };
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mutex;
  std::map<Key, Entry> cache;

  Entry& get(const GemmShape& s, DType operands) {
    std::lock_guard lock(mutex);
    const Key key = key_of(s, operands);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
    using dt = dnnl::memory::data_type;
    using dims = dnnl::memory::dims;
    const dt in = operands == DType::bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc a_md({s.m, s.k}, in, s.trans_a ? dims{1, s.lda} : dims{s.lda, 1});
    const dnnl::memory::desc b_md({s.k, s.n}, in, s.trans_b ? dims{1, s.ldb} : dims{s.ldb, 1});
    const dnnl::memory::desc c_md({s.m, s.n}, dt::f32, dims{s.ldc, 1});
    const dnnl::memory::desc bias_md({1, s.n}, dt::f32, dims{s.n, 1});
    dnnl::primitive_attr attr;
    if (s.alpha != 1.0f) attr.set_output_scales(0, {s.alpha});
    if (s.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(s.beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::desc desc = s.bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md)
                                           : dnnl::matmul::desc(a_md, b_md, c_md);
    const dnnl::matmul::primitive_desc pd(desc, attr, engine);
    Entry e{dnnl::matmul(pd), dnnl::memory(a_md, engine, nullptr),
            dnnl::memory(b_md, engine, nullptr), dnnl::memory(c_md, engine, nullptr),
            dnnl::memory(bias_md, engine, nullptr)};
    return cache.emplace(key, std::move(e)).first->second;
  }
};

OneDnnGemm::OneDnnGemm() : impl_(std::make_unique<Impl>()) {}
OneDnnGemm::~OneDnnGemm() = default;

size_t OneDnnGemm::cached_primitives() const { return impl_->cache.size(); }

void OneDnnGemm::run(const GemmShape& s, DType operands, const void* a, const void* b, float* c,
                     const float* bias) {
  SF_CHECK(operands == DType::f32 || operands == DType::bf16, "oneDNN GEMM on ",
           dtype_name(operands));
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {  // C = beta * C (+ bias)
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        float& out = c[i * s.ldc + j];
        out = (s.beta == 0.0f ? 0.0f : s.beta * out) + (bias ? bias[j] : 0.0f);
      }
    }
    return;
  }
  Impl::Entry& e = impl_->get(s, operands);
  e.a.set_data_handle(const_cast<void*>(a));
  e.b.set_data_handle(const_cast<void*>(b));
  e.c.set_data_handle(c);
  if (bias) {
    e.bias.set_data_handle(const_cast<float*>(bias));
    e.prim.execute(impl_->stream, {{DNNL_ARG_SRC, e.a},
                                   {DNNL_ARG_WEIGHTS, e.b},
                                   {DNNL_ARG_BIAS, e.bias},
                                   {DNNL_ARG_DST, e.c}});
  } else {
    e.prim.execute(impl_->stream,
                   {{DNNL_ARG_SRC, e.a}, {DNNL_ARG_WEIGHTS, e.b}, {DNNL_ARG_DST, e.c}});
  }
  impl_->stream.wait();
}

}  // namespace seqforge::cpu
