#include "seqforge/seqforge.hpp"

namespace seqforge {
const char* version() { return SEQFORGE_VERSION; }
}  // namespace seqforge
