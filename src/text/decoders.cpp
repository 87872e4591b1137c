// Decoders: from token strings back to text (byte-level characters to bytes, <0xXX> tokens to
// bytes, Metaspace to spaces, replacements, fusing).
#include <utility>

#include "seqforge/core/error.hpp"
#include "text/pipeline.hpp"

namespace seqforge::text {

namespace {

// Bytes that are not UTF-8 become U+FFFD, one per invalid sequence's start.
std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const size_t len = utf8_length(static_cast<unsigned char>(bytes[i]));
    bool valid = static_cast<unsigned char>(bytes[i]) < 0x80 ||
                 (static_cast<unsigned char>(bytes[i]) >= 0xC2 && i + len <= bytes.size());
    if (valid && len > 1) {
      try {
        check_utf8(bytes.substr(i, len), "");
      } catch (const Error&) {
        valid = false;
      }
    }
    if (valid) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
      while (i < bytes.size() && (static_cast<unsigned char>(bytes[i]) & 0xC0) == 0x80) ++i;
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
