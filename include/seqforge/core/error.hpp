#pragma once
// One typed error at the library boundary; SF_CHECK for internal invariants and input validation.
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace seqforge {

// Thrown for every user-facing failure. The message names where (file:line, config key, tensor)
// and what was expected; the CLI prints it as one line.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `text` safe to print on one terminal line: control characters escaped (ESC as \x1b, a newline
// as \n, NUL as \0), bytes that are not UTF-8 as \xNN, bidirectional controls as \uNNNN. Error
// messages quote data (cells, column names, file contents), which must neither split the line,
// nor turn it around, nor reach the terminal raw.
std::string printable(const std::string& text);
// The bytes of a bidirectional formatting character at s[i] (U+061C, U+200E, U+200F,
// U+202A-U+202E, U+2066-U+2069), which turns the text after it around (a number's digits too),
// and its code point; 0 where none starts there.
size_t bidi_control(std::string_view s, size_t i, unsigned* code);

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
[[noreturn]] void check_failed(const char* file, int line, const char* cond,
                               const std::string& msg);
}  // namespace detail

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(printable(detail::concat(args...)));
}

}  // namespace seqforge

// Internal invariant: throws seqforge::Error with the source location, the condition and a message.
#define SF_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      ::seqforge::detail::check_failed(__FILE__, __LINE__, #cond,                                  \
                                       ::seqforge::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
