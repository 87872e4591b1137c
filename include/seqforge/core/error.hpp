#pragma once
// One typed error at the library boundary; SF_CHECK for internal invariants and input validation.
#include <sstream>
#include <stdexcept>
#include <string>

namespace seqforge {

// Thrown for every user-facing failure. The message names where (file:line, config key, tensor)
// and what was expected; the CLI prints it as one line.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// `text` safe to print on one terminal line: control characters escaped (ESC as \x1b, a newline
// as \n, NUL as \0), and bytes that are not UTF-8 as \xNN. Error messages quote data (cells,
// column names, file contents), which must neither split the line nor reach the terminal raw.
std::string printable(const std::string& text);

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
