#pragma once
// CSV (RFC 4180): a header row of unique column names, then data rows with as many fields each;
// a column without a name must be empty and is dropped (a spreadsheet's trailing commas), but a
// first one with values, pandas' index, is named "Unnamed: 0" as pandas names it. Fields are
// separated by commas, or, in a file whose header has none, by tabs, ';' or '|' (and with ';',
// numbers may write decimal commas). Fields may be quoted ("a,b", "say ""hi""", newlines inside
// quotes); lines end in LF, CRLF or CR; an optional UTF-8 BOM, a missing final newline and blank
// lines at the end are accepted. Cells are kept as text per column and converted on request; every
// error is one line naming the file and the line (or the column).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace seqforge::io {

class CsvTable {
 public:
  // The name of a first column without a name in the header but with values: the index that
  // pandas' to_csv writes by default, named as read_csv names it.
  static constexpr const char* kIndexColumn = "Unnamed: 0";

  // Reads and validates a file. Throws seqforge::Error("<path>[:<line>]: <problem>").
  static CsvTable read(const std::string& path);
  // Parses bytes already in memory; `source` names them in errors.
  static CsvTable parse(std::string_view bytes, const std::string& source);

  const std::string& source() const { return source_; }
  const std::vector<std::string>& columns() const { return columns_; }  // header names, file order
  int64_t rows() const { return static_cast<int64_t>(lines_.size()); }  // header excluded
  bool has_column(std::string_view name) const;
  // For a "no column 'x'" error: " (columns: a, b, c)".
  std::string columns_hint() const;
  // The fields' separator, told by the header: ',' unless the header has no comma and has tabs,
  // ';' or '|'; and its name for messages ("';'", "tabs").
  char delimiter() const { return delimiter_; }
  std::string delimiter_name() const;
  // Whether a column writes decimal commas ("20,5"): a column of a ';'-separated file with a
  // comma in any cell. numeric() then reads "20,5" as 20.5 and fails on a cell with a point
  // (but for a missing-value code, n.a.).
  bool decimal_commas(std::string_view name) const;

  // Cell text of a column, one per data row. Throws "<path>: no column 'x' (columns: a, b)".
  const std::vector<std::string>& text(std::string_view name) const;
  // A column parsed as finite doubles (surrounding spaces allowed; True and False, as pandas writes
  // a bool column, in any case, are 1 and 0). Throws
  // "<path>:<line>: column 'x': 'abc' is not a number" for the first bad cell; missing cells
  // (is_missing_cell) and infinities (including overflow such as 1e999) are errors too.
  std::vector<double> numeric(std::string_view name) const;
  // The same, with missing cells as NaN (values not known yet, or to be filled).
  std::vector<double> numeric_or_missing(std::string_view name) const;
  // Cells that also mark a missing value (data.missing_values): a number matches a cell of the
  // same value (-99.99 matches -99.990), any other text a cell of that text.
  void set_missing_codes(const std::vector<std::string>& codes);
  // 1-based file line on which data row `row` (0-based) starts.
  int64_t line_of_row(int64_t row) const;

 private:
  size_t index_of(std::string_view name) const;
  std::vector<double> parse_column(std::string_view name, bool missing_is_nan) const;
  // Removes the columns without a name, which must be empty (a spreadsheet's trailing commas).
  // A first such column that holds values is a pandas frame's index instead, kIndexColumn.
  void drop_unnamed(std::vector<size_t> unnamed, int64_t header_line);

  std::string source_;
  char delimiter_ = ',';
  std::vector<std::string> columns_;
  std::map<std::string, size_t, std::less<>> index_;  // column name -> position
  std::vector<std::vector<std::string>> cells_;       // [column][row]
  std::vector<int64_t> lines_;                        // file line of each data row
  std::vector<std::string> missing_texts_;            // set_missing_codes: texts, numbers
  std::vector<double> missing_numbers_;
};

// Whether a cell's text marks a missing value: empty, or one of the words that spreadsheets,
// databases and pandas write for one (NA, N/A, NaN, null, None, #N/A, <NA>; any case), spaces
// around it ignored.
bool is_missing_cell(std::string_view cell);

// A cell as a finite number (surrounding spaces allowed), as CsvTable::numeric reads it.
std::optional<double> parse_finite(std::string_view cell);

// Whether x is a number whose digits are all nines (9, -99.9, -999, 9999.99): the usual codes for
// a missing measurement.
bool is_nines(double x);

// A CSV field (RFC 4180): quoted, with quotes doubled, when it holds a comma, a quote, a line
// break or surrounding spaces; as it is otherwise.
std::string csv_field(std::string_view s);

// Seconds since 1970-01-01T00:00:00 UTC of an ISO 8601 date or date-time: "2012-01-01",
// "2012-01-01 13:00", "2012-01-01T13:00:00", with optional fractional seconds (dropped) and an
// optional "Z" (or " UTC") or "+HH:MM"/"-HH:MM" offset after a time. Surrounding spaces are
// ignored. Returns nullopt for anything else, including impossible dates such as 2013-02-29 or
// 24:00.
std::optional<int64_t> parse_datetime(std::string_view s);

// The ways a date column may write its dates: ISO 8601 (parse_datetime; also with '/' between
// year, month and day, or one digit for either), day first ("31/12/2020", "31.12.2020",
// "31-12-2020", with one or two digits for day and month), month first ("12/31/2020"), compact
// ("20201231"), or with the month's English name or its abbreviation ("Dec 31, 2020",
// "December 31 2020", "31 Dec 2020", "31-Dec-2020"; four-digit years). All but compact take an
// optional time as ISO's; day and month first and named months also one-digit hours and AM/PM
// on a 12-hour clock ("31/12/2020 13:45", "12/31/2020 1:45:00 PM"). A time may end in " UTC".
enum class DateLayout { iso, day_first, month_first, compact, named_month };

// Seconds since 1970 (UTC) of `s` written in `layout`; nullopt when it is not such a date.
// `offset`, where given, receives the UTC offset written after a time in seconds (0 without one):
// the local time is the result plus it.
std::optional<int64_t> parse_date(std::string_view s, DateLayout layout, int64_t* offset = nullptr);

// The day-and-month fields of a day- or month-first date ("31/12/2020" -> {31, 12}); nullopt for
// any other text.
std::optional<std::pair<int, int>> day_month_fields(std::string_view s);

// The calendar parts of seconds since 1970 (UTC).
struct CivilTime {
  int64_t month_index = 0;  // year * 12 + month - 1
  unsigned day = 0, days_in_month = 0;
  int64_t second_of_day = 0;
};
CivilTime civil_time(int64_t seconds);

// Seconds since 1970 (UTC) plus `months` calendar months at the same time of day: on the same day
// of the month (the month's last day where that day does not exist), or with `month_end` on the
// month's last day.
int64_t add_months(int64_t seconds, int64_t months, bool month_end = false);

// The ISO 8601 text of seconds since 1970 (UTC): "2012-01-01" when it is midnight and
// `date_only`, else "2012-01-01T13:00:00".
std::string format_datetime(int64_t seconds, bool date_only = true);

}  // namespace seqforge::io
