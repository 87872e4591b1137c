// Decoders: from token strings back to text (byte-level characters to bytes, <0xXX> tokens to
// bytes, Metaspace to spaces, replacements, fusing).
#include <algorithm>
#include <utility>

#include "seqforge/core/error.hpp"
#include "text/pipeline.hpp"

namespace seqforge::text {

namespace {

// Bytes that are not UTF-8 become U+FFFD, one per maximal invalid part (Unicode's "substitution
// of maximal subparts", as Rust's from_utf8_lossy and Python's "replace"): a lead byte and the
// continuation bytes that could still follow it, or a lone byte that starts nothing.
std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const auto lead = static_cast<unsigned char>(bytes[i]);
    if (lead < 0x80) {
      out += static_cast<char>(lead);
      ++i;
      continue;
    }
    // The sequence's length and the range its second byte must lie in (no overlong forms, no
    // surrogates, nothing past U+10FFFF).
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF)
      length = 2;
    else if (lead == 0xE0)
      length = 3, low = 0xA0;
    else if (lead == 0xED)
      length = 3, high = 0x9F;
    else if (lead >= 0xE1 && lead <= 0xEF)
      length = 3;
    else if (lead == 0xF0)
      length = 4, low = 0x90;
    else if (lead >= 0xF1 && lead <= 0xF3)
      length = 4;
    else if (lead == 0xF4)
      length = 4, high = 0x8F;
    size_t good = length ? 1 : 0;  // bytes of the sequence that fit so far
    while (good > 0 && good < length && i + good < bytes.size()) {
      const auto c = static_cast<unsigned char>(bytes[i + good]);
      if (good == 1 ? (c < low || c > high) : (c & 0xC0) != 0x80) break;
      ++good;
    }
    if (good == length && length > 0) {
      out.append(bytes.substr(i, length));
      i += length;
    } else {
      out += "\xEF\xBF\xBD";
      i += std::max<size_t>(good, 1);
    }
  }
  return out;
}

class ByteLevelDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t start = bytes.size();
      bool mapped = true;
      for (size_t i = 0, len = 0; i < t.size() && mapped; i += len) {
        const int b = char_to_byte(decode_utf8(t, i, &len));
        if (b < 0)
          mapped = false;
        else
          bytes += static_cast<char>(b);
      }
      if (!mapped) bytes.replace(start, std::string::npos, t);  // kept as it is
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    const auto flush = [&] {
      if (pending.empty()) return;
      bool valid = true;
      try {
        check_utf8(pending, "");
      } catch (const Error&) {
        valid = false;
      }
      if (valid)
        out.push_back(pending);
      else
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (std::string& t : tokens) {
      int value = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        unsigned v = 0;
        if (std::sscanf(t.c_str() + 3, "%2x", &v) == 1 && std::isxdigit(t[3]) &&
            std::isxdigit(t[4]))
          value = int(v);
      }
      if (value >= 0) {
        pending += static_cast<char>(value);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

class Fuse final : public Decoder {
 public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) t = pattern_.replace_all(t, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, int64_t start, int64_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) {
      size_t begin = 0, end = t.size();
      for (int64_t k = 0; k < start_ && t.compare(begin, content_.size(), content_) == 0 &&
                          begin + content_.size() <= end;
           ++k)
        begin += content_.size();
      for (int64_t k = 0; k < stop_ && end >= begin + content_.size() &&
                          t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++k)
        end -= content_.size();
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  int64_t start_, stop_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t at = 0; at < t.size();) {
        if (t.compare(at, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && at == 0 && strip_first_)) out += ' ';
          at += replacement_.size();
        } else {
          out += t[at++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool strip_first_;
};

class BpeSuffixDecoder final : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const char* with = i + 1 == tokens.size() ? "" : " ";
      std::string out;
      const std::string& t = tokens[i];
      for (size_t at = 0; at < t.size();) {
        if (!suffix_.empty() && t.compare(at, suffix_.size(), suffix_) == 0) {
          out += with;
          at += suffix_.size();
        } else {
          out += t[at++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string suffix_;
};

class DecoderSequence final : public Decoder {
 public:
  explicit DecoderSequence(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->apply(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

int64_t count_field(const Json& config, const char* key, const std::string& where) {
  const Json* v = optional_field(config, key, where);
  if (!v || v->is_null()) return 0;
  if (!v->is_number_integer() || v->get<int64_t>() < 0)
    fail(where, ".", key, ": expected a count, got ", v->dump());
  return v->get<int64_t>();
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const Json& config, const std::string& where) {
  const std::string type = type_of(config, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Replace") {
    const Json* pattern = optional_field(config, "pattern", where);
    if (!pattern) fail(where, ".pattern: missing");
    return std::make_unique<ReplaceDecoder>(Pattern(*pattern, where + ".pattern"),
                                            string_field(config, "content", where));
  }
  if (type == "Strip")
    return std::make_unique<StripDecoder>(string_field(config, "content", where),
                                          count_field(config, "start", where),
                                          count_field(config, "stop", where));
  if (type == "Metaspace") {
    bool strip_first = bool_field(config, "add_prefix_space", true, where);
    if (const Json* s = optional_field(config, "prepend_scheme", where); s && !s->is_null())
      strip_first = string_field(config, "prepend_scheme", where) != "never";
    return std::make_unique<MetaspaceDecoder>(string_field(config, "replacement", where),
                                              strip_first);
  }
  if (type == "BPEDecoder") {
    const Json* s = optional_field(config, "suffix", where);
    return std::make_unique<BpeSuffixDecoder>(
        s && !s->is_null() ? string_field(config, "suffix", where) : std::string("</w>"));
  }
  if (type == "Sequence") {
    const Json* list = optional_field(config, "decoders", where);
    if (!list || !list->is_array()) fail(where, ".decoders: expected a list");
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list->size(); ++i)
      steps.push_back(make_decoder((*list)[i], where + ".decoders[" + std::to_string(i) + "]"));
    return std::make_unique<DecoderSequence>(std::move(steps));
  }
  fail(where, ": decoder type '", type,
       "' is not supported (supported: ByteLevel, ByteFallback, Fuse, Replace, Strip, "
       "Metaspace, BPEDecoder, Sequence)");
}

}  // namespace seqforge::text
