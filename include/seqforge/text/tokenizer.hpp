#pragma once
// Subword tokenizers read from a Hugging Face `tokenizer.json`: added tokens split out first,
// then normalizer, pre-tokenizer, model (BPE) and post-processor, as the reference
// implementation applies them; decoding runs its decoder chain. Anything in the file that
// changes the ids and is not implemented here is refused by name when the file is read.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace seqforge::text {

struct Encoding {
  std::vector<int32_t> ids;
  std::vector<uint8_t> type_ids;  // 0 for the first sequence, 1 for the second of a pair
  std::vector<uint8_t> special;   // 1 where the post-processor added the token
  // Characters the model has no token for and, without an unknown token, leaves out (as Hugging
  // Face's tokenizers do): text a model never sees.
  int64_t dropped = 0;
};

class Tokenizer {
 public:
  // `origin` names the source in error messages (a path, or "tokenizer.json").
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(std::string_view json_text, const std::string& origin);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `text` must be UTF-8; invalid bytes are an error naming their offset.
  Encoding encode(std::string_view text, bool add_special_tokens = true) const;
  Encoding encode_pair(std::string_view first, std::string_view second,
                       bool add_special_tokens = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;
  // The post-processor's template on encodings made without it (after truncating them): the
  // special tokens of a single text, or of a pair when `second` is given.
  Encoding with_template(Encoding first, const Encoding* second) const;

  // Ids run from 0 to vocab_size() - 1 (the model's vocabulary and the added tokens).
  int32_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token's text as stored (byte-level tokens in their mapped alphabet); "" past the end.
  const std::string& id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The lengths a pair of texts of a and b tokens keeps to fit in `limit`, as Hugging Face's fast
// tokenizers truncate longest_first: the longer alone where the shorter fits in half or less,
// else both, the shorter (the first when they are as long) to limit / 2 and the other to the
// rest. A single text (b = 0) keeps its first `limit`.
std::pair<size_t, size_t> truncate_longest_first(size_t a, size_t b, size_t limit);

// Byte-level BPE fitted on `text` (GPT-2's pre-tokenizer regex and byte alphabet), written as a
// tokenizer.json that Hugging Face's tokenizers load: `vocab_size` counts the 256 byte tokens, the
// merges and `special_tokens` (added first, ids 0, 1, ...).
struct BpeTrainOptions {
  int32_t vocab_size = 2048;
  int64_t min_frequency = 2;  // a pair seen fewer times is never merged
  std::vector<std::string> special_tokens = {"<|endoftext|>"};
};
std::string train_byte_level_bpe(std::string_view text, const BpeTrainOptions& options);

}  // namespace seqforge::text
