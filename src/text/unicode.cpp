#include "text/unicode.hpp"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <array>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::text {

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  return 4;
}

void check_utf8(std::string_view s, const std::string& what) {
  if (const size_t at = io::first_non_utf8(s); at != std::string_view::npos)
    fail(what, ": invalid UTF-8 at byte offset ", at);
}

char32_t decode_utf8(std::string_view s, size_t i, size_t* length) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const size_t len = utf8_length(p[0]);
  *length = len;
  if (len == 1) return p[0];
  char32_t cp = p[0] & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[k] & 0x3F);
  return cp;
}

bool is_whitespace(char32_t c) { return u_hasBinaryProperty(UChar32(c), UCHAR_WHITE_SPACE); }

bool is_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
      (c >= 123 && c <= 126))
    return true;
  return (U_GET_GC_MASK(UChar32(c)) & U_GC_P_MASK) != 0;
}

bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  return (U_GET_GC_MASK(UChar32(c)) & U_GC_C_MASK) != 0;
}

bool is_nonspacing_mark(char32_t c) { return u_charType(UChar32(c)) == U_NON_SPACING_MARK; }

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

namespace {

std::u16string to_utf16(std::string_view s) {
  std::u16string out(s.size(), u'\0');
  int32_t len = 0;
  UErrorCode err = U_ZERO_ERROR;
  u_strFromUTF8(reinterpret_cast<UChar*>(out.data()), int32_t(out.size()), &len, s.data(),
                int32_t(s.size()), &err);
  SF_CHECK(U_SUCCESS(err), "UTF-16 conversion: ", u_errorName(err));
  out.resize(size_t(len));
  return out;
}

std::string to_utf8(const std::u16string& s) {
  std::string out(s.size() * 3, '\0');
  int32_t len = 0;
  UErrorCode err = U_ZERO_ERROR;
  u_strToUTF8(out.data(), int32_t(out.size()), &len, reinterpret_cast<const UChar*>(s.data()),
              int32_t(s.size()), &err);
  SF_CHECK(U_SUCCESS(err), "UTF-8 conversion: ", u_errorName(err));
  out.resize(size_t(len));
  return out;
}

// Runs an ICU transformation that may need a larger buffer than its input.
template <typename Fn>
std::u16string grow_until_fits(size_t first_capacity, Fn fn) {
  std::u16string out(first_capacity, u'\0');
  for (;;) {
    UErrorCode err = U_ZERO_ERROR;
    const int32_t len = fn(reinterpret_cast<UChar*>(out.data()), int32_t(out.size()), &err);
    if (err == U_BUFFER_OVERFLOW_ERROR) {
      out.assign(size_t(len), u'\0');
      continue;
    }
    SF_CHECK(U_SUCCESS(err), "ICU: ", u_errorName(err));
    out.resize(size_t(len));
    return out;
  }
}

}  // namespace

std::string normalize(std::string_view s, NormalForm form) {
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* n = form == NormalForm::nfc    ? unorm2_getNFCInstance(&err)
                          : form == NormalForm::nfd  ? unorm2_getNFDInstance(&err)
                          : form == NormalForm::nfkc ? unorm2_getNFKCInstance(&err)
                                                     : unorm2_getNFKDInstance(&err);
  SF_CHECK(U_SUCCESS(err), "ICU normalizer: ", u_errorName(err));
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(s);  // every normal form leaves ASCII as it is
  const std::u16string in = to_utf16(s);
  return to_utf8(grow_until_fits(in.size() * 2 + 8, [&](UChar* dst, int32_t cap, UErrorCode* e) {
    return unorm2_normalize(n, reinterpret_cast<const UChar*>(in.data()), int32_t(in.size()), dst,
                            cap, e);
  }));
}

std::string to_lower(std::string_view s) {
  bool ascii = true;
  for (char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) {
    std::string out(s);
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    return out;
  }
  const std::u16string in = to_utf16(s);
  return to_utf8(grow_until_fits(in.size() + 8, [&](UChar* dst, int32_t cap, UErrorCode* e) {
    return u_strToLower(dst, cap, reinterpret_cast<const UChar*>(in.data()), int32_t(in.size()), "",
                        e);
  }));
}

namespace {

struct ByteAlphabet {
  std::array<std::string, 256> chars;
  std::array<int16_t, 512> bytes;  // by code point; every mapped character is below U+0200
  ByteAlphabet() {
    bytes.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const char32_t c = printable ? char32_t(b) : char32_t(next++);
      io::append_utf8(chars[size_t(b)], c);
      bytes[c] = int16_t(b);
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

}  // namespace

const std::string& byte_to_char(uint8_t b) { return byte_alphabet().chars[b]; }

int char_to_byte(char32_t c) { return c < 512 ? byte_alphabet().bytes[c] : -1; }

}  // namespace seqforge::text
