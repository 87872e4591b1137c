#include "seqforge/io/csv.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "io/csv_numbers.hpp"
#include "io/file_util.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::io {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t'; }

std::string describe_char(char c) {
  if (c == '"') return "'\"'";
  return io::quoted(std::string_view(&c, 1));
}

// Splits RFC 4180 text into rows of fields separated by `delimiter`, tracking 1-based file lines.
// Separated by tabs, a quote opens a quoted field only where that field closes on its line and
// ends there (TSV files such as GLUE's hold quotes as text, `" the witness "`); elsewhere a quote
// is text.
class Tokenizer {
 public:
  Tokenizer(std::string_view bytes, const std::string& source, char delimiter)
      : b_(bytes), source_(source), delimiter_(delimiter) {}

  struct Row {
    std::vector<std::string> fields;
    std::vector<bool> quoted;
    int64_t line = 0;    // line the row starts on
    bool blank = false;  // nothing but spaces, no quotes
  };

  // Reads the next row into `row` (its strings reused); false at the end of the input.
  bool next(Row& row) {
    if (i_ >= b_.size()) return false;
    size_t n = 0;
    row.quoted.clear();
    row.line = line_;
    for (;; ++n) {
      if (n == row.fields.size()) row.fields.emplace_back();
      std::string& field = row.fields[n];
      field.clear();
      size_t j = i_;
      while (j < b_.size() && is_space(b_[j]) && b_[j] != delimiter_) ++j;
      const bool quoted =
          j < b_.size() && b_[j] == '"' && (delimiter_ != '\t' || closes_on_its_line(j + 1));
      if (quoted) {
        read_quoted(j + 1, n + 1, &field);
      } else {
        const size_t start = i_;
        while (i_ < b_.size() && b_[i_] != delimiter_ && b_[i_] != '\n' && b_[i_] != '\r') ++i_;
        field.assign(b_.substr(start, i_ - start));
      }
      row.quoted.push_back(quoted);
      if (i_ >= b_.size()) break;
      if (b_[i_] == delimiter_) {
        ++i_;
        continue;
      }
      // Line end: LF, CRLF or a lone CR.
      if (b_[i_] == '\r' && i_ + 1 < b_.size() && b_[i_ + 1] == '\n') ++i_;
      ++i_;
      ++line_;
      break;
    }
    row.fields.resize(n + 1);
    row.blank = row.fields.size() == 1 && !row.quoted[0] && trim(row.fields[0]).empty();
    return true;
  }

 private:
  bool ends_field(size_t pos) const {
    return pos >= b_.size() || b_[pos] == delimiter_ || b_[pos] == '\n' || b_[pos] == '\r';
  }

  // Whether the quoted field whose content starts at `pos` closes before its line ends and is
  // followed (past spaces) by the delimiter or the line's end. Stops at the first lone quote, so
  // a line's fields are scanned about once.
  bool closes_on_its_line(size_t pos) const {
    for (size_t k = pos; k < b_.size() && b_[k] != '\n' && b_[k] != '\r'; ++k) {
      if (b_[k] != '"') continue;
      if (k + 1 < b_.size() && b_[k + 1] == '"') {
        ++k;
        continue;
      }
      ++k;
      while (k < b_.size() && is_space(b_[k]) && b_[k] != delimiter_) ++k;
      return ends_field(k);
    }
    return false;
  }

  // Reads a quoted field whose content starts at `pos`; leaves i_ on the delimiter or line end.
  void read_quoted(size_t pos, size_t field_number, std::string* field) {
    const int64_t open_line = line_;
    i_ = pos;
    for (;;) {
      if (i_ >= b_.size()) {
        fail(source_, ":", open_line, ": unterminated quoted field ", field_number,
             " (the quote opened on this line is never closed)");
      }
      const char c = b_[i_];
      if (c == '"') {
        if (i_ + 1 < b_.size() && b_[i_ + 1] == '"') {
          *field += '"';
          i_ += 2;
          continue;
        }
        ++i_;
        break;
      }
      if (c == '\n' || (c == '\r' && !(i_ + 1 < b_.size() && b_[i_ + 1] == '\n'))) ++line_;
      // Copy the run up to the next quote or line break in one go.
      size_t end = i_ + 1;
      while (end < b_.size() && b_[end] != '"' && b_[end] != '\n' && b_[end] != '\r') ++end;
      field->append(b_.substr(i_, end - i_));
      i_ = end;
    }
    while (i_ < b_.size() && is_space(b_[i_]) && b_[i_] != delimiter_) ++i_;
    if (!ends_field(i_)) {
      fail(source_, ":", line_, ": unexpected ", describe_char(b_[i_]),
           " after the closing quote of field ", field_number,
           " (a quote inside a quoted field is written \"\")");
    }
  }

  std::string_view b_;
  const std::string& source_;
  const char delimiter_;
  size_t i_ = 0;
  int64_t line_ = 1;
};

}  // namespace

std::string csv_field(std::string_view s) {
  const bool plain = s.find_first_of(",\"\r\n") == std::string_view::npos &&
                     (s.empty() || (!is_space(s.front()) && !is_space(s.back())));
  if (plain) return std::string(s);
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

namespace {

// How often each of ',', tab, ';' and '|' separates the line at the start of `bytes`, outside
// quotes (trailing tabs separate nothing); the line's end in `end`.
std::array<int64_t, 4> separators_of_line(std::string_view bytes, size_t* end) {
  std::array<int64_t, 4> counts{};
  int64_t pending_tabs = 0;
  bool in_quotes = false;
  size_t i = 0;
  for (; i < bytes.size(); ++i) {
    const char c = bytes[i];
    if (in_quotes) {
      in_quotes = c != '"';  // a doubled quote closes and opens again
      continue;
    }
    if (c == '\n' || c == '\r') break;
    if (c == '\t') {
      ++pending_tabs;  // counted once a name follows
      continue;
    }
    if (c == ' ') continue;
    counts[1] += std::exchange(pending_tabs, 0);
    in_quotes = c == '"';
    counts[0] += c == ',';
    counts[2] += c == ';';
    counts[3] += c == '|';
  }
  *end = i;
  return counts;
}

// The header's separator: ',' where its line holds a comma outside quotes, else the most frequent
// of a tab, ';' and '|' there (none: one column, ','). A header with commas and another
// separator ("date;x;y, mm") takes the one that splits it most of those the next line uses as
// often (the other on a tie with commas).
char header_delimiter(std::string_view bytes) {
  static constexpr char kSeparators[] = {',', '\t', ';', '|'};
  size_t end = 0;
  const std::array<int64_t, 4> header = separators_of_line(bytes, &end);
  if (header[0] > 0 && (header[1] > 0 || header[2] > 0 || header[3] > 0)) {
    while (end < bytes.size() && (bytes[end] == '\n' || bytes[end] == '\r')) ++end;
    size_t next_end = 0;
    const std::array<int64_t, 4> next = separators_of_line(bytes.substr(end), &next_end);
    // A tie goes to the other separator: a name such as "Temperatur, °C" has commas, and a
    // row of decimal commas as many as the header.
    size_t best = 0;
    for (size_t k = 1; k < 4; ++k)
      if ((best == 0 ? header[k] >= header[0] : header[k] > header[best]) && next[k] == header[k])
        best = k;
    if (best != 0) return kSeparators[best];
  }
  if (header[0] > 0) return ',';
  if (header[1] == 0 && header[2] == 0 && header[3] == 0) return ',';
  if (header[1] >= header[2] && header[1] >= header[3]) return '\t';
  return header[2] >= header[3] ? ';' : '|';
}

}  // namespace

CsvTable CsvTable::read(const std::string& path) {
  const std::string bytes = read_text_file(path);
  // The table holds the cells' text again and 8 bytes a cell: refused by name where that would
  // not fit, rather than killed by the kernel on the way.
  const size_t line_feeds = static_cast<size_t>(std::count(bytes.begin(), bytes.end(), '\n'));
  const int64_t lines = static_cast<int64_t>(line_feeds) + 1;
  const std::string_view header = std::string_view(bytes).substr(0, bytes.find('\n'));
  const int64_t columns = std::count(header.begin(), header.end(), header_delimiter(bytes)) + 1;
  const int64_t need = static_cast<int64_t>(bytes.size()) + lines * (columns + 1) * 8;
  if (const int64_t available = available_memory_bytes(); need > available)
    fail(path, ": its ", lines, " lines of ", columns, " columns need about ", need >> 20,
         " MB of memory to read, more than the ", available >> 20,
         " MB available; a .npy file (numpy.save) is read in place instead");
  return parse(bytes, path, line_feeds);
}

CsvTable CsvTable::parse(std::string_view bytes, const std::string& source) {
  return parse(bytes, source, static_cast<size_t>(std::count(bytes.begin(), bytes.end(), '\n')));
}

CsvTable CsvTable::parse(std::string_view bytes, const std::string& source, size_t line_feeds) {
  if (bytes.starts_with("\xef\xbb\xbf")) bytes.remove_prefix(3);
  if (const size_t nul = bytes.find('\0'); nul != std::string_view::npos)
    fail(source, ":", 1 + std::count(bytes.begin(), bytes.begin() + nul, '\n'),
         ": a NUL byte (byte ", nul, "): not CSV text (a binary file?)");
  CsvTable t;
  t.source_ = source;
  // A spreadsheet's first line "sep=;" names the separator; the header follows it.
  const bool declared = bytes.starts_with("sep=") && bytes.size() > 5 &&
                        std::string_view(",;\t|").find(bytes[4]) != std::string_view::npos &&
                        (bytes[5] == '\n' || bytes[5] == '\r');
  t.delimiter_ = declared ? bytes[4] : header_delimiter(bytes);
  Tokenizer tok(bytes, source, t.delimiter_);
  Tokenizer::Row row;

  if (declared) tok.next(row);
  if (!tok.next(row)) fail(source, ": empty file, expected a header row");
  if (row.blank) {
    // A file of nothing but blank lines is empty; a blank first line before data is not a header.
    Tokenizer::Row rest;
    while (tok.next(rest)) {
      if (!rest.blank) fail(source, ":", row.line, ": blank line, expected a header row");
    }
    fail(source, ": empty file, expected a header row");
  }
  const int64_t header_line = row.line;
  std::vector<size_t> unnamed;  // columns without a name: allowed only empty (a spreadsheet's)
  std::vector<char> trimmed(row.fields.size(), 0);  // names that had spaces around them
  for (size_t c = 0; c < row.fields.size(); ++c) {
    std::string name = row.quoted[c] ? std::move(row.fields[c]) : std::string(trim(row.fields[c]));
    trimmed[c] = !row.quoted[c] && name.size() != row.fields[c].size();
    if (name.empty()) {
      unnamed.push_back(c);
      t.columns_.emplace_back();
      continue;
    }
    const auto [it, inserted] = t.index_.try_emplace(name, c);
    if (!inserted) {
      fail(source, ":", header_line, ": duplicate column name ", io::quoted(name), " (columns ",
           it->second + 1, " and ", c + 1, ")",
           trimmed[it->second] || trimmed[c]
               ? ": spaces around an unquoted header name are not part of it"
               : "");
    }
    t.columns_.push_back(std::move(name));
  }
  const size_t ncols = t.columns_.size();
  t.cells_.resize(ncols);
  // Room for every row at once: no column's buffer grows by doubling through a large file.
  for (CsvColumn& column : t.cells_) column.reserve(line_feeds + 1, bytes.size() / ncols);
  t.lines_.reserve(line_feeds + 1);

  // Blank lines and rows of nothing but separators (",,,": a spreadsheet's formatted empty rows)
  // are held back: at the end of the file they are ignored, in any mix.
  struct Held {
    int64_t line;
    bool blank;
    std::vector<std::string> fields;
  };
  std::vector<Held> held;
  auto add_row = [&](int64_t line, std::vector<std::string>& fields) {
    if (fields.size() != ncols) {
      const bool comment = t.columns_[0].starts_with('#');  // a logger's preamble
      fail(
          source, ":", line, ": ", fields.size(), fields.size() == 1 ? " field" : " fields",
          ", the header has ", ncols,
          t.delimiter_ == ',' ? "" : " (separated by " + t.delimiter_name() + ", as the header is)",
          comment ? "; the header " + io::quoted(t.columns_[0], 40) +
                        " reads as a comment: a file's first line is its header, so remove the "
                        "lines before it"
                  : "");
    }
    for (size_t c = 0; c < ncols; ++c) t.cells_[c].push_back(fields[c]);
    t.lines_.push_back(line);
  };
  while (tok.next(row)) {
    const bool empty =
        !row.blank && std::all_of(row.fields.begin(), row.fields.end(),
                                  [](const std::string& f) { return trim(f).empty(); });
    if (row.blank || (empty && ncols > 1)) {
      held.push_back({row.line, row.blank, row.blank ? std::vector<std::string>() : row.fields});
      continue;
    }
    for (Held& h : held) {  // rows inside the data after all
      if (h.blank && ncols != 1)
        fail(source, ":", h.line, ": blank line inside the data, expected ", ncols,
             " fields like the header");
      if (h.blank) h.fields.emplace_back();  // a single column: a blank line is an empty cell
      add_row(h.line, h.fields);
    }
    held.clear();
    add_row(row.line, row.fields);
  }
  if (t.lines_.empty() && unnamed.size() == ncols)
    fail(source, ":", header_line, ": the header names no column");
  if (t.lines_.empty()) fail(source, ": no data rows after the header (line ", header_line, ")");
  if (!unnamed.empty()) t.drop_unnamed(unnamed, header_line);
  if (t.delimiter_ == ';' || t.delimiter_ == '\t' || t.delimiter_ == '|')
    t.decimal_comma_ = t.find_decimal_comma();
  return t;
}

void CsvTable::drop_unnamed(std::vector<size_t> unnamed, int64_t header_line) {
  auto holds_values = [&](size_t c) {
    return std::any_of(cells_[c].begin(), cells_[c].end(),
                       [](std::string_view v) { return !trim(v).empty(); });
  };
  // A first column without a name that holds values is a pandas frame's index (to_csv's
  // default): named as pandas reads it back.
  if (unnamed.front() == 0 && unnamed.size() < columns_.size() && holds_values(0) &&
      !index_.contains(kIndexColumn)) {
    columns_[0] = kIndexColumn;
    index_.emplace(kIndexColumn, 0);
    unnamed.erase(unnamed.begin());
    if (unnamed.empty()) return;
  }
  // A title above the header ("Sensor export 2023,,") names one column of many.
  const bool title = columns_.size() - unnamed.size() == 1 && columns_.size() > 2;
  for (size_t c : unnamed)
    for (size_t r = 0; r < cells_[c].size(); ++r)
      if (!trim(cells_[c][r]).empty())
        fail(source_, ":", header_line, ": column ", c + 1,
             " of the header has an empty name, and holds values (line ", lines_[r], ")",
             title ? "; is line " + std::to_string(header_line) +
                         " a title above the header? A file's first line is its header: remove "
                         "the lines before it"
                   : "");
  if (unnamed.size() == columns_.size())
    fail(source_, ":", header_line, ": the header names no column");
  for (auto c = unnamed.rbegin(); c != unnamed.rend(); ++c) {
    columns_.erase(columns_.begin() + static_cast<std::ptrdiff_t>(*c));
    cells_.erase(cells_.begin() + static_cast<std::ptrdiff_t>(*c));
  }
  index_.clear();
  for (size_t c = 0; c < columns_.size(); ++c) index_.emplace(columns_[c], c);
}

bool CsvTable::has_column(std::string_view name) const { return index_.contains(name); }

std::string CsvTable::columns_hint() const {
  constexpr size_t kMaxListed = 20;
  std::string list;
  for (size_t c = 0; c < columns_.size() && c < kMaxListed; ++c) {
    list += (c ? ", " : "") + printable(columns_[c]);
  }
  if (columns_.size() > kMaxListed) {
    list += ", ... (" + std::to_string(columns_.size()) + " in all)";
  }
  // Names that hold another separator: the header was split at the wrong one.
  const bool other =
      delimiter_ == ',' && std::any_of(columns_.begin(), columns_.end(), [](const std::string& n) {
        return n.find_first_of(";\t|") != std::string::npos;
      });
  const std::string split =
      other ? "; the header was split at " + delimiter_name() +
                  ": a file separated by another starts with a line naming it, such as sep=;"
            : "";
  return " (columns: " + list + split + ")";
}

std::string CsvTable::delimiter_name() const {
  return delimiter_ == '\t' ? "tabs" : io::quoted(std::string_view(&delimiter_, 1));
}

std::optional<std::pair<size_t, size_t>> CsvTable::find_decimal_comma() const {
  // In a ';' file any comma in a number is one. Tabs and '|' are also the separators of files
  // with commas between thousands: there only a comma that cannot group them ("20,5", not
  // "1,234") tells, in a column of numbers (not a list such as "1,2" beside "b").
  const bool semicolons = delimiter_ == ';';
  const auto numbers = [&](const CsvColumn& cells) {
    return std::all_of(cells.begin(), cells.end(), [&](std::string_view cell) {
      double ignored = 0;
      return is_missing(cell) || comma_cell(cell) != CommaCell::none ||
             parse_number(trim(cell), &ignored) == NumberStatus::ok;
    });
  };
  for (size_t c = 0; c < cells_.size(); ++c)
    for (size_t r = 0; r < cells_[c].size(); ++r)
      if (const std::string_view cell = cells_[c][r];
          cell.find(',') != std::string_view::npos &&
          comma_cell(cell) >= (semicolons ? CommaCell::ambiguous : CommaCell::decimal)) {
        if (semicolons || numbers(cells_[c])) return std::pair{c, r};
        break;  // a column of texts: the next column
      }
  return std::nullopt;
}

bool CsvTable::decimal_commas(std::string_view name) const {
  if (delimiter_ == ';') {
    for (const std::string_view cell : cells_[index_of(name)])
      if (cell.find(',') != std::string_view::npos) return true;
    return false;
  }
  if (delimiter_ != '\t' && delimiter_ != '|') return false;
  // Tabs or '|': the column's own comma that cannot group thousands tells; a column whose every
  // comma could ("3,699") is refused, saying both readings (another column's "20,5" may be a
  // list, "1,2", as well as a number).
  for (const std::string_view cell : cells_[index_of(name)])
    if (cell.find(',') != std::string_view::npos && comma_cell(cell) == CommaCell::decimal)
      return true;
  return false;
}

size_t CsvTable::index_of(std::string_view name) const {
  const auto it = index_.find(name);
  if (it != index_.end()) return it->second;
  fail(source_, ": no column ", io::quoted(name), columns_hint());
}

const CsvColumn& CsvTable::text(std::string_view name) const { return cells_[index_of(name)]; }

std::vector<double> CsvTable::numeric(std::string_view name) const {
  return parse_column(name, false);
}

std::vector<double> CsvTable::numeric_or_missing(std::string_view name) const {
  return parse_column(name, true);
}

void CsvTable::set_missing_codes(const std::vector<std::string>& codes, bool words) {
  missing_words_ = words;
  missing_texts_.clear();
  missing_numbers_.clear();
  for (const std::string& code : codes) {
    missing_texts_.emplace_back(trim(code));
    // "-1,0" matches the cells of that value too ("-1,00") where a file's commas may be decimal.
    std::string point = code;
    const CommaCell comma = comma_cell(code);
    if (delimiter_ == ';'
            ? comma != CommaCell::none
            : (delimiter_ == '\t' || delimiter_ == '|') && comma == CommaCell::decimal)
      std::replace(point.begin(), point.end(), ',', '.');
    if (double v = 0; parse_number(point, &v) == NumberStatus::ok) missing_numbers_.push_back(v);
  }
}

// A ';' file's column (or one of a file of tabs or '|' that writes decimal commas) whose every
// point could group thousands ("1.020") beside integers of
// three digits or more ("980") reads, with decimal points, as values a thousand times apart
// (980, then 1.02): a German export of counts. An error naming both; with a decimal point
// written anywhere else in the column (980.0) the points are decimal points.
void CsvTable::check_points_as_decimals(std::string_view name) const {
  const CsvColumn& cells = cells_[index_of(name)];
  size_t pointed = cells.size(), integer = cells.size();
  for (size_t r = 0; r < cells.size(); ++r) {
    const std::string_view cell = trim(cells[r]);
    if (cell.find('.') != std::string_view::npos) {
      if (!groups_thousands(cell)) return;
      if (pointed == cells.size()) pointed = r;
    } else if (integer == cells.size() && integer_of_three_digits(cell)) {
      integer = r;
    }
  }
  if (pointed == cells.size() || integer == cells.size()) return;
  fail(source_, ":", lines_[pointed], ": column ", io::quoted(name), ": ",
       io::quoted(cells[pointed]), " reads as a decimal beside ", io::quoted(cells[integer]),
       " on line ", lines_[integer],
       ": a thousands separator? Write the column's numbers without the points (or, where they "
       "are decimal points, write a point in the integers too: ",
       io::quoted(std::string(trim(cells[integer])) + ".0"), ")");
}

bool CsvTable::is_missing(std::string_view cell) const {
  cell = trim(cell);
  return cell.empty() || (missing_words_ && is_missing_cell(cell)) ||
         std::find(missing_texts_.begin(), missing_texts_.end(), cell) != missing_texts_.end();
}

std::vector<double> CsvTable::parse_column(std::string_view name, bool missing_is_nan) const {
  const CsvColumn& cells = cells_[index_of(name)];
  std::vector<double> out(cells.size());
  // A column of a ';'-separated file that writes a decimal comma anywhere writes them all: a
  // point there could be a thousands separator ("1.234,5"), so it is an error, never a guess.
  size_t comma_row = cells.size();
  if (decimal_commas(name))
    for (size_t r = 0; r < cells.size() && comma_row == cells.size(); ++r)
      if (cells[r].find(',') != std::string_view::npos) comma_row = r;
  // Nor may a column without commas write points that could group thousands ("1.010" for 1010)
  // where other columns write decimal commas.
  const bool points_may_group = delimiter_ == ';' || decimal_comma_;
  if (points_may_group && comma_row == cells.size()) check_points_as_decimals(name);
  std::string decimal_point;
  // Truth values make a column of them (pandas' bool), never one cell among numbers.
  size_t number_row = cells.size(), truth_row = cells.size();
  for (size_t r = 0; r < cells.size(); ++r) {
    std::string_view cell = trim(cells[r]);
    auto missing_text = [&] { return is_missing(cell); };  // asked only of non-numbers
    if (points_may_group && comma_row == cells.size() && cell.find('.') != std::string_view::npos) {
      if (decimal_comma_ && groups_thousands(cell)) {
        const auto [c, row] = *decimal_comma_;
        fail(source_, ":", lines_[r], ": column ", io::quoted(name), ": ", io::quoted(cells[r]),
             " has a point where the file writes decimal commas (", io::quoted(cells_[c][row]),
             " in column ", io::quoted(columns_[c]), " on line ", lines_[row],
             "): a thousands separator? Write the column's numbers with decimal commas, or "
             "without the points");
      }
    }
    if (comma_row < cells.size() && !missing_text()) {
      if (cell.find('.') != std::string_view::npos)
        fail(source_, ":", lines_[r], ": column ", io::quoted(name), ": ", io::quoted(cells[r]),
             " has a point where the column writes decimal commas (", io::quoted(cells[comma_row]),
             " on line ", lines_[comma_row], "): a thousands separator?");
      decimal_point.assign(cell);
      std::replace(decimal_point.begin(), decimal_point.end(), ',', '.');
      cell = decimal_point;
    }
    const NumberStatus status = parse_number(cell, &out[r]);
    const bool missing = status == NumberStatus::ok
                             ? std::find(missing_numbers_.begin(), missing_numbers_.end(),
                                         out[r]) != missing_numbers_.end()
                             : missing_text();
    if (missing) {
      if (missing_is_nan) {
        out[r] = NAN;
        continue;
      }
      if (cell.empty())
        fail(source_, ":", lines_[r], ": column ", io::quoted(name),
             ": empty cell is not a number");
      fail(source_, ":", lines_[r], ": column ", io::quoted(name), ": ", io::quoted(cells[r]),
           " marks a missing value, not a number");
    }
    switch (status) {
      case NumberStatus::ok: {
        size_t& first = is_truth_word(cell) ? truth_row : number_row;
        first = std::min(first, r);
        if (truth_row < cells.size() && number_row < cells.size())
          fail(source_, ":", lines_[truth_row], ": column ", io::quoted(name), ": ",
               io::quoted(cells[truth_row]), " is a truth value among numbers (",
               io::quoted(cells[number_row]), " on line ", lines_[number_row],
               "): a damaged cell? Write it as a number, or leave it empty as a missing one");
        break;
      }
      case NumberStatus::not_number:
        if ((delimiter_ == '\t' || delimiter_ == '|') && decimal_comma_ &&
            cell.find(',') != std::string_view::npos) {
          const auto [c, row] = *decimal_comma_;
          std::string point(cell), none(cell);
          std::replace(point.begin(), point.end(), ',', '.');
          std::erase(none, ',');
          fail(source_, ":", lines_[r], ": column ", io::quoted(name), ": ", io::quoted(cells[r]),
               " is not a number: a decimal comma (", point, ", as ", io::quoted(cells_[c][row]),
               " in column ", io::quoted(columns_[c]), " on line ", lines_[row],
               " may write) or a thousands separator (", none,
               ")? Write the column's numbers with a decimal point");
        }
        fail(source_, ":", lines_[r], ": column ", io::quoted(name), ": ", io::quoted(cells[r]),
             " is not a number", number_hint(cell));
      case NumberStatus::not_finite:
        fail(source_, ":", lines_[r], ": column ", io::quoted(name), ": ", io::quoted(cells[r]),
             " is not a finite number");
    }
  }
  return out;
}

int64_t CsvTable::line_of_row(int64_t row) const {
  if (row < 0 || row >= rows()) {
    fail(source_, ": data row ", row, " is out of range (", rows(), " data rows)");
  }
  return lines_[static_cast<size_t>(row)];
}

}  // namespace seqforge::io
