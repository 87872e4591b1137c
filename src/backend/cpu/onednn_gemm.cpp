#include "backend/cpu/onednn_gemm.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>

#include "backend/cpu/isa_cap.hpp"
#include "seqforge/backend/onednn_info.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::cpu {

namespace {
// One CPU engine for the process: per-thread streams and scratch memory are bound to it.
const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine = [] {
    cap_library_dispatch();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
  return engine;
}

// A thread's scratch memory for oneDNN, grown to the largest primitive's need and kept.
struct Scratch {
  std::unique_ptr<char[]> data;
  size_t bytes = 0;
  dnnl::memory mem;
  dnnl::memory& get(const dnnl::engine& engine, size_t need) {
    if (need > bytes || !mem) {
      bytes = std::max<size_t>(need, 64);
      data.reset(new char[bytes + 64]);
      void* p = data.get();
      size_t space = bytes + 64;
      std::align(64, bytes, p, space);
      mem = dnnl::memory(
          {{static_cast<int64_t>(bytes)}, dnnl::memory::data_type::u8, dnnl::memory::format_tag::x},
          engine, p);
    }
    return mem;
  }
};

// Primitives are planned for the threads they will run on: one inside a parallel region (or
// under omp_set_num_threads(1)), else the pool.
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                       double, bool, DType, int, bool>;
Key key_of(const GemmShape& s, DType operands, bool packed) {
  return {s.trans_a,
          s.trans_b,
          s.m,
          s.n,
          s.k,
          s.lda,
          s.ldb,
          s.ldc,
          s.alpha,
          s.beta,
          s.bias,
          operands,
          omp_in_parallel() ? 1 : omp_get_max_threads(),
          packed};
}

// One line naming the GEMM, its operands' dtype and the ISA oneDNN dispatches to, in place of
// oneDNN's own message alone.
[[noreturn]] void fail_in_onednn(const GemmShape& s, DType operands, const char* what,
                                 const dnnl::error& e) {
  fail("GEMM ", s.m, "x", s.n, "x", s.k, " with ", dtype_name(operands), " operands: oneDNN ", what,
       " on this CPU (dispatching up to ", onednn_info().isa, ", SEQFORGE_MAX_ISA tier ",
       isa_tier_name(isa_tier()), "): ", e.what());
}

// B reordered into a primitive's preferred layout; `plain` is the source's layout.
struct OneDnnPackedB final : PackedB {
  dnnl::memory::desc layout, plain;
  dnnl::memory packed, source;
  dnnl::reorder reorder;
};
}  // namespace

struct OneDnnGemm::Impl {
  struct Entry {
    dnnl::matmul prim;
    dnnl::memory::desc a, b, c, bias;  // b: the layout the primitive takes
    dnnl::memory::desc b_plain;        // b as the caller stores it
    size_t scratch_bytes;
    uint64_t id;  // unique for the process's lifetime; keys per-thread state
  };
  const dnnl::engine& engine = cpu_engine();
  std::mutex mutex;
  std::map<Key, Entry> cache;
  // Which instance a thread's argument lists belong to (see execute).
  const uint64_t serial = [] {
    static std::atomic<uint64_t> next{1};
    return next++;
  }();

  Entry& get(const GemmShape& s, DType operands, bool packed) {
    std::lock_guard lock(mutex);
    const Key key = key_of(s, operands, packed);
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
    // Scratch memory comes from a buffer kept per thread: oneDNN's own would be allocated, and
    // page-faulted in, on every call.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (s.alpha != 1.0) attr.set_output_scales(0, {static_cast<float>(s.alpha)});
    if (s.beta != 0.0) {
      dnnl::post_ops ops;
      ops.append_sum(static_cast<float>(s.beta));
      attr.set_post_ops(ops);
    }
    const dnnl::memory::desc b_any({s.k, s.n}, in, dnnl::memory::format_tag::any);
    const dnnl::memory::desc& b_want = packed ? b_any : b_md;
    const dnnl::matmul::desc desc = s.bias ? dnnl::matmul::desc(a_md, b_want, bias_md, c_md)
                                           : dnnl::matmul::desc(a_md, b_want, c_md);
    const dnnl::matmul::primitive_desc pd = describe(desc, attr, s, operands);
    static std::atomic<uint64_t> next_id{0};
    Entry e{dnnl::matmul(pd),
            a_md,
            pd.weights_desc(),
            c_md,
            bias_md,
            b_md,
            pd.scratchpad_desc().get_size(),
            next_id++};
    return cache.emplace(key, std::move(e)).first->second;
  }

  // The primitive for `desc`, or one line naming the GEMM (a bf16 GEMM on a CPU without bf16
  // dot products, say).
  dnnl::matmul::primitive_desc describe(const dnnl::matmul::desc& desc,
                                        const dnnl::primitive_attr& attr, const GemmShape& s,
                                        DType operands) {
    try {
      return dnnl::matmul::primitive_desc(desc, attr, engine);
    } catch (const dnnl::error& e) {
      fail_in_onednn(s, operands, "has no kernel for it", e);
    }
  }

  void execute(const Entry& e, const void* a, const void* b, float* c, const float* bias) {
    // Memory objects and argument lists per thread and primitive, made once, so that GEMMs may
    // run concurrently and a call allocates nothing.
    struct Args {
      dnnl::memory a, b, c, bias;
      std::unordered_map<int, dnnl::memory> plain, with_bias;
    };
    thread_local std::map<uint64_t, Args> args_of;
    thread_local uint64_t args_owner = 0;
    thread_local Scratch scratch;
    thread_local dnnl::stream stream(engine);
    // A thread keeps the lists of the instance it last ran: a process that makes backend after
    // backend (a Python session, a study) would otherwise keep every earlier one's.
    if (args_owner != serial) args_of.clear(), args_owner = serial;
    auto [it, fresh] = args_of.try_emplace(e.id);
    Args& m = it->second;
    dnnl::memory& scratch_mem = scratch.get(engine, e.scratch_bytes);
    if (fresh || m.plain.at(DNNL_ARG_SCRATCHPAD) != scratch_mem) {
      if (fresh) {
        m.a = dnnl::memory(e.a, engine, nullptr);
        m.b = dnnl::memory(e.b, engine, nullptr);
        m.c = dnnl::memory(e.c, engine, nullptr);
        m.bias = dnnl::memory(e.bias, engine, nullptr);
      }
      m.plain = {{DNNL_ARG_SRC, m.a},
                 {DNNL_ARG_WEIGHTS, m.b},
                 {DNNL_ARG_DST, m.c},
                 {DNNL_ARG_SCRATCHPAD, scratch_mem}};
      m.with_bias = m.plain;
      m.with_bias[DNNL_ARG_BIAS] = m.bias;
    }
    m.a.set_data_handle(const_cast<void*>(a));
    m.b.set_data_handle(const_cast<void*>(b));
    m.c.set_data_handle(c);
    if (bias) m.bias.set_data_handle(const_cast<float*>(bias));
    e.prim.execute(stream, bias ? m.with_bias : m.plain);
    stream.wait();
  }
};

OneDnnGemm::OneDnnGemm() : impl_(std::make_unique<Impl>()) {}
OneDnnGemm::~OneDnnGemm() = default;

void OneDnnGemm::run(const GemmShape& s, DType operands, const void* a, const void* b, float* c,
                     const float* bias) {
  SF_CHECK(operands == DType::f32 || operands == DType::bf16, "oneDNN GEMM on ",
           dtype_name(operands));
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0) {  // C = beta * C (+ bias)
    for (int64_t i = 0; i < s.m; ++i) {
      for (int64_t j = 0; j < s.n; ++j) {
        float& out = c[i * s.ldc + j];
        out = (s.beta == 0.0 ? 0.0f : static_cast<float>(s.beta) * out) + (bias ? bias[j] : 0.0f);
      }
    }
    return;
  }
  try {
    impl_->execute(impl_->get(s, operands, false), a, b, c, bias);
  } catch (const dnnl::error& e) {
    fail_in_onednn(s, operands, "failed", e);
  }
}

void OneDnnGemm::pack(const GemmShape& s, DType operands, const void* b,
                      std::unique_ptr<PackedB>* out) {
  SF_CHECK(operands == DType::f32 || operands == DType::bf16, "oneDNN GEMM on ",
           dtype_name(operands));
  if (s.m == 0 || s.n == 0 || s.k == 0) return out->reset();
  try {
    pack_planned(s, operands, b, out);
  } catch (const dnnl::error& e) {
    fail_in_onednn(s, operands, "failed to pack B", e);
  }
}

void OneDnnGemm::pack_planned(const GemmShape& s, DType operands, const void* b,
                              std::unique_ptr<PackedB>* out) {
  const Impl::Entry& e = impl_->get(s, operands, true);
  auto* p = dynamic_cast<OneDnnPackedB*>(out->get());
  if (!p || p->layout != e.b || p->plain != e.b_plain) {
    auto fresh = std::make_unique<OneDnnPackedB>();
    fresh->layout = e.b;
    fresh->plain = e.b_plain;
    fresh->packed = dnnl::memory(e.b, impl_->engine);
    fresh->source = dnnl::memory(e.b_plain, impl_->engine, nullptr);
    fresh->reorder = dnnl::reorder(fresh->source, fresh->packed);
    p = fresh.get();
    *out = std::move(fresh);
  }
  thread_local dnnl::stream stream(impl_->engine);
  p->source.set_data_handle(const_cast<void*>(b));
  p->reorder.execute(stream, p->source, p->packed);
  stream.wait();
}

void OneDnnGemm::run_packed(const GemmShape& s, DType operands, const void* a, const void* b,
                            const PackedB& packed, float* c, const float* bias) {
  const auto& p = static_cast<const OneDnnPackedB&>(packed);
  if (s.m == 0 || s.n == 0 || s.k == 0) return run(s, operands, a, b, c, bias);
  try {
    const Impl::Entry& e = impl_->get(s, operands, true);
    if (e.b == p.layout) return impl_->execute(e, a, p.packed.get_data_handle(), c, bias);
  } catch (const dnnl::error& e) {
    fail_in_onednn(s, operands, "failed", e);
  }
  run(s, operands, a, b, c, bias);  // planned for another layout (another thread count)
}

}  // namespace seqforge::cpu
