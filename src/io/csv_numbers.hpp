#pragma once

// The rules that read a CSV cell as a number: pandas' forms (truth values, overflow), the hints
// for cells that are almost numbers, and the forms of a decimal comma against thousands grouped
// by points or commas.

#include <string>
#include <string_view>

namespace seqforge::io {

enum class NumberStatus { ok, not_number, not_finite };

// A number, or a truth value as pandas writes a bool column (True, False; any case): 1 or 0.
NumberStatus parse_number(std::string_view s, double* out);

// Whether a cell is True or False (any case, spaces around it ignored).
bool is_truth_word(std::string_view s);

// Why a cell that is almost a number is not one, for its error: " (a currency sign: ...)", or ""
// where nothing is recognised.
std::string number_hint(std::string_view cell);

// Whether a cell could be a number with points between groups of three digits: "1.010",
// "-12.345.678".
bool groups_thousands(std::string_view cell);

// Whether a cell is an integer of three digits or more (no point, no exponent): "980", "-1200".
bool integer_of_three_digits(std::string_view cell);

enum class CommaCell { none, ambiguous, decimal };

// What a cell's one comma may be: a decimal comma for certain ("20,5", "0,125", "1023,031",
// "1.234,5", "2,5e3", ",5"), one that could group thousands as well ("1,234", "-3,699"), or none
// (not a number with one comma).
CommaCell comma_cell(std::string_view cell);

}  // namespace seqforge::io
