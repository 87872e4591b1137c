// Pre-tokenizers: the cuts between words that BPE never merges across (byte-level regex splits,
// digits, Metaspace, whitespace and punctuation), and the patterns Split and Replace share.
#include <unicode/uchar.h>

#include <algorithm>
#include <utility>

#include "seqforge/core/error.hpp"
#include "text/pipeline.hpp"

namespace seqforge::text {

Pattern::Pattern(const Json& config, const std::string& where) {
  if (!config.is_object() || config.size() != 1 ||
      !(config.contains("String") || config.contains("Regex")))
    fail(where, ": expected {\"String\": ...} or {\"Regex\": ...}");
  if (const Json* literal = optional_field(config, "String", where)) {
    literal_ = string_field(config, "String", where);
    (void)literal;
  } else {
    regex_ = std::make_unique<Regex>(string_field(config, "Regex", where), where);
  }
}

std::vector<std::pair<size_t, size_t>> Pattern::find_all(std::string_view s) const {
  if (regex_) return regex_->find_all(s);
  std::vector<std::pair<size_t, size_t>> matches;
  if (literal_.empty()) return matches;
  for (size_t at = s.find(literal_); at != std::string_view::npos;
       at = s.find(literal_, at + literal_.size()))
    matches.emplace_back(at, at + literal_.size());
  return matches;
}

std::string Pattern::replace_all(std::string_view s, std::string_view content) const {
  std::string out;
  size_t done = 0;
  for (const auto& [begin, end] : find_all(s)) {
    out.append(s.substr(done, begin - done));
    out.append(content);
    done = end;
  }
  out.append(s.substr(done));
  return out;
}

SplitBehavior split_behavior(const Json& object, const std::string& where) {
  const Json* field = optional_field(object, "behavior", where);
  if (!field || field->is_null()) return SplitBehavior::isolated;
  const std::string name = string_field(object, "behavior", where);
  if (name == "Removed") return SplitBehavior::removed;
  if (name == "Isolated") return SplitBehavior::isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::merged_with_previous;
  if (name == "MergedWithNext") return SplitBehavior::merged_with_next;
  if (name == "Contiguous") return SplitBehavior::contiguous;
  fail(where, ".behavior: '", name,
       "' is none of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

void split_piece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                 SplitBehavior behavior, bool invert, std::vector<Piece>& out) {
  struct Segment {
    size_t begin, end;
    bool delimiter;
  };
  // The whole piece as alternating gaps and matches.
  std::vector<Segment> segments;
  size_t done = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > done) segments.push_back({done, begin, invert});
    segments.push_back({begin, end, !invert});
    done = end;
  }
  if (done < piece.text.size()) segments.push_back({done, piece.text.size(), invert});

  std::vector<std::pair<size_t, size_t>> kept;
  bool previous_delimiter = false;
  switch (behavior) {
    case SplitBehavior::removed:
      for (const Segment& s : segments)
        if (!s.delimiter) kept.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::isolated:
      for (const Segment& s : segments) kept.emplace_back(s.begin, s.end);
      break;
    case SplitBehavior::merged_with_previous:
      for (const Segment& s : segments) {
        if (s.delimiter && !previous_delimiter && !kept.empty())
          kept.back().second = s.end;
        else
          kept.emplace_back(s.begin, s.end);
        previous_delimiter = s.delimiter;
      }
      break;
    case SplitBehavior::merged_with_next:
      for (size_t i = segments.size(); i-- > 0;) {
        const Segment& s = segments[i];
        if (s.delimiter && !previous_delimiter && !kept.empty())
          kept.back().first = s.begin;
        else
          kept.emplace_back(s.begin, s.end);
        previous_delimiter = s.delimiter;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case SplitBehavior::contiguous:
      for (size_t i = 0; i < segments.size(); ++i) {
        const Segment& s = segments[i];
        if (i > 0 && s.delimiter == previous_delimiter)
          kept.back().second = s.end;
        else
          kept.emplace_back(s.begin, s.end);
        previous_delimiter = s.delimiter;
      }
      break;
  }
  for (const auto& [begin, end] : kept)
    if (end > begin)
      out.push_back({piece.text.substr(begin, end - begin), piece.at_start && begin == 0});
}

namespace {

// Every character for which `is_delimiter` holds, as a match of its own.
template <typename Pred>
std::vector<std::pair<size_t, size_t>> char_matches(std::string_view s, Pred is_delimiter) {
  std::vector<std::pair<size_t, size_t>> matches;
  for (size_t i = 0, len = 0; i < s.size(); i += len)
    if (is_delimiter(decode_utf8(s, i, &len))) matches.emplace_back(i, i + len);
  return matches;
}

template <typename Fn>
void split_each(std::vector<Piece>& pieces, Fn split_one) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (const Piece& p : pieces) split_one(p, out);
  pieces = std::move(out);
}

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex) regex_ = std::make_unique<Regex>(kGpt2Pattern, where);
  }
  void split(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& piece, std::vector<Piece>& out) {
      Piece p = piece;
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
      const size_t first = out.size();
      if (regex_)
        split_piece(p, regex_->find_all(p.text), SplitBehavior::isolated, false, out);
      else if (!p.text.empty())
        out.push_back(p);
      for (size_t i = first; i < out.size(); ++i) {
        std::string mapped;
        mapped.reserve(out[i].text.size() * 2);
        for (char c : out[i].text) mapped += byte_to_char(static_cast<uint8_t>(c));
        out[i].text = std::move(mapped);
      }
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class Split final : public PreTokenizer {
 public:
  Split(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void split(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      split_piece(p, pattern_.find_all(p.text), behavior_, invert_, out);
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  return (U_GET_GC_MASK(UChar32(c)) & U_GC_N_MASK) != 0;
}

// Splits at every character `Pred` picks, keeping it as `behavior` says.
template <typename Pred>
class CharSplit final : public PreTokenizer {
 public:
  CharSplit(Pred pred, SplitBehavior behavior) : pred_(pred), behavior_(behavior) {}
  void split(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      split_piece(p, char_matches(p.text, pred_), behavior_, false, out);
    });
  }

 private:
  Pred pred_;
  SplitBehavior behavior_;
};

template <typename Pred>
std::unique_ptr<PreTokenizer> char_split(Pred pred, SplitBehavior behavior) {
  return std::make_unique<CharSplit<Pred>>(pred, behavior);
}

class Metaspace final : public PreTokenizer {
 public:
  enum class Prepend { always, first, never };
  Metaspace(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}
  void split(std::vector<Piece>& pieces) const override {
    split_each(pieces, [&](const Piece& piece, std::vector<Piece>& out) {
      Piece p = piece;
      std::string replaced;
      for (char c : p.text) {
        if (c == ' ')
          replaced += replacement_;
        else
          replaced += c;
      }
      p.text = std::move(replaced);
      const bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (prepend_ == Prepend::always || (prepend_ == Prepend::first && p.at_start)))
        p.text.insert(0, replacement_);
      if (!split_) {
        if (!p.text.empty()) out.push_back(std::move(p));
        return;
      }
      std::vector<std::pair<size_t, size_t>> matches;
      for (size_t at = p.text.find(replacement_); at != std::string::npos;
           at = p.text.find(replacement_, at + replacement_.size()))
        matches.emplace_back(at, at + replacement_.size());
      split_piece(p, matches, SplitBehavior::merged_with_next, false, out);
    });
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class PreTokenizerSequence final : public PreTokenizer {
 public:
  explicit PreTokenizerSequence(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Metaspace::Prepend prepend_scheme(const Json& config, const std::string& where) {
  if (const Json* scheme = optional_field(config, "prepend_scheme", where);
      scheme && !scheme->is_null()) {
    const std::string name = string_field(config, "prepend_scheme", where);
    if (name == "always") return Metaspace::Prepend::always;
    if (name == "first") return Metaspace::Prepend::first;
    if (name == "never") return Metaspace::Prepend::never;
    fail(where, ".prepend_scheme: '", name, "' is none of always, first, never");
  }
  return bool_field(config, "add_prefix_space", true, where) ? Metaspace::Prepend::always
                                                             : Metaspace::Prepend::never;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& config, const std::string& where) {
  const std::string type = type_of(config, where);
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(bool_field(config, "add_prefix_space", true, where),
                                       bool_field(config, "use_regex", true, where), where);
  if (type == "Split") {
    const Json* pattern = optional_field(config, "pattern", where);
    if (!pattern) fail(where, ".pattern: missing");
    return std::make_unique<Split>(Pattern(*pattern, where + ".pattern"),
                                   split_behavior(config, where),
                                   bool_field(config, "invert", false, where));
  }
  if (type == "Digits") {
    const auto behavior = bool_field(config, "individual_digits", false, where)
                              ? SplitBehavior::isolated
                              : SplitBehavior::contiguous;
    return char_split(is_numeric, behavior);
  }
  if (type == "Metaspace") {
    const std::string replacement = string_field(config, "replacement", where);
    size_t len = 0;
    if (replacement.empty() || (check_utf8(replacement, where + ".replacement"),
                                decode_utf8(replacement, 0, &len), len != replacement.size()))
      fail(where, ".replacement: expected one character, got '", replacement, "'");
    return std::make_unique<Metaspace>(replacement, prepend_scheme(config, where),
                                       bool_field(config, "split", true, where));
  }
  if (type == "Whitespace")
    return std::make_unique<Split>(Pattern(Json{{"Regex", R"(\w+|[^\w\s]+)"}}, where),
                                   SplitBehavior::removed, true);
  if (type == "WhitespaceSplit") return char_split(is_whitespace, SplitBehavior::removed);
  if (type == "Punctuation") return char_split(is_punctuation, split_behavior(config, where));
  if (type == "CharDelimiterSplit") {
    const std::string delimiter = string_field(config, "delimiter", where);
    size_t len = 0;
    if (delimiter.empty() || (check_utf8(delimiter, where + ".delimiter"),
                              decode_utf8(delimiter, 0, &len), len != delimiter.size()))
      fail(where, ".delimiter: expected one character, got '", delimiter, "'");
    const char32_t c = decode_utf8(delimiter, 0, &len);
    return char_split([c](char32_t x) { return x == c; }, SplitBehavior::removed);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(char_split(is_whitespace, SplitBehavior::removed));
    steps.push_back(char_split(is_punctuation, SplitBehavior::isolated));
    return std::make_unique<PreTokenizerSequence>(std::move(steps));
  }
  if (type == "Sequence") {
    const Json* list = optional_field(config, "pretokenizers", where);
    if (!list || !list->is_array()) fail(where, ".pretokenizers: expected a list");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list->size(); ++i)
      steps.push_back(
          make_pre_tokenizer((*list)[i], where + ".pretokenizers[" + std::to_string(i) + "]"));
    return std::make_unique<PreTokenizerSequence>(std::move(steps));
  }
  fail(where, ": pre-tokenizer type '", type,
       "' is not supported (supported: ByteLevel, Split, Digits, Metaspace, Whitespace, "
       "WhitespaceSplit, Punctuation, CharDelimiterSplit, BertPreTokenizer, Sequence)");
}

}  // namespace seqforge::text
