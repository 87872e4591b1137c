// Fitting a byte-level BPE: count the words GPT-2's regex cuts the text into, then merge the most
// frequent adjacent pair, over and over, updating only the words that hold it.
#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "seqforge/core/error.hpp"
#include "seqforge/text/tokenizer.hpp"
#include "text/pipeline.hpp"

namespace seqforge::text {

namespace {

using ordered_json = nlohmann::ordered_json;

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

// Adds `sign * count` for every adjacent pair of `w` to `counts`, and notes where pairs occur.
void count_pairs(const Word& w, int32_t word_index, int64_t sign,
                 std::unordered_map<uint64_t, int64_t>& counts,
                 std::unordered_map<uint64_t, std::unordered_set<int32_t>>* where) {
  for (size_t i = 0; i + 1 < w.symbols.size(); ++i) {
    const uint64_t key = pair_key(w.symbols[i], w.symbols[i + 1]);
    counts[key] += sign * w.count;
    if (where && sign > 0) (*where)[key].insert(word_index);
  }
}

}  // namespace

std::string train_byte_level_bpe(std::string_view text, const BpeTrainOptions& options) {
  check_utf8(text, "training text");
  const auto specials = int32_t(options.special_tokens.size());
  if (options.vocab_size < 256 + specials)
    fail("tokenizer train: a vocabulary of ", options.vocab_size,
         " cannot hold the 256 byte tokens and ", specials, " special tokens");
  if (options.min_frequency < 1) fail("tokenizer train: min frequency must be at least 1");

  // Words as the byte-level pre-tokenizer cuts them, counted.
  Json pre_config = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const auto pre_tokenizer = make_pre_tokenizer(pre_config, "tokenizer train");
  std::unordered_map<std::string, int64_t> word_counts;
  for (size_t begin = 0; begin < text.size();) {  // a line at a time keeps the pieces small
    size_t end = text.find('\n', begin);
    end = end == std::string_view::npos ? text.size() : end + 1;
    std::vector<Piece> pieces{{std::string(text.substr(begin, end - begin)), begin == 0}};
    pre_tokenizer->split(pieces);
    for (const Piece& p : pieces) ++word_counts[p.text];
    begin = end;
  }

  std::vector<std::string> tokens;  // by id
  std::unordered_map<std::string, int32_t> ids;
  const auto add_token = [&](const std::string& t) {
    const auto [it, inserted] = ids.emplace(t, int32_t(tokens.size()));
    if (inserted) tokens.push_back(t);
    return it->second;
  };
  for (const std::string& s : options.special_tokens) {
    check_utf8(s, "special token");
    if (s.empty()) fail("tokenizer train: a special token is empty");
    if (ids.count(s)) fail("tokenizer train: special token '", s, "' is given twice");
    add_token(s);
  }
  // The byte alphabet in the order of its characters' code points ('!' first, U+0100 after
  // U+00FF), as Hugging Face's BpeTrainer numbers it.
  std::vector<int> bytes_in_order(256);
  for (int b = 0; b < 256; ++b) bytes_in_order[size_t(b)] = b;
  const auto code_point = [](int b) {
    size_t len = 0;
    return decode_utf8(byte_to_char(uint8_t(b)), 0, &len);
  };
  std::sort(bytes_in_order.begin(), bytes_in_order.end(),
            [&](int a, int b) { return code_point(a) < code_point(b); });
  std::vector<int32_t> byte_ids(256);
  for (const int b : bytes_in_order) byte_ids[size_t(b)] = add_token(byte_to_char(uint8_t(b)));

  std::vector<Word> words;
  words.reserve(word_counts.size());
  std::vector<std::pair<std::string, int64_t>> sorted(word_counts.begin(), word_counts.end());
  std::sort(sorted.begin(), sorted.end());  // the same words in the same order on every machine
  for (const auto& [w, count] : sorted) {
    Word word{{}, count};
    for (size_t i = 0, len = 0; i < w.size(); i += len) {
      const int b = char_to_byte(decode_utf8(w, i, &len));
      SF_CHECK(b >= 0, "byte-level piece with a character outside the byte alphabet");
      word.symbols.push_back(byte_ids[size_t(b)]);
    }
    words.push_back(std::move(word));
  }

  std::unordered_map<uint64_t, int64_t> counts;
  std::unordered_map<uint64_t, std::unordered_set<int32_t>> where;
  for (size_t i = 0; i < words.size(); ++i) count_pairs(words[i], int32_t(i), 1, counts, &where);

  // The most frequent pair first; among equals the pair of the smaller ids (left, then right),
  // as Hugging Face's BpeTrainer orders its merges.
  struct Candidate {
    int64_t count;
    uint64_t key;  // pair_key: ordered as (left id, right id)
  };
  const auto worse = [](const Candidate& a, const Candidate& b) {
    return a.count != b.count ? a.count < b.count : a.key > b.key;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> queue(worse);
  for (const auto& [key, count] : counts)
    if (count > 0) queue.push({count, key});

  std::vector<std::pair<int32_t, int32_t>> merges;
  while (int32_t(tokens.size()) < options.vocab_size && !queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const int64_t current = counts[top.key];
    if (current != top.count) {  // counts changed since it was queued
      if (current > 0) queue.push({current, top.key});
      continue;
    }
    if (current < options.min_frequency) break;
    const auto left = int32_t(top.key >> 32), right = int32_t(top.key & 0xFFFFFFFF);
    const int32_t merged = add_token(tokens[size_t(left)] + tokens[size_t(right)]);
    merges.emplace_back(left, right);

    std::unordered_map<uint64_t, int64_t> changed;
    std::vector<int32_t> affected(where[top.key].begin(), where[top.key].end());
    std::sort(affected.begin(), affected.end());
    for (int32_t wi : affected) {
      Word& w = words[size_t(wi)];
      count_pairs(w, wi, -1, changed, nullptr);
      std::vector<int32_t> next;
      next.reserve(w.symbols.size());
      for (size_t i = 0; i < w.symbols.size(); ++i) {
        if (i + 1 < w.symbols.size() && w.symbols[i] == left && w.symbols[i + 1] == right) {
          next.push_back(merged);
          ++i;
        } else {
          next.push_back(w.symbols[i]);
        }
      }
      w.symbols = std::move(next);
      count_pairs(w, wi, 1, changed, &where);
    }
    for (const auto& [key, delta] : changed) {
      if (delta == 0) continue;
      const int64_t now = counts[key] += delta;
      if (delta > 0 && now > 0) queue.push({now, key});
    }
  }

  ordered_json vocab = ordered_json::object();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[tokens[id]] = id;
  ordered_json merge_list = ordered_json::array();
  for (const auto& [l, r] : merges)
    merge_list.push_back(ordered_json::array({tokens[size_t(l)], tokens[size_t(r)]}));
  ordered_json added = ordered_json::array();
  for (int32_t i = 0; i < specials; ++i)
    added.push_back({{"id", i},
                     {"content", tokens[size_t(i)]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const auto byte_level = [](bool add_prefix_space, bool trim_offsets) {
    return ordered_json{{"type", "ByteLevel"},
                        {"add_prefix_space", add_prefix_space},
                        {"trim_offsets", trim_offsets},
                        {"use_regex", true}};
  };
  ordered_json out = {{"version", "1.0"},
                      {"truncation", nullptr},
                      {"padding", nullptr},
                      {"added_tokens", added},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", byte_level(false, true)},
                      {"post_processor", byte_level(true, false)},
                      {"decoder", byte_level(true, true)},
                      {"model",
                       {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"ignore_merges", false},
                        {"vocab", vocab},
                        {"merges", merge_list}}}};
  return out.dump(1) + "\n";
}

}  // namespace seqforge::text
