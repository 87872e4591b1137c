// BPE by merge rank: a word starts as its characters (or their bytes' <0xXX> tokens, or the
// unknown token) and the pair of lowest rank is merged until none is left, leftmost first.
#include <queue>

#include "seqforge/core/error.hpp"
#include "text/pipeline.hpp"

namespace seqforge::text {

namespace {

void check_bpe_config(const Json& config, const std::string& where) {
  if (const Json* type = optional_field(config, "type", where); type && !type->is_null()) {
    const std::string name = string_field(config, "type", where);
    if (name != "BPE")
      fail(where, ".type: model type '", name,
           "' is not supported (seqforge reads BPE tokenizers: GPT-2, Llama, Qwen, Gemma)");
  }
  if (const Json* dropout = optional_field(config, "dropout", where);
      dropout && !dropout->is_null() && !(dropout->is_number() && dropout->get<double>() == 0))
    fail(where, ".dropout: BPE dropout is not supported (set it to null)");
}

}  // namespace

BpeTables bpe_tables(const Json& config, const std::string& where) {
  check_bpe_config(config, where);
  BpeTables tables;
  const Json* vocab = optional_field(config, "vocab", where);
  if (!vocab || !vocab->is_object()) fail(where, ".vocab: expected an object of token: id");
  tables.vocab.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1LL << 30))
      fail(where, ".vocab: token '", token, "' has id ", id.dump(),
           " (expected an integer from 0 to 2^30)");
    tables.vocab.emplace_back(token, id.get<int64_t>());
  }
  const Json* merges = optional_field(config, "merges", where);
  if (!merges || !merges->is_array()) fail(where, ".merges: expected a list");
  tables.merges.reserve(merges->size());
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& m = (*merges)[rank];
    if (m.is_string()) {
      const std::string& line = m.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
        fail(where, ".merges[", rank, "]: '", line, "' is not two tokens separated by a space");
      tables.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      tables.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      fail(where, ".merges[", rank, "]: expected \"a b\" or [\"a\", \"b\"], got ", m.dump());
    }
  }
  return tables;
}

BpeModel::BpeModel(const Json& config, const BpeTables& tables, const std::string& where) {
  check_bpe_config(config, where);

  // A token listed twice keeps its last id, as a JSON object's repeated key does.
  vocab_.reserve(tables.vocab.size());
  for (const auto& [token, id] : tables.vocab) {
    if (id < 0 || id >= (1LL << 30))
      fail(where, ".vocab: token '", token, "' has id ", id,
           " (expected an integer from 0 to 2^30)");
    vocab_.insert_or_assign(token, int32_t(id));
  }
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) max_id = std::max(max_id, id);
  tokens_.resize(size_t(max_id + 1));
  std::vector<bool> seen(tokens_.size());
  for (const auto& [token, id] : vocab_) {
    const auto i = size_t(id);
    if (seen[i]) fail(where, ".vocab: id ", i, " is given to '", tokens_[i], "' and '", token, "'");
    seen[i] = true;
    tokens_[i] = token;
  }

  const auto optional_string = [&](const char* key) {
    const Json* v = optional_field(config, key, where);
    return v && !v->is_null() ? string_field(config, key, where) : std::string();
  };
  continuing_subword_prefix_ = optional_string("continuing_subword_prefix");
  end_of_word_suffix_ = optional_string("end_of_word_suffix");
  const auto id_of = [&](const std::string& token, size_t rank) {
    const auto it = vocab_.find(token);
    if (it == vocab_.end())
      fail(where, ".merges[", rank, "]: '", token, "' is not in the vocabulary");
    return it->second;
  };
  merges_.reserve(tables.merges.size());
  std::string merged_token;
  for (size_t rank = 0; rank < tables.merges.size(); ++rank) {
    const auto& [left, right] = tables.merges[rank];
    // A continuing subword's prefix is not repeated inside the merged token.
    const size_t prefix = continuing_subword_prefix_.size();
    const bool continues = prefix > 0 && right.compare(0, prefix, continuing_subword_prefix_) == 0;
    const int32_t left_id = id_of(left, rank), right_id = id_of(right, rank);
    merged_token.assign(left).append(right, continues ? prefix : 0);
    const int32_t merged = id_of(merged_token, rank);
    merges_.try_emplace(pair_key(left_id, right_id), Merge{int32_t(rank), merged});
  }

  if (const std::string unk = optional_string("unk_token"); !unk.empty()) {
    const auto it = vocab_.find(unk);
    if (it == vocab_.end()) fail(where, ".unk_token: '", unk, "' is not in the vocabulary");
    unk_id_ = it->second;
  }
  fuse_unk_ = bool_field(config, "fuse_unk", false, where);
  byte_fallback_ = bool_field(config, "byte_fallback", false, where);
  ignore_merges_ = bool_field(config, "ignore_merges", false, where);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const auto it = vocab_.find(name);
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
}

void BpeModel::symbols_of(std::string_view word, std::vector<int32_t>& symbols,
                          int64_t& dropped) const {
  int32_t pending_unk = 0;  // unknown characters not yet emitted (fused: at most one)
  const auto flush_unk = [&] {
    for (; pending_unk > 0; --pending_unk) symbols.push_back(unk_id_);
  };
  std::string piece;
  for (size_t i = 0, len = 0; i < word.size(); i += len) {
    len = utf8_length(static_cast<unsigned char>(word[i]));
    piece.clear();
    if (i > 0) piece += continuing_subword_prefix_;
    piece.append(word.substr(i, len));
    if (i + len == word.size()) piece += end_of_word_suffix_;
    if (const auto it = vocab_.find(piece); it != vocab_.end()) {
      flush_unk();
      symbols.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : piece) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        flush_unk();
        for (char c : piece) symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    // Without an unknown token the character is dropped, as the reference does.
    if (unk_id_ >= 0)
      pending_unk = fuse_unk_ ? 1 : pending_unk + 1;
    else
      ++dropped;
  }
  flush_unk();
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& out, int64_t& dropped) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol {
    int32_t id, prev, next;
    bool gone;
  };
  std::vector<int32_t> ids;
  symbols_of(word, ids, dropped);
  const auto n = int32_t(ids.size());
  std::vector<Symbol> symbols;
  symbols.resize(size_t(n));
  for (int32_t i = 0; i < n; ++i) symbols[size_t(i)] = {ids[size_t(i)], i - 1, i + 1, false};

  struct Candidate {
    int32_t rank, pos, merged;
    bool operator<(const Candidate& o) const {  // the queue's top: lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate> queue;
  const auto push = [&](int32_t pos) {
    const int32_t next = symbols[size_t(pos)].next;
    if (next >= n) return;
    const auto it = merges_.find(pair_key(symbols[size_t(pos)].id, symbols[size_t(next)].id));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[size_t(top.pos)];
    if (left.gone || left.next >= n) continue;
    Symbol& right = symbols[size_t(left.next)];
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.merged != top.merged) continue;  // a stale entry
    left.id = top.merged;
    right.gone = true;
    left.next = right.next;
    if (right.next < n) symbols[size_t(right.next)].prev = top.pos;
    if (left.prev >= 0) push(left.prev);
    push(top.pos);
  }
  for (int32_t i = 0; i < n; i = symbols[size_t(i)].next) out.push_back(symbols[size_t(i)].id);
}

}  // namespace seqforge::text
