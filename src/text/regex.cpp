// Regular expressions on Oniguruma (kept apart from ICU: both headers define UChar). The library
// is loaded at run time with its symbols kept local: Debian's libonig also exports POSIX's
// regcomp and regexec, which, linked in, would replace the C library's for the whole process.
#include <dlfcn.h>
#include <oniguruma.h>

#include <mutex>

#include "seqforge/core/error.hpp"
#include "text/unicode.hpp"

namespace seqforge::text {

namespace {

constexpr unsigned long kRetryLimit = 100'000'000;

// The Oniguruma functions and data the tokenizers use, from the library loaded privately.
struct Onig {
  decltype(&::onig_initialize) initialize;
  decltype(&::onig_set_retry_limit_in_search) set_retry_limit_in_search;
  decltype(&::onig_new) compile;
  decltype(&::onig_free) free;
  decltype(&::onig_error_code_to_str) error_code_to_str;
  decltype(&::onig_search) search;
  decltype(&::onig_region_new) region_new;
  decltype(&::onig_region_free) region_free;
  OnigEncoding utf8;
  OnigSyntaxType* ruby;
};

const Onig& onig() {
  static const Onig api = [] {
    void* lib = nullptr;
    for (const char* name : {"libonig.so.5", "libonig.so"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
    if (!lib)
      fail("tokenizers need the Oniguruma regular expression library (Debian's libonig5): ",
           dlerror());
    const auto get = [&](const char* symbol) {
      void* p = dlsym(lib, symbol);
      if (!p) fail("the Oniguruma library lacks ", symbol, " (version 6.9 or later is needed)");
      return p;
    };
    Onig o;
    o.initialize = reinterpret_cast<decltype(o.initialize)>(get("onig_initialize"));
    o.set_retry_limit_in_search = reinterpret_cast<decltype(o.set_retry_limit_in_search)>(
        get("onig_set_retry_limit_in_search"));
    o.compile = reinterpret_cast<decltype(o.compile)>(get("onig_new"));
    o.free = reinterpret_cast<decltype(o.free)>(get("onig_free"));
    o.error_code_to_str =
        reinterpret_cast<decltype(o.error_code_to_str)>(get("onig_error_code_to_str"));
    o.search = reinterpret_cast<decltype(o.search)>(get("onig_search"));
    o.region_new = reinterpret_cast<decltype(o.region_new)>(get("onig_region_new"));
    o.region_free = reinterpret_cast<decltype(o.region_free)>(get("onig_region_free"));
    o.utf8 = static_cast<OnigEncoding>(get("OnigEncodingUTF8"));
    o.ruby = static_cast<OnigSyntaxType*>(get("OnigSyntaxRuby"));
    OnigEncoding encodings[] = {o.utf8};
    o.initialize(encodings, 1);
    // A pathological pattern in a hostile file fails instead of running for hours.
    o.set_retry_limit_in_search(kRetryLimit);
    return o;
  }();
  return api;
}

}  // namespace

struct Regex::Compiled {
  regex_t* regex = nullptr;
  std::string where;
  ~Compiled() {
    if (regex) onig().free(regex);
  }
};

Regex::Regex(std::string_view pattern, const std::string& where)
    : compiled_(std::make_unique<Compiled>()) {
  const Onig& api = onig();
  compiled_->where = where;
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = api.compile(&compiled_->regex, begin, begin + pattern.size(), ONIG_OPTION_NONE,
                             api.utf8, api.ruby, &info);
  if (rc != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    api.error_code_to_str(message, rc, &info);
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
  const Onig& api = onig();
  OnigRegion* region = api.region_new();
  size_t at = 0;
  while (at <= s.size()) {
    const int pos =
        api.search(compiled_->regex, begin, end, begin + at, end, region, ONIG_OPTION_NONE);
    if (pos == ONIG_MISMATCH) break;
    if (pos < 0) {
      api.region_free(region, 1);
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
  api.region_free(region, 1);
  return matches;
}

}  // namespace seqforge::text
