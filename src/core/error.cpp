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

size_t bidi_control(std::string_view s, size_t i, unsigned* code) {
  const auto byte = [&](size_t k) { return i + k < s.size() ? unsigned(uint8_t(s[i + k])) : 0u; };
  if (byte(0) == 0xd8 && byte(1) == 0x9c) return *code = 0x061c, 2;
  if (byte(0) != 0xe2 || (byte(1) != 0x80 && byte(1) != 0x81) || (byte(2) & 0xc0) != 0x80) return 0;
  const unsigned c = 0x2000 | (byte(1) & 0x3f) << 6 | (byte(2) & 0x3f);
  if (c != 0x200e && c != 0x200f && !(c >= 0x202a && c <= 0x202e) && !(c >= 0x2066 && c <= 0x2069))
    return 0;
  return *code = c, 3;
}

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
      unsigned code = 0;
      if (bidi_control(text, i, &code) == n) {
        char escaped[8];
        std::snprintf(escaped, sizeof escaped, "\\u%04x", code);
        out += escaped;
      } else {
        out.append(text, i, n);
      }
      i += n;
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
