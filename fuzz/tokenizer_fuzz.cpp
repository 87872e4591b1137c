// libFuzzer target: a tokenizer.json and a text, separated by the first NUL byte. Reading must
// either build a tokenizer or throw seqforge::Error; a built one must encode the text (or throw
// seqforge::Error when it is not UTF-8), give ids inside its vocabulary, and decode them. Any
// other exception, a crash, a hang or a sanitizer report is a bug.
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "seqforge/core/error.hpp"
#include "seqforge/text/tokenizer.hpp"

namespace {

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "tokenizer_fuzz: invariant violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const size_t nul = bytes.find('\0');
  const std::string_view json = bytes.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? "" : bytes.substr(nul + 1);
  using seqforge::text::Tokenizer;
  std::optional<Tokenizer> tokenizer;
  try {
    tokenizer.emplace(Tokenizer::from_json(json, "tokenizer.json"));
  } catch (const seqforge::Error&) {
    return 0;
  }
  for (bool special : {true, false}) {
    try {
      const auto encoding = tokenizer->encode(text, special);
      if (encoding.type_ids.size() != encoding.ids.size()) bug("type ids and ids differ in size");
      for (int32_t id : encoding.ids)
        if (id < 0 || id >= tokenizer->vocab_size()) bug("an id outside the vocabulary");
      tokenizer->decode(encoding.ids, !special);
      const size_t tab = text.find('\t');
      if (tab != std::string_view::npos)
        tokenizer->encode_pair(text.substr(0, tab), text.substr(tab + 1), special);
    } catch (const seqforge::Error&) {
    }
  }
  return 0;
}
