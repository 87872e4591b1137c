// tokenizer.json read into its pipeline; encoding and decoding as the reference applies them.
#include "seqforge/text/tokenizer.hpp"

#include <unicode/uchar.h>

#include <algorithm>
#include <unordered_map>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "text/pipeline.hpp"

namespace seqforge::text {

const Json* optional_field(const Json& object, const char* key, const std::string& where) {
  if (!object.is_object()) fail(where, ": expected an object, got ", object.dump());
  const auto it = object.find(key);
  return it == object.end() ? nullptr : &*it;
}

std::string string_field(const Json& object, const char* key, const std::string& where) {
  const Json* v = optional_field(object, key, where);
  if (!v) fail(where, ".", key, ": missing");
  if (!v->is_string()) fail(where, ".", key, ": expected a string, got ", v->dump());
  return v->get<std::string>();
}

bool bool_field(const Json& object, const char* key, bool fallback, const std::string& where) {
  const Json* v = optional_field(object, key, where);
  if (!v || v->is_null()) return fallback;
  if (!v->is_boolean()) fail(where, ".", key, ": expected true or false, got ", v->dump());
  return v->get<bool>();
}

std::string type_of(const Json& object, const std::string& where) {
  return string_field(object, "type", where);
}

namespace {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Added tokens found by leftmost-longest match over bytes.
class AddedTokenMatcher {
 public:
  void add(const std::string& text, int32_t token) {
    if (text.empty()) return;
    int32_t node = 0;
    for (char c : text) {
      const uint64_t key = (uint64_t(uint32_t(node)) << 8) | static_cast<uint8_t>(c);
      auto it = children_.find(key);
      if (it == children_.end()) {
        it = children_.emplace(key, int32_t(ends_.size())).first;
        ends_.push_back(-1);
      }
      node = it->second;
    }
    ends_[size_t(node)] = token;
  }
  bool empty() const { return children_.empty(); }

  // Sections of `s`: text (token -1) and added tokens, in order.
  struct Section {
    size_t begin, end;
    int32_t token;  // index into the added tokens, or -1
  };
  std::vector<Section> split(std::string_view s, const std::vector<AddedToken>& tokens) const {
    std::vector<Section> out;
    size_t start = 0;
    for (size_t i = 0; i < s.size();) {
      int32_t node = 0, found = -1;
      size_t found_end = 0;
      for (size_t j = i; j < s.size(); ++j) {
        const uint64_t key = (uint64_t(uint32_t(node)) << 8) | static_cast<uint8_t>(s[j]);
        const auto it = children_.find(key);
        if (it == children_.end()) break;
        node = it->second;
        if (ends_[size_t(node)] >= 0) found = ends_[size_t(node)], found_end = j + 1;
      }
      if (found < 0) {
        ++i;
        continue;
      }
      // A single-word token touching a word is no match, and the search goes on after it (as
      // the matches of one left-to-right pass, which never overlap).
      if (tokens[size_t(found)].single_word && !alone(s, i, found_end)) {
        i = found_end;
        continue;
      }
      size_t begin = i, end = found_end;
      if (tokens[size_t(found)].lstrip)
        while (begin > start && is_space_before(s, begin)) begin = previous_char(s, begin);
      if (tokens[size_t(found)].rstrip)
        for (size_t len = 0; end < s.size() && is_whitespace(decode_utf8(s, end, &len));)
          end += len;
      if (begin > start) out.push_back({start, begin, -1});
      out.push_back({begin, end, found});
      i = start = end;
    }
    if (start < s.size()) out.push_back({start, s.size(), -1});
    return out;
  }

 private:
  static size_t previous_char(std::string_view s, size_t at) {
    do --at;
    while (at > 0 && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80);
    return at;
  }
  static bool is_space_before(std::string_view s, size_t at) {
    size_t len = 0;
    return is_whitespace(decode_utf8(s, previous_char(s, at), &len));
  }
  // Unicode's \w (UTS #18), as the regex Hugging Face's tokenizers test it with: alphabetic,
  // marks, decimal digits, connector punctuation and the joiners.
  static bool is_word(char32_t c) {
    const UChar32 u = UChar32(c);
    return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) ||
           (U_GET_GC_MASK(u) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0 ||
           u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL);
  }
  // A single-word token must not touch word characters on either side.
  static bool alone(std::string_view s, size_t begin, size_t end) {
    size_t len = 0;
    if (begin > 0 && is_word(decode_utf8(s, previous_char(s, begin), &len))) return false;
    return end >= s.size() || !is_word(decode_utf8(s, end, &len));
  }

  std::unordered_map<uint64_t, int32_t> children_;
  std::vector<int32_t> ends_{-1};  // by node: the added token ending there, or -1
};

// The post-processor's work on one or two encodings.
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Without `add_special_tokens` only the type ids are set, as a template gives them.
  virtual void apply(std::vector<Encoding>& encodings, bool add_special_tokens) const = 0;
  // Every id it adds is a token of the vocabulary.
  virtual void check_ids(int32_t vocab_size) const { (void)vocab_size; }
};

void append(Encoding& to, const Encoding& from) {
  to.ids.insert(to.ids.end(), from.ids.begin(), from.ids.end());
  to.type_ids.insert(to.type_ids.end(), from.type_ids.begin(), from.type_ids.end());
  to.special.insert(to.special.end(), from.special.begin(), from.special.end());
}

void append_special(Encoding& to, const std::vector<int32_t>& ids, uint8_t type_id) {
  for (int32_t id : ids) {
    to.ids.push_back(id);
    to.type_ids.push_back(type_id);
    to.special.push_back(1);
  }
}

void append_sequence(Encoding& to, const Encoding& from, uint8_t type_id) {
  const size_t first = to.ids.size();
  append(to, from);
  std::fill(to.type_ids.begin() + std::ptrdiff_t(first), to.type_ids.end(), type_id);
}

class TemplateProcessing final : public PostProcessor {
 public:
  TemplateProcessing(const Json& config, const std::string& where) {
    std::unordered_map<std::string, std::vector<int32_t>> specials;
    if (const Json* map = optional_field(config, "special_tokens", where); map && !map->is_null()) {
      if (!map->is_object()) fail(where, ".special_tokens: expected an object");
      for (const auto& [name, entry] : map->items()) {
        const std::string at = where + ".special_tokens." + name;
        const Json* ids = optional_field(entry, "ids", at);
        if (!ids || !ids->is_array()) fail(at, ".ids: expected a list of ids");
        std::vector<int32_t>& list = specials[name];
        for (const Json& id : *ids) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1LL << 30))
            fail(at, ".ids: ", id.dump(), " is not a token id");
          list.push_back(int32_t(id.get<int64_t>()));
        }
      }
    }
    single_ = parse_template(config, "single", specials, where);
    pair_ = parse_template(config, "pair", specials, where);
    where_ = where;
  }

  void check_ids(int32_t vocab_size) const override {
    for (const auto* items : {&single_, &pair_})
      for (const Item& item : *items)
        for (int32_t id : item.ids)
          if (id >= vocab_size)
            fail(where_, ": special token id ", id, " is outside the vocabulary (", vocab_size,
                 " tokens)");
  }

  void apply(std::vector<Encoding>& encodings, bool add_special_tokens) const override {
    const std::vector<Item>& items = encodings.size() == 2 ? pair_ : single_;
    Encoding out;
    for (const Item& item : items) {
      if (item.sequence < 0) {
        if (add_special_tokens) append_special(out, item.ids, item.type_id);
      } else if (size_t(item.sequence) < encodings.size()) {
        append_sequence(out, encodings[size_t(item.sequence)], item.type_id);
      }
    }
    encodings.assign(1, std::move(out));
  }

 private:
  struct Item {
    int sequence = -1;  // 0 for A, 1 for B, -1 for special tokens
    std::vector<int32_t> ids;
    uint8_t type_id = 0;
  };
  static std::vector<Item> parse_template(
      const Json& config, const char* key,
      const std::unordered_map<std::string, std::vector<int32_t>>& specials,
      const std::string& where) {
    const std::string at = where + "." + key;
    const Json* list = optional_field(config, key, where);
    if (!list || !list->is_array())
      fail(at, ": expected a list of {\"SpecialToken\": ...} and {\"Sequence\": ...}");
    std::vector<Item> items;
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string item_at = at + "[" + std::to_string(i) + "]";
      const Json& entry = (*list)[i];
      Item item;
      const Json* body = nullptr;
      if ((body = optional_field(entry, "SpecialToken", item_at))) {
        const std::string name = string_field(*body, "id", item_at + ".SpecialToken");
        const auto it = specials.find(name);
        if (it == specials.end())
          fail(item_at, ": special token '", name, "' is not in special_tokens");
        item.ids = it->second;
      } else if ((body = optional_field(entry, "Sequence", item_at))) {
        const std::string name = string_field(*body, "id", item_at + ".Sequence");
        if (name != "A" && name != "B") fail(item_at, ".Sequence.id: expected A or B, got ", name);
        item.sequence = name == "A" ? 0 : 1;
      } else {
        fail(item_at, ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
      const Json* type_id = optional_field(*body, "type_id", item_at);
      if (type_id && (!type_id->is_number_integer() || type_id->get<int64_t>() < 0 ||
                      type_id->get<int64_t>() > 255))
        fail(item_at, ".type_id: expected 0 to 255, got ", type_id->dump());
      item.type_id = type_id ? uint8_t(type_id->get<int64_t>()) : 0;
      items.push_back(std::move(item));
    }
    return items;
  }

  std::vector<Item> single_, pair_;
  std::string where_;
};

// BERT's [CLS] A [SEP] (B [SEP]) and RoBERTa's <s> A </s> (</s> B </s>).
class ClassifierProcessing final : public PostProcessor {
 public:
  ClassifierProcessing(const Json& config, const std::string& where, bool roberta)
      : roberta_(roberta) {
    cls_ = token_field(config, "cls", where);
    sep_ = token_field(config, "sep", where);
    where_ = where;
  }
  void check_ids(int32_t vocab_size) const override {
    for (int32_t id : {cls_, sep_})
      if (id < 0 || id >= vocab_size)
        fail(where_, ": special token id ", id, " is outside the vocabulary (", vocab_size,
             " tokens)");
  }
  void apply(std::vector<Encoding>& encodings, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    Encoding out;
    append_special(out, {cls_}, 0);
    append_sequence(out, encodings[0], 0);
    append_special(out, {sep_}, 0);
    if (encodings.size() == 2) {
      const uint8_t second = roberta_ ? 0 : 1;
      if (roberta_) append_special(out, {sep_}, second);
      append_sequence(out, encodings[1], second);
      append_special(out, {sep_}, second);
    }
    encodings.assign(1, std::move(out));
  }

 private:
  static int32_t token_field(const Json& config, const char* key, const std::string& where) {
    const Json* v = optional_field(config, key, where);
    if (!v || !v->is_array() || v->size() != 2 || !(*v)[1].is_number_integer())
      fail(where, ".", key, ": expected [\"token\", id]");
    return int32_t((*v)[1].get<int64_t>());
  }
  bool roberta_;
  int32_t cls_ = 0, sep_ = 0;
  std::string where_;
};

class IdentityProcessing final : public PostProcessor {
 public:
  void apply(std::vector<Encoding>&, bool) const override {}
};

class SequenceProcessing final : public PostProcessor {
 public:
  explicit SequenceProcessing(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void apply(std::vector<Encoding>& encodings, bool add_special_tokens) const override {
    for (const auto& step : steps_) step->apply(encodings, add_special_tokens);
  }
  void check_ids(int32_t vocab_size) const override {
    for (const auto& step : steps_) step->check_ids(vocab_size);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> make_post_processor(const Json& config, const std::string& where) {
  const std::string type = type_of(config, where);
  if (type == "TemplateProcessing") return std::make_unique<TemplateProcessing>(config, where);
  if (type == "ByteLevel") return std::make_unique<IdentityProcessing>();  // offsets only
  if (type == "BertProcessing") return std::make_unique<ClassifierProcessing>(config, where, false);
  if (type == "RobertaProcessing")
    return std::make_unique<ClassifierProcessing>(config, where, true);
  if (type == "Sequence") {
    const Json* list = optional_field(config, "processors", where);
    if (!list || !list->is_array()) fail(where, ".processors: expected a list");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < list->size(); ++i)
      steps.push_back(
          make_post_processor((*list)[i], where + ".processors[" + std::to_string(i) + "]"));
    return std::make_unique<SequenceProcessing>(std::move(steps));
  }
  fail(where, ": post-processor type '", type,
       "' is not supported (supported: TemplateProcessing, ByteLevel, BertProcessing, "
       "RobertaProcessing, Sequence)");
}

}  // namespace

struct Tokenizer::Impl {
  std::string origin;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_by_id;
  AddedTokenMatcher raw_matcher, normalized_matcher;
  int32_t vocab_size = 0;

  void encode_text(std::string_view text, Encoding& out) const {
    const auto add = [&](int32_t id) {
      out.ids.push_back(id);
      out.type_ids.push_back(0);
      out.special.push_back(0);
    };
    std::vector<Piece> pieces;
    std::vector<int32_t> ids;
    for (const auto& section : raw_matcher.split(text, added)) {
      if (section.token >= 0) {
        add(added[size_t(section.token)].id);
        continue;
      }
      const std::string_view raw = text.substr(section.begin, section.end - section.begin);
      const std::string normalized =
          normalizer ? normalizer->apply(std::string(raw)) : std::string(raw);
      for (const auto& sub : normalized_matcher.split(normalized, added)) {
        if (sub.token >= 0) {
          add(added[size_t(sub.token)].id);
          continue;
        }
        pieces.assign(1, Piece{normalized.substr(sub.begin, sub.end - sub.begin),
                               section.begin == 0 && sub.begin == 0});
        if (pre_tokenizer) pre_tokenizer->split(pieces);
        for (const Piece& p : pieces) {
          ids.clear();
          model->tokenize(p.text, ids, out.dropped);
          for (int32_t id : ids) add(id);
        }
      }
    }
  }

  Encoding encode(std::span<const std::string_view> texts, bool add_special_tokens) const {
    std::vector<Encoding> encodings(texts.size());
    int64_t dropped = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      check_utf8(texts[i], texts.size() == 1 ? "text" : i == 0 ? "first text" : "second text");
      encode_text(texts[i], encodings[i]);
      std::fill(encodings[i].type_ids.begin(), encodings[i].type_ids.end(), uint8_t(i));
      dropped += encodings[i].dropped;
    }
    if (post_processor) post_processor->apply(encodings, add_special_tokens);
    if (encodings.size() == 2) {  // a processor that leaves the pair apart: one after the other
      append(encodings[0], encodings[1]);
      encodings.resize(1);
    }
    encodings[0].dropped = dropped;
    return std::move(encodings[0]);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path) {
  return from_json(io::read_file(path), path);
}

Tokenizer Tokenizer::from_json(std::string_view json_text, const std::string& origin) {
  Json root;
  BpeTables tables;
  const bool streamed = read_tokenizer_json(json_text, origin, root, tables);
  if (!streamed) {
    try {
      root = Json::parse(json_text);
    } catch (const Json::exception& e) {  // past where the reader stopped
      fail_not_json(origin, e.what());
    }
  }
  if (!root.is_object()) fail(origin, ": expected a JSON object (a Hugging Face tokenizer.json)");
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  static const char* const known[] = {"version",      "truncation",     "padding",
                                      "added_tokens", "normalizer",     "pre_tokenizer",
                                      "model",        "post_processor", "decoder"};
  for (const auto& item : root.items()) {
    const std::string& key = item.key();
    if (std::none_of(std::begin(known), std::end(known), [&](const char* k) { return key == k; }))
      fail(origin, ": unknown field '", key, "' (a tokenizer.json has ",
           "version, truncation, padding, added_tokens, normalizer, pre_tokenizer, model, "
           "post_processor, decoder)");
  }
  for (const char* key : {"truncation", "padding"})
    if (root.contains(key) && !root[key].is_null())
      fail(origin, ": ", key, " is set; seqforge does not apply a tokenizer's own ", key,
           " (set it to null: sequence lengths come from the config)");

  const auto stage = [&](const char* key) -> const Json* {
    const auto it = root.find(key);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };
  const Json* model = stage("model");
  if (!model) fail(origin, ": model: missing");
  const std::string model_where = origin + ": model";
  if (!streamed) tables = bpe_tables(*model, model_where);
  impl->model = std::make_unique<BpeModel>(*model, tables, model_where);
  if (const Json* j = stage("normalizer"))
    impl->normalizer = make_normalizer(*j, origin + ": normalizer");
  if (const Json* j = stage("pre_tokenizer"))
    impl->pre_tokenizer = make_pre_tokenizer(*j, origin + ": pre_tokenizer");
  if (const Json* j = stage("post_processor"))
    impl->post_processor = make_post_processor(*j, origin + ": post_processor");
  if (const Json* j = stage("decoder")) impl->decoder = make_decoder(*j, origin + ": decoder");

  impl->vocab_size = impl->model->size();
  if (const Json* list = stage("added_tokens")) {
    if (!list->is_array()) fail(origin, ": added_tokens: expected a list");
    for (size_t i = 0; i < list->size(); ++i) {
      const std::string at = origin + ": added_tokens[" + std::to_string(i) + "]";
      const Json& entry = (*list)[i];
      AddedToken t;
      t.content = string_field(entry, "content", at);
      check_utf8(t.content, at + ".content");
      if (t.content.empty()) fail(at, ".content: empty");
      const Json* id = optional_field(entry, "id", at);
      if (!id || !id->is_number_integer() || id->get<int64_t>() < 0 ||
          id->get<int64_t>() >= (1LL << 30))
        fail(at, ".id: expected an integer from 0 to 2^30");
      t.id = int32_t(id->get<int64_t>());
      t.single_word = bool_field(entry, "single_word", false, at);
      t.lstrip = bool_field(entry, "lstrip", false, at);
      t.rstrip = bool_field(entry, "rstrip", false, at);
      t.special = bool_field(entry, "special", false, at);
      t.normalized = bool_field(entry, "normalized", !t.special, at);
      if (impl->added_by_id.count(t.id))
        fail(at, ": id ", t.id, " is already given to added token '",
             impl->added[impl->added_by_id[t.id]].content, "'");
      impl->added_by_id[t.id] = impl->added.size();
      impl->vocab_size = std::max(impl->vocab_size, t.id + 1);
      impl->added.push_back(std::move(t));
    }
  }
  if (impl->post_processor) impl->post_processor->check_ids(impl->vocab_size);
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    if (t.normalized && impl->normalizer)
      impl->normalized_matcher.add(impl->normalizer->apply(t.content), int32_t(i));
    else
      impl->raw_matcher.add(t.content, int32_t(i));
  }
  return Tokenizer(std::move(impl));
}

Encoding Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const std::string_view texts[] = {text};
  return impl_->encode(texts, add_special_tokens);
}

Encoding Tokenizer::encode_pair(std::string_view first, std::string_view second,
                                bool add_special_tokens) const {
  const std::string_view texts[] = {first, second};
  return impl_->encode(texts, add_special_tokens);
}

Encoding Tokenizer::with_template(Encoding first, const Encoding* second) const {
  std::vector<Encoding> encodings{std::move(first)};
  if (second) {
    encodings.push_back(*second);
    std::fill(encodings[1].type_ids.begin(), encodings[1].type_ids.end(), 1);
  }
  if (impl_->post_processor) impl_->post_processor->apply(encodings, true);
  if (encodings.size() == 2) {
    append(encodings[0], encodings[1]);
    encodings.resize(1);
  }
  return std::move(encodings[0]);
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= impl_->vocab_size)
      fail("decode: token id ", id, " is outside the vocabulary of ", impl_->origin, " (0 to ",
           impl_->vocab_size - 1, ")");
    if (skip_special_tokens && is_special(id)) continue;
    tokens.push_back(id_to_token(id));
  }
  if (!impl_->decoder) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  impl_->decoder->apply(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& t : impl_->added)
    if (t.content == token) return t.id;
  const auto& vocab = impl_->model->vocab();
  const auto it = vocab.find(std::string(token));
  if (it == vocab.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  static const std::string none;
  if (const auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end())
    return impl_->added[it->second].content;
  if (id < 0 || id >= impl_->model->size()) return none;
  return impl_->model->token(id);
}

bool Tokenizer::is_special(int32_t id) const {
  const auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added[it->second].special;
}

std::pair<size_t, size_t> truncate_longest_first(size_t a, size_t b, size_t limit) {
  if (a + b <= limit) return {a, b};
  const size_t shorter = std::min(a, b);
  size_t kept_shorter = shorter,
         kept_longer = shorter > limit ? shorter : std::max(shorter, limit - shorter);
  if (kept_shorter + kept_longer > limit) {
    kept_shorter = limit / 2;
    kept_longer = kept_shorter + limit % 2;
  }
  return a > b ? std::pair{kept_longer, kept_shorter} : std::pair{kept_shorter, kept_longer};
}

}  // namespace seqforge::text
