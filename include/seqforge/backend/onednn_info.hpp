#pragma once
// What oneDNN does on this machine: its version, the instruction set it dispatches to, and the
// matmul implementation it picks for a given problem (for `seqforge diagnose`).
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

}  // namespace seqforge
