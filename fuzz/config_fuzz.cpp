// libFuzzer target: Config::parse of a YAML config (a file, or a checkpoint's stored config) must
// accept it or throw seqforge::Error; an accepted config's resolved YAML must parse back to the
// same config. Any other exception, a crash, a sanitizer report or a hang is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "seqforge/core/error.hpp"
#include "seqforge/train/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::string resolved;
  try {
    resolved = seqforge::Config::parse(text, "fuzz.yaml", {}).resolved_yaml();
  } catch (const seqforge::Error&) {
    return 0;  // rejected with one line: the expected outcome for most inputs
  }
  try {
    if (seqforge::Config::parse(resolved, "resolved.yaml", {}).resolved_yaml() != resolved) {
      std::fprintf(stderr, "config_fuzz: the resolved config differs once read back:\n%s\n",
                   resolved.c_str());
      std::abort();
    }
  } catch (const seqforge::Error& e) {
    std::fprintf(stderr, "config_fuzz: the resolved config does not read back: %s\n%s\n", e.what(),
                 resolved.c_str());
    std::abort();
  }
  return 0;
}
