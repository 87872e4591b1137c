#include "data/data_file.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/npy.hpp"

namespace seqforge {
namespace {

// A mapped file cut short under the process makes reading it raise SIGBUS: say which file it was
// and exit (checkpoints are written atomically, so the last one stays whole).
char sigbus_message[512];
void report_sigbus(int) {
  const ssize_t n = ::write(STDERR_FILENO, sigbus_message, std::strlen(sigbus_message));
  (void)n;
  ::_exit(1);
}
void on_sigbus_report(const std::string& path) {
  std::snprintf(
      sigbus_message, sizeof sigbus_message,
      "seqforge: error: %.400s: the memory-mapped data file was truncated during the run\n",
      path.c_str());
  struct sigaction action {};
  action.sa_handler = report_sigbus;
  ::sigaction(SIGBUS, &action, nullptr);
}

}  // namespace

DataFile::DataFile(const std::string& path, const std::vector<std::string>& missing_codes,
                   bool missing_words)
    : path_(path) {
  if (path.size() >= 4 && path.compare(path.size() - 4, 4, ".npy") == 0) {
    io::MappedNpy mapped = io::map_npy(path);
    if (mapped.shape.size() != 2)
      fail(path, ": expected a 2-D array (rows, columns), got ", mapped.shape.size(),
           mapped.shape.size() == 1 ? " dimension" : " dimensions",
           mapped.shape.size() == 3
               ? " (windows cut already? save the series itself, a row per time step: seqforge "
                 "cuts the windows, data.lookback)"
           : mapped.shape.size() == 1 ? " (one series? save it as a column: a.reshape(-1, 1))"
                                      : "");
    matrix_.rows = mapped.shape[0];
    matrix_.cols = mapped.shape[1];
    if (mapped.dtype == DType::f32 || mapped.dtype == DType::f64) {
      matrix_.dtype = mapped.dtype;
      matrix_.data = mapped.data;
      matrix_.owner = mapped.mapping;
      on_sigbus_report(path);
    } else if (mapped.dtype == DType::f16 || mapped.dtype == DType::bf16) {
      // Halves converted in memory to float32, which holds each exactly at twice their size.
      auto values = std::make_shared<std::vector<float>>(matrix_.rows * matrix_.cols);
      convert(mapped.data, mapped.dtype, values->data(), DType::f32, values->size());
      matrix_.dtype = DType::f32;
      matrix_.data = reinterpret_cast<const std::byte*>(values->data());
      matrix_.owner = values;
    } else {  // integers: converted in memory to float64, which holds an int32 exactly
      auto values = std::make_shared<std::vector<double>>(matrix_.rows * matrix_.cols);
      convert(mapped.data, mapped.dtype, values->data(), DType::f64, values->size());
      matrix_.dtype = DType::f64;
      matrix_.data = reinterpret_cast<const std::byte*>(values->data());
      matrix_.owner = values;
    }
    for (int64_t j = 0; j < matrix_.cols; ++j) names_.push_back(std::to_string(j));
    for (const std::string& code : missing_codes) {
      const std::optional<double> v = io::parse_finite(code);  // as a CSV cell reads
      if (!v)
        fail(path, ": data.missing_values: '", code,
             "' is no number, and a .npy array holds only numbers");
      missing_numbers_.push_back(*v);
    }
  } else {
    csv_ = std::make_unique<io::CsvTable>(io::CsvTable::read(path));
    csv_->set_missing_codes(missing_codes, missing_words);
    names_ = csv_->columns();
  }
}

bool DataFile::has_column(const std::string& name) const {
  return std::find(names_.begin(), names_.end(), name) != names_.end();
}

const io::CsvColumn& DataFile::text(const std::string& name) const {
  if (!csv_) fail(path_, ": a .npy array has no text column '", name, "'");
  return csv_->text(name);
}

bool DataFile::is_missing(std::string_view cell) const {
  return csv_ ? csv_->is_missing(cell) : io::trim(cell).empty();
}

void DataFile::check_utf8(const std::string& name, const std::string& role) const {
  const io::CsvColumn& cells = text(name);
  for (int64_t r = 0; r < static_cast<int64_t>(cells.size()); ++r)
    if (const size_t at = io::first_non_utf8(cells[r]); at != std::string::npos)
      fail(where(r), ": column ", io::quoted(name), " (", role, "): ", io::quoted(cells[r]),
           " is not UTF-8 text (byte ", at,
           "; a Latin-1 or Windows-1252 export?): save the file as UTF-8");
}

std::optional<std::string> DataFile::separator_note(const std::vector<std::string>& numeric) const {
  if (!csv_ || csv_->delimiter() == ',') return std::nullopt;
  std::string note =
      path_ + ": fields separated by " + csv_->delimiter_name() + " (as the header's are)";
  std::string decimal;
  for (const std::string& name : numeric)
    if (csv_->has_column(name) && csv_->decimal_commas(name) &&
        decimal.find("'" + name + "'") == std::string::npos)
      decimal += (decimal.empty() ? "" : ", ") + ("'" + name + "'");
  if (!decimal.empty()) note += "; decimal commas in " + decimal;
  return note;
}

std::string DataFile::columns_hint(const std::string& missing) const {
  const auto lower = [](std::string s) {
    for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  if (csv_) {
    std::string hint = csv_->columns_hint();
    if (!missing.empty())
      for (const std::string& name : names_)
        if (name != missing && lower(name) == lower(missing)) {
          hint.insert(hint.size() - 1, "; " + io::quoted(name) + " differs from it only in case");
          break;
        }
    return hint;
  }
  return matrix_.cols == 0
             ? " (the .npy array has no columns)"
             : " (a .npy array's columns are 0 to " + std::to_string(matrix_.cols - 1) + ")";
}

std::vector<double> DataFile::column(const std::string& name, bool missing_allowed) const {
  if (csv_) return missing_allowed ? csv_->numeric_or_missing(name) : csv_->numeric(name);
  const int64_t j = std::stoll(name);
  std::vector<double> x(matrix_.rows);
  for (int64_t r = 0; r < matrix_.rows; ++r) {
    const double v = matrix_.at(r, j);
    const bool code =
        std::find(missing_numbers_.begin(), missing_numbers_.end(), v) != missing_numbers_.end();
    if (code && !missing_allowed)
      fail(where(r), ", column ", j, ": ", v,
           " marks a missing value (data.missing_values), not a number");
    x[r] = missing_allowed && (code || std::isnan(v)) ? NAN : checked(r, j);
  }
  return x;
}

SourceMatrix DataFile::array(const std::vector<std::string>& names,
                             std::vector<int64_t>* cols) const {
  for (const auto& name : names) cols->push_back(std::stoll(name));
  for (int64_t r = 0; r < matrix_.rows; ++r)
    for (int64_t j : *cols) checked(r, j);
  return matrix_;
}

std::string DataFile::where(int64_t row) const {
  return csv_ ? path_ + ":" + std::to_string(csv_->line_of_row(row))
              : path_ + ": row " + std::to_string(row + 1) + " (index " + std::to_string(row) + ")";
}

double DataFile::checked(int64_t r, int64_t j) const {
  const double x = matrix_.at(r, j);
  if (std::isnan(x))  // as a CSV's NaN: what data.missing fills
    fail(where(r), ", column ", j, ": nan marks a missing value, not a number");
  if (!std::isfinite(x)) fail(where(r), ", column ", j, ": ", x, " is not a finite number");
  return x;
}

}  // namespace seqforge
