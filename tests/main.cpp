// The test driver's entry point. It restarts with short OpenMP spin waits, as the CLI does (ctest
// runs two 2-thread tests at once on two cores). `--max-isa=TIER` runs every test under
// SEQFORGE_MAX_ISA=TIER, so that one machine also proves the lower tiers' kernels. Where the CPU
// lacks TIER, or TIER is the CPU's own (the uncapped run), the run skips at once, saying so.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "seqforge/core/cpu.hpp"
#include "seqforge/core/threads.hpp"

int main(int argc, char** argv) {
  seqforge::restart_with_short_omp_spin_waits(argv);
  ::testing::InitGoogleTest(&argc, argv);
  constexpr std::string_view flag = "--max-isa=";
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.rfind(flag, 0) != 0) {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      return 2;
    }
    setenv("SEQFORGE_MAX_ISA", argv[i] + flag.size(), 1);
  }
  try {
    const std::optional<seqforge::IsaTier> cap = seqforge::isa_cap();
    const seqforge::IsaTier machine = seqforge::machine_isa_tier();
    if (cap && *cap >= machine && !::testing::GTEST_FLAG(list_tests)) {
      std::printf("[  SKIPPED ] --max-isa=%s: this CPU reaches %s, %s\n",
                  seqforge::isa_tier_name(*cap), seqforge::isa_tier_name(machine),
                  *cap == machine ? "so the uncapped run covers it" : "below the tier");
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  return RUN_ALL_TESTS();
}
