#include "io/csv_numbers.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>

#include "io/file_util.hpp"
#include "seqforge/io/csv.hpp"

namespace seqforge::io {

namespace {

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == y;
         });
}

}  // namespace

bool is_truth_word(std::string_view s) {
  s = trim(s);
  return equals_ignoring_case(s, "true") || equals_ignoring_case(s, "false");
}

NumberStatus parse_number(std::string_view s, double* out) {
  s = trim(s);
  if (is_truth_word(s)) {
    *out = equals_ignoring_case(s, "true") ? 1.0 : 0.0;
    return NumberStatus::ok;
  }
  if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.remove_prefix(1);  // from_chars rejects '+'
  if (s.empty()) return NumberStatus::not_number;
  const char* end = s.data() + s.size();
  double v = 0;
  auto r = std::from_chars(s.data(), end, v);
  if (r.ec == std::errc::result_out_of_range) {
    // Magnitude beyond double: long double tells overflow (an error) from underflow (~0).
    long double wide = 0;
    r = std::from_chars(s.data(), end, wide);
    if (r.ec == std::errc::result_out_of_range && r.ptr == end) return NumberStatus::not_finite;
    v = static_cast<double>(wide);
  }
  if (r.ec != std::errc() || r.ptr != end) return NumberStatus::not_number;
  if (!std::isfinite(v)) return NumberStatus::not_finite;
  *out = v;
  return NumberStatus::ok;
}

std::string number_hint(std::string_view cell) {
  cell = trim(cell);
  double ignored = 0;
  const auto number = [&](std::string_view s) {
    return parse_number(s, &ignored) == NumberStatus::ok;
  };
  const auto without = [](std::string_view s, std::string_view drop) {
    std::string out;
    for (char c : s)
      if (drop.find(c) == std::string_view::npos) out += c;
    return out;
  };
  for (std::string_view sign : {"$", "\xe2\x82\xac", "\xc2\xa3", "\xc2\xa5"})  // $ euro pound yen
    for (std::string_view rest :
         {cell.starts_with(sign) ? cell.substr(sign.size()) : "",
          cell.ends_with(sign) ? cell.substr(0, cell.size() - sign.size()) : ""})
      if (!rest.empty() && (number(rest) || number(without(rest, ","))))
        return " (a currency sign: write the number alone, 1234.5)";
  // 5 251.5, 5\u202f251.5: thousands grouped by spaces, plain or narrow no-break ones (French
  // and other locales' spreadsheets).
  if (const std::string spaced = io::space_like_as_space(cell);
      spaced.find(' ') != std::string::npos && number(without(spaced, " "))) {
    const std::string_view whole = std::string_view(spaced).substr(0, spaced.find('.'));
    bool grouped = whole.find(' ') > 0;
    for (size_t at = whole.find(' '); at != std::string_view::npos && grouped;
         at = whole.find(' ', at + 1))
      grouped = whole.size() - at > 3 &&
                whole.substr(at + 1, 3).find_first_not_of("0123456789") == std::string_view::npos &&
                (whole.size() - at == 4 || whole[at + 4] == ' ');
    if (grouped) return " (thousands grouped by spaces: write the number without them)";
  }
  // A no-break, thin or zero-width space, or a byte-order mark, copied from a web page.
  if (const std::string visible = io::without_space_like(cell);
      visible.size() < cell.size() && number(trim(visible)))
    return " (an invisible or no-break space, shown as \\u: write the number alone)";
  if (cell.size() > 1 && cell.ends_with('%') && number(cell.substr(0, cell.size() - 1)))
    return " (a percentage: write the number alone, 5.2 or 0.052)";
  if (cell.find(',') != std::string_view::npos && number(without(cell, ","))) {
    // 1,234,567.5: each comma three digits before the point or the end.
    const std::string_view whole = cell.substr(0, cell.find('.'));
    bool thousands = whole.find(',') > 0;
    for (size_t at = whole.find(','); at != std::string_view::npos && thousands;
         at = whole.find(',', at + 1))
      thousands =
          whole.size() - at > 3 &&
          whole.substr(at + 1, 3).find_first_not_of("0123456789") == std::string_view::npos &&
          (whole.size() - at == 4 || whole[at + 4] == ',');
    if (thousands) return " (a thousands separator: write 1234.5)";
    if (std::count(cell.begin(), cell.end(), ',') == 1 && cell.find('.') == std::string_view::npos)
      return " (a decimal comma: write 1.5, or separate the fields with ';' or tabs)";
  }
  if (cell.size() > 1 && std::string_view("kKmMbB").find(cell.back()) != std::string_view::npos &&
      number(cell.substr(0, cell.size() - 1)))
    return " (a suffix for thousands, millions or billions: write the number in full)";
  if (cell.size() > 2 && cell.front() == '(' && cell.back() == ')' &&
      number(cell.substr(1, cell.size() - 2)))
    return " (an accountant's negative: write -12.5)";
  if (cell.starts_with("\xe2\x88\x92") && number(cell.substr(3)))  // U+2212
    return " (a typographic minus sign: write '-')";
  // 12kg, 3.5 m/s, 20°C: a number, then a unit that starts with a letter or a non-ASCII sign.
  const size_t unit = std::find_if(cell.begin(), cell.end(),
                                   [](char c) {
                                     return std::isalpha(static_cast<unsigned char>(c)) ||
                                            static_cast<unsigned char>(c) >= 0x80;
                                   }) -
                      cell.begin();
  const bool notation = std::string_view("eExX").find(cell[std::min(unit, cell.size() - 1)]) !=
                        std::string_view::npos;  // 1e, 0x10: a number's notation, cut short
  if (unit > 0 && unit < cell.size() && !notation && number(trim(cell.substr(0, unit))))
    return " (a unit after the number, " + io::quoted(cell.substr(unit), 20) +
           ": write the number alone)";
  return "";
}

bool groups_thousands(std::string_view cell) {
  if (!cell.empty() && (cell[0] == '-' || cell[0] == '+')) cell.remove_prefix(1);
  const size_t first = cell.find('.');
  if (first == 0 || first > 3 || first == std::string_view::npos) return false;
  for (size_t i = 0; i < cell.size(); ++i) {
    const bool point = i >= first && (i - first) % 4 == 0;
    if (point ? cell[i] != '.' : !std::isdigit(static_cast<unsigned char>(cell[i]))) return false;
  }
  return (cell.size() - first) % 4 == 0;
}

bool integer_of_three_digits(std::string_view cell) {
  if (!cell.empty() && (cell[0] == '-' || cell[0] == '+')) cell.remove_prefix(1);
  return cell.size() >= 3 && std::all_of(cell.begin(), cell.end(), [](char ch) {
           return std::isdigit(static_cast<unsigned char>(ch)) != 0;
         });
}

CommaCell comma_cell(std::string_view cell) {
  cell = trim(cell);
  if (!cell.empty() && (cell[0] == '-' || cell[0] == '+')) cell.remove_prefix(1);
  const size_t comma = cell.find(',');
  if (comma == std::string_view::npos || cell.find(',', comma + 1) != std::string_view::npos)
    return CommaCell::none;
  const auto digits = [](std::string_view part) {
    return std::all_of(part.begin(), part.end(),
                       [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; });
  };
  const std::string_view before = cell.substr(0, comma);
  std::string_view after = cell.substr(comma + 1);
  const size_t e = after.find_first_of("eE");
  if (e != std::string_view::npos) {
    std::string_view exponent = after.substr(e + 1);
    if (!exponent.empty() && (exponent[0] == '-' || exponent[0] == '+')) exponent.remove_prefix(1);
    if (exponent.empty() || !digits(exponent)) return CommaCell::none;
    after = after.substr(0, e);
  }
  if (after.empty() || !digits(after)) return CommaCell::none;
  const bool grouped = before.find('.') != std::string_view::npos;
  if (grouped ? !groups_thousands(before) : !digits(before)) return CommaCell::none;
  const bool decimal = grouped || e != std::string_view::npos || after.size() != 3 ||
                       before.empty() || before == "0" || before.size() > 3;
  return decimal ? CommaCell::decimal : CommaCell::ambiguous;
}

bool is_missing_cell(std::string_view cell) {
  cell = trim(cell);
  if (cell.empty()) return true;
  if (cell.size() > 4) return false;
  std::string lower(cell);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* word : {"na", "n/a", "#n/a", "#na", "<na>", "nan", "-nan", "null", "none"})
    if (lower == word) return true;
  return false;
}

std::optional<double> parse_finite(std::string_view cell) {
  double v = 0;
  if (parse_number(cell, &v) != NumberStatus::ok) return std::nullopt;
  return v;
}

bool is_nines(double x) {
  const double a = std::fabs(x);
  if (!(a >= 9 && a < 1e9)) return false;
  double lead = a;  // the leading digit must be a 9: most values stop here
  while (lead >= 10) lead /= 10;
  if (lead < 9) return false;
  char text[64];
  const int n = std::snprintf(text, sizeof text, "%.6f", a);
  std::string_view digits(text, static_cast<size_t>(n));
  while (digits.ends_with('0')) digits.remove_suffix(1);
  if (digits.ends_with('.')) digits.remove_suffix(1);
  return digits.find_first_not_of("9.") == std::string_view::npos;
}

}  // namespace seqforge::io
