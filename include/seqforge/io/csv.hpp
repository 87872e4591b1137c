#pragma once
// CSV (RFC 4180): a header row of unique column names, then data rows with as many fields each;
// a column without a name must be empty and is dropped (a spreadsheet's trailing commas), but a
// first one with values, pandas' index, is named "Unnamed: 0" as pandas names it. Fields are
// separated by commas, or, in a file whose header has none, by tabs, ';' or '|' (and with ';',
// numbers may write decimal commas). Fields may be quoted ("a,b", "say ""hi""", newlines inside
// quotes); lines end in LF, CRLF or CR; an optional UTF-8 BOM, a missing final newline and blank
// lines at the end are accepted. Cells are kept as text per column and converted on request; every
// error is one line naming the file and the line (or the column).
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace seqforge::io {

// A column's cells, their texts back to back in one buffer (a cell costs its length and 8 bytes,
// not a string's 32 and its own allocation: a large file's table stays near the file's size).
class CsvColumn {
 public:
  size_t size() const { return ends_.size(); }
  bool empty() const { return ends_.empty(); }
  std::string_view operator[](size_t row) const {
    const size_t begin = row ? ends_[row - 1] : 0;
    return std::string_view(text_).substr(begin, ends_[row] - begin);
  }
  void push_back(std::string_view cell) {
    text_ += cell;
    ends_.push_back(text_.size());
  }
  void reserve(size_t rows, size_t bytes) {
    ends_.reserve(rows);
    text_.reserve(bytes);
  }
  bool operator==(const CsvColumn& other) const = default;  // the same cells

  class iterator {
   public:
    using value_type = std::string_view;
    using difference_type = std::ptrdiff_t;
    iterator(const CsvColumn* column, size_t row) : column_(column), row_(row) {}
    std::string_view operator*() const { return (*column_)[row_]; }
    iterator& operator++() {
      ++row_;
      return *this;
    }
    iterator operator++(int) { return {column_, row_++}; }
    bool operator==(const iterator& other) const { return row_ == other.row_; }

   private:
    const CsvColumn* column_;
    size_t row_;
  };
  iterator begin() const { return {this, 0}; }
  iterator end() const { return {this, size()}; }

 private:
  std::string text_;
  std::vector<uint64_t> ends_;  // one past each cell's last byte in text_
};

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
  // comma in any cell, or of a tab- or '|'-separated one with a comma that cannot group
  // thousands ("20,5", not only "1,234"). numeric() then reads "20,5" as 20.5 and fails on a
  // cell with a point (but for a missing-value code, n.a.); in a file of tabs or '|' that
  // writes a decimal comma anywhere, points are checked as a ';' file's are.
  bool decimal_commas(std::string_view name) const;

  // Cell text of a column, one per data row. Throws "<path>: no column 'x' (columns: a, b)".
  const CsvColumn& text(std::string_view name) const;
  // A column parsed as finite doubles (surrounding spaces allowed; True and False, as pandas writes
  // a bool column, in any case, are 1 and 0). Throws
  // "<path>:<line>: column 'x': 'abc' is not a number" for the first bad cell; missing cells
  // (is_missing_cell) and infinities (including overflow such as 1e999) are errors too.
  std::vector<double> numeric(std::string_view name) const;
  // The same, with missing cells as NaN (values not known yet, or to be filled).
  std::vector<double> numeric_or_missing(std::string_view name) const;
  // Cells that also mark a missing value (data.missing_values): a number matches a cell of the
  // same value (-99.99 matches -99.990), any other text a cell of that text; `words`: whether
  // the words is_missing_cell knows mark one too (data.missing_words).
  void set_missing_codes(const std::vector<std::string>& codes, bool words = true);
  // Whether a cell's text marks a missing value: empty, a missing-value code's text, or (with
  // words) one of is_missing_cell's words.
  bool is_missing(std::string_view cell) const;
  // 1-based file line on which data row `row` (0-based) starts.
  int64_t line_of_row(int64_t row) const;

 private:
  // parse, given the bytes' count of line feeds (the rows' room reserved from it).
  static CsvTable parse(std::string_view bytes, const std::string& source, size_t line_feeds);
  size_t index_of(std::string_view name) const;
  std::vector<double> parse_column(std::string_view name, bool missing_is_nan) const;
  void check_points_as_decimals(std::string_view name) const;
  // (column, row) of a cell that is a number with a decimal comma ("20,5"; in a file of tabs or
  // '|', one that cannot group thousands), if any.
  std::optional<std::pair<size_t, size_t>> find_decimal_comma() const;
  // Removes the columns without a name, which must be empty (a spreadsheet's trailing commas).
  // A first such column that holds values is a pandas frame's index instead, kIndexColumn.
  void drop_unnamed(std::vector<size_t> unnamed, int64_t header_line);

  std::string source_;
  char delimiter_ = ',';
  std::vector<std::string> columns_;
  std::map<std::string, size_t, std::less<>> index_;  // column name -> position
  std::vector<CsvColumn> cells_;                      // [column][row]
  std::vector<int64_t> lines_;                        // file line of each data row
  std::vector<std::string> missing_texts_;            // set_missing_codes: texts, numbers
  std::vector<double> missing_numbers_;
  bool missing_words_ = true;
  std::optional<std::pair<size_t, size_t>> decimal_comma_;  // find_decimal_comma(), once
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

}  // namespace seqforge::io
