#pragma once
// What the GEMM libraries do on this machine (for `seqforge diagnose`): oneDNN's version, the
// instruction set it dispatches to and the matmul implementation it picks for a problem; OpenBLAS
// and BLIS, the other f32 providers, and which the CPU backend would choose for a problem.
#include <cstdint>
#include <string>

namespace seqforge {

struct OneDnnInfo {
  std::string version;  // "2.6.3"
  std::string isa;      // the most capable ISA oneDNN will use here ("avx512_core_bf16")
};
OneDnnInfo onednn_info();

// The implementation oneDNN chooses for C(m, n) = A(m, k) B(k, n) with f32 or bf16 operands
// ("brg:avx512_core_bf16"), or "unavailable: <reason>".
std::string onednn_matmul_kernel(int64_t m, int64_t n, int64_t k, bool bf16);

// "OpenBLAS 0.3.21 ..., Haswell kernels" and "BLIS 0.9.0 ..., zen3 kernels", or why the CPU
// backend runs no GEMM on it.
std::string openblas_status();
std::string blis_status();
// C(m, n) = A(m, k) B(k, n) in f32 on every provider, timed as the CPU backend does on a shape's
// first use: "onednn 0.12 ms, openblas 0.20 ms, blis 0.18 ms -> onednn" (a provider that is not
// there is left out).
std::string f32_gemm_race(int64_t m, int64_t n, int64_t k);

// Whether bf16 GEMMs pay off on this CPU, what train.precision auto takes: it has AVX512-BF16 or
// AMX-BF16, and oneDNN's bf16 GEMMs run at least 1.2x as fast as its f32 ones (AMX's and Zen 4's
// do; an Intel core's AVX512-BF16 without AMX runs vdpbf16ps at half its f32 FMA rate). Timed
// once per machine (cached; with SEQFORGE_AUTOTUNE=0 the instructions alone decide). `why`, when
// given, says so in a line.
bool bf16_gemms_pay_off(std::string* why = nullptr);

}  // namespace seqforge
