#include "seqforge/core/error.hpp"

namespace seqforge::detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(concat(file, ":", line, ": check failed: ", cond, msg.empty() ? "" : ": ", msg));
}

}  // namespace seqforge::detail
