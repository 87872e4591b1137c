#pragma once
// A series loader's data file: a CSV (named columns, read whole) or a 2-D .npy array (columns
// "0", "1", ...; float arrays stay memory-mapped), read as named columns either way.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "seqforge/data/datasets.hpp"
#include "seqforge/io/csv.hpp"

namespace seqforge {

class DataFile {
 public:
  // `missing_codes`: data.missing_values; `missing_words`: data.missing_words.
  DataFile(const std::string& path, const std::vector<std::string>& missing_codes,
           bool missing_words = true);

  int64_t rows() const { return csv_ ? csv_->rows() : matrix_.rows; }
  const std::vector<std::string>& columns() const { return names_; }
  bool has_column(const std::string& name) const;
  const io::CsvColumn& text(const std::string& name) const;
  bool is_array() const { return !csv_; }
  // Where the file is not comma-separated: which separator its header told, and which of
  // `numeric` write decimal commas.
  std::optional<std::string> separator_note(const std::vector<std::string>& numeric) const;
  // " (columns: ...)" for an error about the column `missing` the file lacks, naming a column
  // that differs from it only in case.
  std::string columns_hint(const std::string& missing = "") const;
  // Whether a text cell marks a missing value: empty, data.missing_values' texts, and (unless
  // data.missing_words is false) the words written for one.
  bool is_missing(std::string_view cell) const;
  // Whether a CSV column writes decimal commas (io::CsvTable::decimal_commas).
  bool decimal_commas(const std::string& name) const {
    return csv_ && csv_->has_column(name) && csv_->decimal_commas(name);
  }
  // Refuses a cell of text column `name` that is not UTF-8 (a names' column: series, categories,
  // which checkpoints and reports store as text), naming its line and `role` ("data.static").
  void check_utf8(const std::string& name, const std::string& role) const;
  // A numeric column, one finite value per file row (or NaN for a missing cell, with
  // `missing_allowed`).
  std::vector<double> column(const std::string& name, bool missing_allowed = false) const;
  // Whether the array is used as it is: no value of it marks a missing one.
  bool has_missing_codes() const { return !missing_numbers_.empty(); }
  // The mapped array itself and the indices of the named columns, every value used checked.
  SourceMatrix array(const std::vector<std::string>& names, std::vector<int64_t>* cols) const;
  const std::string& path() const { return path_; }
  // "<path>:<line>" for a CSV row; "<path>: row <r + 1> (index <r>)" for an array row, counted
  // from 1 as predict's window_end is.
  std::string where(int64_t row) const;

 private:
  double checked(int64_t r, int64_t j) const;
  std::string path_;
  std::unique_ptr<io::CsvTable> csv_;
  SourceMatrix matrix_;
  std::vector<std::string> names_;
  std::vector<double> missing_numbers_;  // .npy: data.missing_values
};

}  // namespace seqforge
