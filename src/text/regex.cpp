// Regular expressions on Oniguruma (kept apart from ICU: both headers define UChar).
#include <oniguruma.h>

#include <mutex>

#include "seqforge/core/error.hpp"
#include "text/unicode.hpp"

namespace seqforge::text {

namespace {
constexpr unsigned long kRetryLimit = 100'000'000;
}

struct Regex::Compiled {
  regex_t* regex = nullptr;
  std::string where;
  ~Compiled() {
    if (regex) onig_free(regex);
  }
};

Regex::Regex(std::string_view pattern, const std::string& where)
    : compiled_(std::make_unique<Compiled>()) {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
    // A pathological pattern in a hostile file fails instead of running for hours.
    onig_set_retry_limit_in_search(kRetryLimit);
  });
  compiled_->where = where;
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&compiled_->regex, begin, begin + pattern.size(), ONIG_OPTION_NONE,
                          ONIG_ENCODING_UTF8, ONIG_SYNTAX_RUBY, &info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &info);
    compiled_->regex = nullptr;
    fail(where, ": the pattern '", std::string(pattern),
         "' does not compile: ", reinterpret_cast<const char*>(message));
  }
}

Regex::Regex(Regex&&) noexcept = default;
Regex::~Regex() = default;

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> matches;
  const auto* begin = reinterpret_cast<const OnigUChar*>(s.data());
  const auto* end = begin + s.size();
  OnigRegion* region = onig_region_new();
  size_t at = 0;
  while (at <= s.size()) {
    const int pos =
        onig_search(compiled_->regex, begin, end, begin + at, end, region, ONIG_OPTION_NONE);
    if (pos == ONIG_MISMATCH) break;
    if (pos < 0) {
      onig_region_free(region, 1);
      if (pos == ONIGERR_RETRY_LIMIT_IN_MATCH_OVER || pos == ONIGERR_RETRY_LIMIT_IN_SEARCH_OVER)
        fail(compiled_->where, ": the pattern backtracked more than ", kRetryLimit,
             " times on a text of ", s.size(), " bytes; it cannot be applied");
      fail(compiled_->where, ": the pattern's search failed (Oniguruma error ", pos, ")");
    }
    const size_t match_begin = size_t(region->beg[0]), match_end = size_t(region->end[0]);
    if (match_end > match_begin) {
      matches.emplace_back(match_begin, match_end);
      at = match_end;
    } else {  // an empty match: step over one character
      if (match_begin >= s.size()) break;
      at = match_begin + utf8_length(static_cast<unsigned char>(s[match_begin]));
    }
  }
  onig_region_free(region, 1);
  return matches;
}

}  // namespace seqforge::text
