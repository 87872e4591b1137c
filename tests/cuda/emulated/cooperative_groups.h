#pragma once
// The grid-wide barrier of a cooperative launch (cuda_runtime.h's SF_LAUNCH_COOPERATIVE runs all
// its blocks' threads together).
#include "cuda_runtime.h"

namespace cooperative_groups {
struct grid_group {
  void sync() const { sf_emu::scheduler.wait(sf_emu::Fiber::at_grid_barrier); }
};
inline grid_group this_grid() { return {}; }
}  // namespace cooperative_groups
