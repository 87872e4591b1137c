#include "seqforge/backend/onednn_info.hpp"

#include <oneapi/dnnl/dnnl.hpp>

namespace seqforge {

OneDnnInfo onednn_info() {
  OneDnnInfo info;
  const dnnl_version_t* v = dnnl_version();
  info.version =
      std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      info.isa = "sse41";
      break;
    case dnnl_cpu_isa_avx:
      info.isa = "avx";
      break;
    case dnnl_cpu_isa_avx2:
      info.isa = "avx2";
      break;
    case dnnl_cpu_isa_avx2_vnni:
      info.isa = "avx2_vnni";
      break;
    case dnnl_cpu_isa_avx512_mic:
      info.isa = "avx512_mic";
      break;
    case dnnl_cpu_isa_avx512_mic_4ops:
      info.isa = "avx512_mic_4ops";
      break;
    case dnnl_cpu_isa_avx512_core:
      info.isa = "avx512_core";
      break;
    case dnnl_cpu_isa_avx512_core_vnni:
      info.isa = "avx512_core_vnni";
      break;
    case dnnl_cpu_isa_avx512_core_bf16:
      info.isa = "avx512_core_bf16";
      break;
    case dnnl_cpu_isa_avx512_core_amx:
      info.isa = "avx512_core_amx";
      break;
    default:
      info.isa = "other";
      break;
  }
  return info;
}

std::string onednn_matmul_kernel(int64_t m, int64_t n, int64_t k, bool bf16) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  try {
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    const dt in = bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc a({m, k}, in, tag::ab), b({k, n}, in, tag::ab),
        c({m, n}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine);
    return pd.impl_info_str();
  } catch (const dnnl::error& e) {
    return std::string("unavailable: ") + e.what();
  }
}

}  // namespace seqforge
