// Normalizers: NFC and the other Unicode forms, lowercasing, accents, replacements, BERT's.
#include <utility>

#include "seqforge/core/error.hpp"
#include "text/pipeline.hpp"

namespace seqforge::text {

namespace {

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(NormalForm form) : form_(form) {}
  std::string apply(std::string text) const override { return normalize(text, form_); }

 private:
  NormalForm form_;
};

class Lowercase final : public Normalizer {
 public:
  std::string apply(std::string text) const override { return to_lower(text); }
};

std::string strip_marks(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0, len = 0; i < text.size(); i += len) {
    const char32_t c = decode_utf8(text, i, &len);
    if (!is_nonspacing_mark(c)) out.append(text.substr(i, len));
  }
  return out;
}

class StripAccents final : public Normalizer {
 public:
  std::string apply(std::string text) const override { return strip_marks(text); }
};

std::string strip_whitespace(std::string_view text, bool left, bool right) {
  size_t begin = 0, end = text.size();
  if (left) {
    for (size_t len = 0; begin < end; begin += len)
      if (!is_whitespace(decode_utf8(text, begin, &len))) break;
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      size_t len = 0;
      if (!is_whitespace(decode_utf8(text, start, &len))) break;
      end = start;
    }
  }
  return std::string(text.substr(begin, end - begin));
}

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  std::string apply(std::string text) const override {
    return strip_whitespace(text, left_, right_);
  }

 private:
  bool left_, right_;
};

class Replace final : public Normalizer {
 public:
  Replace(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string apply(std::string text) const override {
    return pattern_.replace_all(text, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string apply(std::string text) const override {
    return text.empty() ? text : prefix_ + text;
  }

 private:
  std::string prefix_;
};

class ByteLevelNormalizer final : public Normalizer {
 public:
  std::string apply(std::string text) const override {
    std::string out;
    out.reserve(text.size() * 2);
    for (char c : text) out += byte_to_char(static_cast<uint8_t>(c));
    return out;
  }
};

class Bert final : public Normalizer {
 public:
  Bert(bool clean_text, bool chinese, bool strip_accents, bool lowercase)
      : clean_text_(clean_text),
        chinese_(chinese),
        strip_accents_(strip_accents),
        lowercase_(lowercase) {}
  std::string apply(std::string text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0, len = 0; i < text.size(); i += len) {
      const char32_t c = decode_utf8(text, i, &len);
      if (clean_text_) {
        if (c == 0 || c == 0xFFFD || is_control(c)) continue;
        if (is_whitespace(c)) {
          out += ' ';
          continue;
        }
      }
      if (chinese_ && is_cjk(c)) {
        out += ' ';
        out.append(text, i, len);
        out += ' ';
        continue;
      }
      out.append(text, i, len);
    }
    if (strip_accents_) out = strip_marks(normalize(out, NormalForm::nfd));
    if (lowercase_) out = to_lower(out);
    return out;
  }

 private:
  bool clean_text_, chinese_, strip_accents_, lowercase_;
};

class NormalizerSequence final : public Normalizer {
 public:
  explicit NormalizerSequence(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  std::string apply(std::string text) const override {
    for (const auto& step : steps_) text = step->apply(std::move(text));
    return text;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const Json& config, const std::string& where) {
  const std::string type = type_of(config, where);
  if (type == "NFC") return std::make_unique<UnicodeForm>(NormalForm::nfc);
  if (type == "NFD") return std::make_unique<UnicodeForm>(NormalForm::nfd);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(NormalForm::nfkc);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(NormalForm::nfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Strip")
    return std::make_unique<StripNormalizer>(bool_field(config, "strip_left", true, where),
                                             bool_field(config, "strip_right", true, where));
  if (type == "Replace") {
    const Json* pattern = optional_field(config, "pattern", where);
    if (!pattern) fail(where, ".pattern: missing");
    return std::make_unique<Replace>(Pattern(*pattern, where + ".pattern"),
                                     string_field(config, "content", where));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(string_field(config, "prepend", where));
  if (type == "ByteLevel") return std::make_unique<ByteLevelNormalizer>();
  if (type == "BertNormalizer") {
    const bool lowercase = bool_field(config, "lowercase", true, where);
    const Json* accents = optional_field(config, "strip_accents", where);
    const bool strip_accents = accents && !accents->is_null()
                                   ? bool_field(config, "strip_accents", false, where)
                                   : lowercase;
    return std::make_unique<Bert>(bool_field(config, "clean_text", true, where),
                                  bool_field(config, "handle_chinese_chars", true, where),
                                  strip_accents, lowercase);
  }
  if (type == "Sequence") {
    const Json* list = optional_field(config, "normalizers", where);
    if (!list || !list->is_array()) fail(where, ".normalizers: expected a list");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list->size(); ++i)
      steps.push_back(
          make_normalizer((*list)[i], where + ".normalizers[" + std::to_string(i) + "]"));
    return std::make_unique<NormalizerSequence>(std::move(steps));
  }
  fail(where, ": normalizer type '", type,
       "' is not supported (supported: NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Strip, "
       "Replace, Prepend, ByteLevel, BertNormalizer, Sequence)");
}

}  // namespace seqforge::text
