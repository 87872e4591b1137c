#pragma once
// The stages of a tokenizer.json pipeline, each built from its JSON object. `where` names the
// object in errors ("tokenizer.json: pre_tokenizer.pretokenizers[1]").
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/unicode.hpp"

namespace seqforge::text {

using Json = nlohmann::json;

// Typed reads of a component's fields; a wrong type is an error naming the field.
const Json* optional_field(const Json& object, const char* key, const std::string& where);
std::string string_field(const Json& object, const char* key, const std::string& where);
bool bool_field(const Json& object, const char* key, bool fallback, const std::string& where);
std::string type_of(const Json& object, const std::string& where);  // the "type" field

// {"String": "..."} (a literal) or {"Regex": "..."}, as Replace and Split give their pattern.
class Pattern {
 public:
  Pattern(const Json& config, const std::string& where);
  // Non-overlapping, non-empty matches from left to right, as [begin, end) byte offsets.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;
  // `s` with every match replaced by `content`.
  std::string replace_all(std::string_view s, std::string_view content) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// A stretch of the input on its way to the model. `at_start`: it begins at the input's start.
struct Piece {
  std::string text;
  bool at_start = false;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual std::string apply(std::string text) const = 0;
};
std::unique_ptr<Normalizer> make_normalizer(const Json& config, const std::string& where);

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void split(std::vector<Piece>& pieces) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& config, const std::string& where);

// How a split keeps what its pattern matched (the reference's SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };
SplitBehavior split_behavior(const Json& object, const std::string& where);
// Cuts `piece` at `matches` ([begin, end) byte offsets, ascending); with `invert` the matches are
// the pieces and the rest the delimiters. Empty pieces are dropped.
void split_piece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out);

// A BPE model's vocabulary and merges, most of a tokenizer.json (a million entries for Gemma 3).
struct BpeTables {
  std::vector<std::pair<std::string, int64_t>> vocab;       // token, id, in the file's order
  std::vector<std::pair<std::string, std::string>> merges;  // left, right, by rank
};
// The tables of a model's parsed JSON; a malformed entry is an error naming it.
BpeTables bpe_tables(const Json& config, const std::string& where);
// A tokenizer.json parsed in one pass, root["model"]'s vocab and merges into `tables` (and left
// out of `root`). False where those two are missing or hold what the tables do not take (a
// float id, a merge of three tokens): the whole tree and bpe_tables() then name the problem.
// Invalid JSON is an error naming `origin`.
bool read_tokenizer_json(std::string_view text, const std::string& origin, Json& root,
                         BpeTables& tables);
// "ORIGIN: not valid JSON: ..." from nlohmann's message (its "[json.exception...] " tag dropped).
[[noreturn]] void fail_not_json(const std::string& origin, std::string what);

// Byte-pair encoding by merge rank.
class BpeModel {
 public:
  // `config` is the model's JSON object, whose vocab and merges are read from `tables`.
  BpeModel(const Json& config, const BpeTables& tables, const std::string& where);
  // Appends the ids of one pre-tokenized piece; counts the characters left out in `dropped`.
  void tokenize(std::string_view word, std::vector<int32_t>& out, int64_t& dropped) const;
  int32_t size() const { return int32_t(tokens_.size()); }
  const std::string& token(int32_t id) const { return tokens_[size_t(id)]; }
  const std::unordered_map<std::string, int32_t>& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  }
  void symbols_of(std::string_view word, std::vector<int32_t>& symbols, int64_t& dropped) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // by id
  std::unordered_map<uint64_t, Merge> merges_;
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> tokens for byte fallback, -1 where missing
};

// Decoders turn token strings into text piece by piece, as the reference's decode_chain.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void apply(std::vector<std::string>& tokens) const = 0;
};
std::unique_ptr<Decoder> make_decoder(const Json& config, const std::string& where);

}  // namespace seqforge::text
