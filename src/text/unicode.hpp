#pragma once
// Unicode for the tokenizers: UTF-8 checks and iteration, character classes and normalisation
// (ICU), regular expressions with Unicode classes and look-around (Oniguruma, the engine the
// reference tokenizers use), and the byte-level alphabet of GPT-2 style BPE.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace seqforge::text {

// Throws naming `what` and the offset of the first byte that is not UTF-8.
void check_utf8(std::string_view s, const std::string& what);

// The code point starting at s[i] (valid UTF-8 assumed) and its length in bytes.
char32_t decode_utf8(std::string_view s, size_t i, size_t* length);
size_t utf8_length(unsigned char lead);

bool is_whitespace(char32_t c);   // Unicode White_Space
bool is_punctuation(char32_t c);  // general category P*, or ASCII punctuation and symbols
bool is_control(char32_t c);
bool is_nonspacing_mark(char32_t c);  // general category Mn
bool is_cjk(char32_t c);

enum class NormalForm { nfc, nfd, nfkc, nfkd };
std::string normalize(std::string_view s, NormalForm form);
std::string to_lower(std::string_view s);  // full Unicode lowercasing (final sigma included)

// A compiled pattern in Oniguruma's Ruby syntax over UTF-8.
class Regex {
 public:
  // Throws naming `where` with the engine's message when the pattern does not compile.
  Regex(std::string_view pattern, const std::string& where);
  Regex(Regex&&) noexcept;
  ~Regex();
  // Non-overlapping, non-empty matches from left to right, as [begin, end) byte offsets.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

// GPT-2's byte-to-character map: printable bytes stand for themselves, the others for
// U+0100 onwards. Each entry is that character's UTF-8.
const std::string& byte_to_char(uint8_t b);
// The byte a byte-level character stands for, or -1.
int char_to_byte(char32_t c);

}  // namespace seqforge::text
