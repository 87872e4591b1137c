// A tokenizer.json read in one pass: its model's vocab and merges, most of the file, go straight
// into tables as the parser meets them; everything else becomes a Json tree. A whole tree of
// Gemma 3's 262k tokens and 515k merges takes about five times as long to build and free.
#include <limits>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "text/pipeline.hpp"

namespace seqforge::text {

namespace {

class TokenizerJsonReader final : public nlohmann::json_sax<Json> {
 public:
  Json root;
  BpeTables tables;
  bool irregular = false;  // the vocab or merges hold something the tables do not take
  std::string syntax_error;

  bool streamed_both() const { return vocab_streamed_ && merges_streamed_; }

  bool null() override { return value(Json()); }
  bool boolean(bool v) override { return value(Json(v)); }
  bool number_integer(number_integer_t v) override {
    if (mode_ == Mode::vocab) {
      tables.vocab.emplace_back(std::move(key_), v);
      return true;
    }
    return value(Json(v));
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (mode_ == Mode::vocab) {
      if (v > number_unsigned_t(std::numeric_limits<int64_t>::max())) return stop();
      tables.vocab.emplace_back(std::move(key_), int64_t(v));
      return true;
    }
    return value(Json(v));
  }
  bool number_float(number_float_t v, const string_t&) override { return value(Json(v)); }
  bool binary(binary_t&) override { return stop(); }

  bool string(string_t& s) override {
    if (mode_ == Mode::merges) {  // "left right"
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) return stop();
      tables.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      return true;
    }
    if (mode_ == Mode::merge_pair) {  // ["left", "right"]
      if (merge_parts_ == 0) merge_left_ = std::move(s);
      if (merge_parts_ == 1) tables.merges.emplace_back(std::move(merge_left_), std::move(s));
      return ++merge_parts_ <= 2 || stop();
    }
    return value(Json(std::move(s)));
  }

  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }

  bool start_object(std::size_t) override {
    if (mode_ != Mode::tree) return stop();
    if (in_model() && key_ == "vocab") {
      if (vocab_streamed_) return stop();
      vocab_streamed_ = true;
      mode_ = Mode::vocab;
      return true;
    }
    const bool is_model = stack_.size() == 1 && key_ == "model";
    if (is_model && model_) return stop();  // a second model would replace the first
    Json* object = place(Json::object());
    if (is_model) model_ = object;
    stack_.push_back(object);
    return true;
  }
  bool end_object() override {
    if (mode_ == Mode::vocab) {
      mode_ = Mode::tree;
      return true;
    }
    if (mode_ != Mode::tree) return stop();
    stack_.pop_back();
    return true;
  }

  bool start_array(std::size_t) override {
    if (mode_ == Mode::merges) {
      mode_ = Mode::merge_pair;
      merge_parts_ = 0;
      return true;
    }
    if (mode_ != Mode::tree) return stop();
    if (in_model() && key_ == "merges") {
      if (merges_streamed_) return stop();
      merges_streamed_ = true;
      mode_ = Mode::merges;
      return true;
    }
    stack_.push_back(place(Json::array()));
    return true;
  }
  bool end_array() override {
    if (mode_ == Mode::merge_pair) {
      mode_ = Mode::merges;
      return merge_parts_ == 2 || stop();
    }
    if (mode_ == Mode::merges) {
      mode_ = Mode::tree;
      return true;
    }
    if (mode_ != Mode::tree) return stop();
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    syntax_error = e.what();
    return false;
  }

 private:
  enum class Mode { tree, vocab, merges, merge_pair };

  bool stop() {
    irregular = true;
    return false;
  }
  bool in_model() const { return model_ && !stack_.empty() && stack_.back() == model_; }
  // Puts a scalar where the tree expects the next value; the vocab and merges take none.
  bool value(Json&& v) {
    if (mode_ != Mode::tree) return stop();
    place(std::move(v));
    return true;
  }
  Json* place(Json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    Json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    Json& slot = top[key_];  // a repeated key replaces the earlier value, as in a parsed tree
    slot = std::move(v);
    return &slot;
  }

  Mode mode_ = Mode::tree;
  std::vector<Json*> stack_;  // the open objects and arrays of the tree
  std::string key_;           // the key of the next value in an object
  Json* model_ = nullptr;     // root["model"]
  bool vocab_streamed_ = false, merges_streamed_ = false;
  std::string merge_left_;
  int merge_parts_ = 0;
};

}  // namespace

void fail_not_json(const std::string& origin, std::string what) {
  fail(origin, ": not valid JSON ", io::json_syntax_error(what));
}

bool read_tokenizer_json(std::string_view text, const std::string& origin, Json& root,
                         BpeTables& tables) {
  // Hugging Face's reader stops at 128 levels; a file nested deeper is no tokenizer, and each
  // level would cost the builders a frame and a path.
  constexpr int kMaxDepth = 128;
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth)
        fail(origin, ": nested deeper than ", kMaxDepth, " levels (byte ", i, "): not a tokenizer");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  TokenizerJsonReader reader;
  Json::sax_parse(text, &reader);
  if (!reader.syntax_error.empty()) fail_not_json(origin, reader.syntax_error);
  if (reader.irregular || !reader.streamed_both()) return false;
  root = std::move(reader.root);
  tables = std::move(reader.tables);
  return true;
}

}  // namespace seqforge::text
