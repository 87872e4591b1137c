#include "seqforge/core/error.hpp"

#include <cstdio>

namespace seqforge {

namespace {
// The length of the UTF-8 sequence at s[i], or 0 where none starts there.
size_t utf8_length(const std::string& s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  // Overlong three- and four-byte forms, surrogates and code points past U+10FFFF.
  if ((c == 0xe0 && byte(i + 1) < 0xa0) || (c == 0xed && byte(i + 1) >= 0xa0) ||
      (c == 0xf0 && byte(i + 1) < 0x90) || (c == 0xf4 && byte(i + 1) >= 0x90))
    return 0;
  return n;
}
}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += text[i++];
    } else if (c == '\n') {
      out += "\\n", ++i;
    } else if (c == 0) {
      out += "\\0", ++i;
    } else if (const size_t n = c >= 0x80 ? utf8_length(text, i) : 0; n > 0) {
      out.append(text, i, n), i += n;
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex, ++i;
    }
  }
  return out;
}

namespace detail {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  throw Error(
      printable(concat(file, ":", line, ": check failed: ", cond, msg.empty() ? "" : ": ", msg)));
}

}  // namespace detail
}  // namespace seqforge
