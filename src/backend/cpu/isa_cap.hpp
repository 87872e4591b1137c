#pragma once
// SEQFORGE_MAX_ISA applied to the libraries that dispatch by themselves: oneDNN's JIT kernels
// (its max CPU ISA) and Highway's targets. Called before either is first used.

namespace seqforge::cpu {

void cap_library_dispatch();

}  // namespace seqforge::cpu
