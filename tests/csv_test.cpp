#include "seqforge/io/csv.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/dates.hpp"

namespace seqforge::io::csv_test {
namespace {

namespace fs = std::filesystem;
using Strings = std::vector<std::string>;

Strings texts(const CsvColumn& column) {
  Strings out;
  for (const std::string_view cell : column) out.emplace_back(cell);
  return out;
}
using Doubles = std::vector<double>;

class CsvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("seqforge_csv_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string write(const std::string& name, const std::string& bytes) const {
    const std::string p = (dir_ / name).string();
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good());
    return p;
  }

  // Asserts that `f` throws seqforge::Error with a one-line message containing every phrase.
  template <typename F>
  static void expect_error(F&& f, const Strings& phrases) {
    try {
      f();
      ADD_FAILURE() << "no error thrown; expected one containing \"" << phrases.back() << "\"";
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const std::string& phrase : phrases) {
        EXPECT_NE(msg.find(phrase), std::string::npos)
            << "message lacks \"" << phrase << "\": " << msg;
      }
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
      EXPECT_EQ(msg.find('\r'), std::string::npos) << "message is not one line: " << msg;
    }
  }

  // Writes `bytes` to a file, then expects reading it to fail with "<path><where>" and `phrase`.
  void expect_rejected(const std::string& bytes, const std::string& where,
                       const std::string& phrase) const {
    const std::string p = write("bad.csv", bytes);
    expect_error([&] { CsvTable::read(p); }, {p + where, phrase});
    expect_error([&] { CsvTable::parse(bytes, "mem"); }, {"mem" + where, phrase});
  }

  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------
// Accepted input

TEST_F(CsvTest, ReadsHeaderRowsTextAndNumbers) {
  const std::string p = write("co2.csv",
                              "Date,CO2,adjusted CO2\n"
                              "1958-03-01,315.70,314.44\n"
                              "1958-04-01,317.46,315.16\n"
                              "1958-05-01,317.51,314.69\n");
  const CsvTable t = CsvTable::read(p);
  EXPECT_EQ(t.source(), p);
  EXPECT_EQ(t.columns(), (Strings{"Date", "CO2", "adjusted CO2"}));
  EXPECT_EQ(t.rows(), 3);
  EXPECT_TRUE(t.has_column("adjusted CO2"));
  EXPECT_FALSE(t.has_column("co2"));
  EXPECT_FALSE(t.has_column(""));
  EXPECT_EQ(texts(t.text("Date")), (Strings{"1958-03-01", "1958-04-01", "1958-05-01"}));
  EXPECT_EQ(texts(t.text("CO2")), (Strings{"315.70", "317.46", "317.51"}));
  EXPECT_EQ(t.numeric("CO2"), (Doubles{315.70, 317.46, 317.51}));
  EXPECT_EQ(t.numeric("adjusted CO2"), (Doubles{314.44, 315.16, 314.69}));
  EXPECT_EQ(t.line_of_row(0), 2);
  EXPECT_EQ(t.line_of_row(2), 4);
  std::vector<int64_t> times;
  for (const std::string_view d : t.text("Date")) times.push_back(parse_datetime(d).value());
  EXPECT_EQ(times, (std::vector<int64_t>{-373593600, -370915200, -368323200}));
}

TEST_F(CsvTest, ParseMatchesReadAndNamesTheSource) {
  const std::string bytes = "a,b\n1,2\n";
  const CsvTable t = CsvTable::parse(bytes, "in-memory");
  EXPECT_EQ(t.source(), "in-memory");
  const CsvTable f = CsvTable::read(write("x.csv", bytes));
  EXPECT_EQ(t.columns(), f.columns());
  EXPECT_EQ(texts(t.text("b")), texts(f.text("b")));
}

TEST_F(CsvTest, QuotedFieldsWithCommasQuotesAndNewlines) {
  const std::string bytes =
      "id,\"name, full\",note\n"
      "1,\"Smith, J.\",\"said \"\"hi\"\"\"\n"
      "2,\"two\nlines\",\"\"\n"
      "3,\"crlf\r\ninside\",\"\"\"\"\n"
      "4,plain,\"a,\"\"b\"\",c\"\n";
  const CsvTable t = CsvTable::parse(bytes, "q.csv");
  EXPECT_EQ(t.columns(), (Strings{"id", "name, full", "note"}));
  EXPECT_EQ(texts(t.text("name, full")),
            (Strings{"Smith, J.", "two\nlines", "crlf\r\ninside", "plain"}));
  EXPECT_EQ(texts(t.text("note")), (Strings{"said \"hi\"", "", "\"", "a,\"b\",c"}));
  // Rows after a multi-line field start on later file lines.
  EXPECT_EQ(t.line_of_row(0), 2);
  EXPECT_EQ(t.line_of_row(1), 3);
  EXPECT_EQ(t.line_of_row(2), 5);
  EXPECT_EQ(t.line_of_row(3), 7);
  EXPECT_EQ(t.numeric("id"), (Doubles{1, 2, 3, 4}));
}

TEST_F(CsvTest, QuoteRulesAroundSpacesAndUnquotedFields) {
  // Spaces before an opening or after a closing quote are dropped; a quote inside an unquoted
  // field is kept as text; spaces in unquoted cells are kept.
  const CsvTable t = CsvTable::parse("a,b,c\n  \"x, y\"  ,in\"side, z \n", "s.csv");
  EXPECT_EQ(texts(t.text("a")), (Strings{"x, y"}));
  EXPECT_EQ(texts(t.text("b")), (Strings{"in\"side"}));
  EXPECT_EQ(texts(t.text("c")), (Strings{" z "}));
}

TEST_F(CsvTest, LineEndingsLfCrlfCrAndMixed) {
  const Strings variants = {"t,v\n1,2.5\n3,4.5\n", "t,v\r\n1,2.5\r\n3,4.5\r\n",
                            "t,v\r1,2.5\r3,4.5\r", "t,v\r\n1,2.5\n3,4.5\r\n"};
  for (const std::string& bytes : variants) {
    SCOPED_TRACE(bytes);
    const CsvTable t = CsvTable::parse(bytes, "e.csv");
    EXPECT_EQ(t.columns(), (Strings{"t", "v"}));
    EXPECT_EQ(t.numeric("v"), (Doubles{2.5, 4.5}));
    EXPECT_EQ(texts(t.text("v")), (Strings{"2.5", "4.5"}));  // no stray '\r'
    EXPECT_EQ(t.line_of_row(1), 3);
  }
}

TEST_F(CsvTest, Utf8BomIsSkipped) {
  const CsvTable t = CsvTable::read(write("bom.csv",
                                          "\xef\xbb\xbf"
                                          "Date,x\n2020-01-01,1\n"));
  EXPECT_EQ(t.columns(), (Strings{"Date", "x"}));
  EXPECT_TRUE(t.has_column("Date"));
  // Non-ASCII text is kept as UTF-8.
  const CsvTable u = CsvTable::parse("température,ville\n21.5,Zürich\n", "u.csv");
  EXPECT_EQ(u.numeric("température"), (Doubles{21.5}));
  EXPECT_EQ(texts(u.text("ville")), (Strings{"Zürich"}));
}

// UTF-16 with a byte-order mark (Excel's "Unicode Text", pandas' encoding='utf-16') reads as its
// UTF-8 twin, line numbers and all; broken UTF-16 is named.
TEST_F(CsvTest, Utf16WithAByteOrderMarkReadsAsUtf8) {
  const std::u16string text = u"ville\tt\u00e9mp\r\nZ\u00fcrich\t21.5\r\n\U0001F600\t3\r\n";
  std::string little = "\xff\xfe", big = "\xfe\xff";
  for (char16_t u : text) {
    little += {char(u & 0xff), char(u >> 8)};
    big += {char(u >> 8), char(u & 0xff)};
  }
  for (const std::string& bytes : {little, big}) {
    const CsvTable t = CsvTable::read(write("u16.csv", bytes));
    EXPECT_EQ(t.columns(), (Strings{"ville", "t\u00e9mp"}));
    EXPECT_EQ(texts(t.text("ville")), (Strings{"Z\u00fcrich", "\U0001F600"}));
    EXPECT_EQ(t.numeric("t\u00e9mp"), (Doubles{21.5, 3}));
    EXPECT_EQ(t.line_of_row(1), 3);
  }
  const std::string unpaired(
      "\xff\xfe"
      "a\0\x3d\xd8"
      "b\0",
      8);  // a high surrogate, then b
  const std::string p = write("bad16.csv", unpaired);
  expect_error([&] { CsvTable::read(p); },
               {p + ": byte 4: not UTF-16 text (a high surrogate without its low one)"});
  const std::string odd = write("odd16.csv", std::string("\xff\xfe"
                                                         "a\0b",
                                                         5));
  expect_error([&] { CsvTable::read(odd); }, {odd + ": UTF-16 text", "odd number of bytes"});
  // Without its mark, UTF-16 is named rather than read as text with a NUL beside each character;
  // a NUL byte elsewhere is named with its line.
  std::string unmarked = little.substr(2);
  const std::string u = write("u16_unmarked.csv", unmarked);
  expect_error([&] { CsvTable::read(u); },
               {u + ": NUL bytes between its characters: UTF-16 text without a byte-order mark?"});
  expect_error([&] { CsvTable::parse(std::string("a,b\n1,2\n3,\0\n", 13), "nul.csv"); },
               {"nul.csv:3: a NUL byte (byte 10): not CSV text"});
  // Binary files users reach for are named: a .npz (zip), a .npy under another name, gzip.
  const std::string npz = write("arrays.npz", std::string("PK\x03\x04\x14\0\0\0", 8));
  expect_error([&] { CsvTable::read(npz); }, {npz + ": a zip archive (a .npz of numpy arrays"});
  const std::string npy = write("array.bin", std::string("\x93NUMPY\x01\0", 8));
  expect_error([&] { CsvTable::read(npy); }, {npy + ": a .npy array by its bytes"});
  const std::string gz = write("data.csv.gz", std::string("\x1f\x8b\x08\0", 4));
  expect_error([&] { CsvTable::read(gz); }, {gz + ": gzip-compressed"});
}

TEST_F(CsvTest, TrailingNewlineOptionalAndTrailingBlankLinesIgnored) {
  for (const std::string& bytes :
       {std::string("a,b\n1,2\n3,4"), std::string("a,b\n1,2\n3,4\n"),
        std::string("a,b\n1,2\n3,4\n\n\n"), std::string("a,b\r\n1,2\r\n3,4\r\n\r\n  \r\n\t\n"),
        std::string("a,b\n1,2\n3,4\n,\n , \n,\"\"\n\n"),  // a spreadsheet's empty rows
        std::string("a,b\n1,2\n3,4\n\n,\n\n,\n\n")}) {    // and blank lines between them
    SCOPED_TRACE(bytes);
    const CsvTable t = CsvTable::parse(bytes, "t.csv");
    EXPECT_EQ(t.rows(), 2);
    EXPECT_EQ(t.numeric("b"), (Doubles{2, 4}));
  }
  // Inside the data such a row is a row of empty cells.
  const CsvTable inside = CsvTable::parse("a,b\n1,2\n,\n3,4\n,\n", "i.csv");
  EXPECT_EQ(inside.rows(), 3);
  EXPECT_EQ(texts(inside.text("a")), (Strings{"1", "", "3"}));
  expect_error([] { CsvTable::parse("a,b\n,\n,\n", "e.csv"); },
               {"e.csv: no data rows after the header (line 1)"});
  expect_error([] { CsvTable::parse("a,b\n1,2\n,\n\n3,4\n", "b.csv"); },
               {"b.csv:4: blank line inside the data, expected 2 fields like the header"});
}

TEST_F(CsvTest, SingleColumnBlankLineInsideIsAnEmptyCell) {
  const CsvTable t = CsvTable::parse("x\n1\n\n3\n\n", "one.csv");
  EXPECT_EQ(t.rows(), 3);
  EXPECT_EQ(texts(t.text("x")), (Strings{"1", "", "3"}));
  EXPECT_EQ(t.line_of_row(1), 3);
  expect_error([&] { t.numeric("x"); }, {"one.csv:3: column 'x': empty cell is not a number"});
}

TEST_F(CsvTest, HeaderNamesAreTrimmedUnlessQuoted) {
  const CsvTable t = CsvTable::parse(" a , b\t,\" c \"\n1,2,3\n", "h.csv");
  EXPECT_EQ(t.columns(), (Strings{"a", "b", " c "}));
  EXPECT_EQ(t.numeric(" c "), (Doubles{3}));
}

TEST_F(CsvTest, EmptyFieldsAndTrailingEmptyField) {
  const CsvTable t = CsvTable::parse("a,b,c\n,,\n1,,\"\"\n", "e.csv");
  EXPECT_EQ(t.rows(), 2);
  EXPECT_EQ(texts(t.text("a")), (Strings{"", "1"}));
  EXPECT_EQ(texts(t.text("c")), (Strings{"", ""}));
}

TEST_F(CsvTest, NumericAcceptsSpacesSignsExponentsAndTinyValues) {
  const CsvTable t = CsvTable::parse(
      "x\n 1.5 \n-2\n+3\n1e3\n-4.25E-2\n.5\n5.\n\t7\t\n-0\n1e-400\n1.7976931348623157e308\n",
      "n.csv");
  const Doubles v = t.numeric("x");
  const Doubles expected = {1.5, -2, 3, 1000, -0.0425, 0.5, 5, 7, -0.0, 0, 1.7976931348623157e308};
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i], expected[i]) << "row " << i;
  EXPECT_TRUE(std::signbit(v[8]));
}

TEST_F(CsvTest, NumericReadsPandasBoolsAsOneAndZero) {
  const CsvTable t = CsvTable::parse("b\nTrue\nFalse\n true \nFALSE\nfalse\nTRUE\n", "b.csv");
  EXPECT_EQ(t.numeric("b"), (Doubles{1, 0, 1, 0, 0, 1}));
  EXPECT_EQ(parse_finite("True"), 1.0);
  for (const char* word : {"T", "F", "yes", "no", "Truth", "falsey"})
    EXPECT_FALSE(parse_finite(word)) << word;
  // One among numbers is no bool column: a damaged cell, named with a number beside it. Missing
  // cells are neither.
  const CsvTable mixed = CsvTable::parse("x\n0.5\n\n0.25\nTRUE\n0.75\n", "m.csv");
  expect_error([&] { mixed.numeric_or_missing("x"); },
               {"m.csv:5: column 'x': 'TRUE' is a truth value among numbers ('0.5' on line 2): a "
                "damaged cell? Write it as a number, or leave it empty as a missing one"});
  const CsvTable first = CsvTable::parse("x\nfalse\nNA\ntrue\n2\n", "f.csv");
  expect_error([&] { first.numeric_or_missing("x"); },
               {"f.csv:2: column 'x': 'false' is a truth value among numbers ('2' on line 5): a "
                "damaged cell? Write it as a number, or leave it empty as a missing one"});
  const CsvTable gappy = CsvTable::parse("b\nTrue\n\nFalse\n", "g.csv");
  EXPECT_TRUE(std::isnan(gappy.numeric_or_missing("b")[1]));
}

TEST_F(CsvTest, LineOfRowRejectsOutOfRange) {
  const CsvTable t = CsvTable::parse("a\n1\n", "r.csv");
  EXPECT_EQ(t.line_of_row(0), 2);
  expect_error([&] { t.line_of_row(1); }, {"r.csv", "out of range", "1 data rows"});
  expect_error([&] { t.line_of_row(-1); }, {"r.csv", "out of range"});
}

// ---------------------------------------------------------------------------------------------
// Numeric errors name the file, the line, the column and the cell.

TEST_F(CsvTest, NumericRejectsNonNumbers) {
  const std::string p = write("bad.csv",
                              "name,x\n"
                              "a,1\n"
                              "\"multi\nline\",2\n"
                              "c,abc\n");
  const CsvTable t = CsvTable::read(p);
  expect_error([&] { t.numeric("x"); }, {p + ":5: column 'x': 'abc' is not a number"});
  expect_error([&] { t.numeric("name"); }, {p + ":2: column 'name': 'a' is not a number"});
}

TEST_F(CsvTest, NumericRejectsEachKindOfBadCell) {
  struct Case {
    std::string cell, message;
  };
  const std::vector<Case> cases = {
      {"", "empty cell is not a number"},
      {"   ", "empty cell is not a number"},
      {"\"\"", "empty cell is not a number"},
      {"NaN", "'NaN' marks a missing value, not a number"},
      {"nan", "'nan' marks a missing value, not a number"},
      {" null ", "' null ' marks a missing value, not a number"},
      {"#N/A", "'#N/A' marks a missing value, not a number"},
      {"nA", "'nA' marks a missing value, not a number"},
      {"NAN.", "'NAN.' is not a number"},
      {"-inf", "'-inf' is not a finite number"},
      {"Infinity", "'Infinity' is not a finite number"},
      {"1e999", "'1e999' is not a finite number"},
      {"-1e99999", "'-1e99999' is not a finite number"},
      {"\"1,5\"",
       "'1,5' is not a number (a decimal comma: write 1.5, or separate the fields "
       "with ';' or tabs)"},
      {"\"1,234.5\"", "'1,234.5' is not a number (a thousands separator: write 1234.5)"},
      {"\"-12,345,678\"", "'-12,345,678' is not a number (a thousands separator"},
      {"$185.64", "'$185.64' is not a number (a currency sign: write the number alone"},
      {"\"\xe2\x82\xac"
       "1,234\"",
       "'\xe2\x82\xac"
       "1,234' is not a number (a currency sign"},
      {"12.5\xc2\xa3", "'12.5\xc2\xa3' is not a number (a currency sign"},
      {"5.2%", "'5.2%' is not a number (a percentage: write the number alone, 5.2 or 0.052)"},
      {"1.2M", "'1.2M' is not a number (a suffix for thousands, millions or billions"},
      {"(12.5)", "'(12.5)' is not a number (an accountant's negative: write -12.5)"},
      {"\xe2\x88\x92"
       "5.5",
       "'\xe2\x88\x92"
       "5.5' is not a number (a typographic minus sign"},
      {"12.5 kWh",
       "'12.5 kWh' is not a number (a unit after the number, 'kWh': write the "
       "number alone)"},
      {"20\xc2\xb0"
       "C",
       "'20\xc2\xb0"
       "C' is not a number (a unit after the number, '\xc2\xb0"
       "C'"},
      {"1.5abc", "'1.5abc' is not a number (a unit after the number, 'abc'"},
      {"1 000",
       "'1 000' is not a number (thousands grouped by spaces: write the number without "
       "them)"},
      {"5\xe2\x80\xaf"
       "251.5",
       "'5\\u202f251.5' is not a number (thousands grouped by spaces"},
      {"1 00", "'1 00' is not a number"},
      {"+-1", "'+-1' is not a number"},
      {"+", "'+' is not a number"},
      {"NA", "'NA' marks a missing value, not a number"},
      {"NAs", "'NAs' is not a number"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.cell);
    const CsvTable t = CsvTable::parse("t,value\n0,1\n1," + c.cell + "\n", "cells.csv");
    expect_error([&] { t.numeric("value"); }, {"cells.csv:3: column 'value': " + c.message});
  }
  // A file of decimal commas: the reasons read the cell as its column writes numbers.
  for (const auto& [cell, reason] : std::vector<std::pair<std::string, std::string>>{
           {"12,5%", "(a percentage"},
           {"12,5 kg", "(a unit after the number, 'kg'"},
           {"5\xc2\xa0"
            "251,0",
            "(thousands grouped by spaces"}}) {
    const CsvTable t = CsvTable::parse("t;value\n0;1,5\n1;" + cell + "\n", "commas.csv");
    try {
      t.numeric("value");
      ADD_FAILURE() << cell;
    } catch (const Error& e) {
      EXPECT_NE(std::string_view(e.what()).find(reason), std::string_view::npos) << e.what();
    }
  }
  // A cell that is nothing recognisable gets no reason.
  for (const char* cell : {"\"1,23,4\"", "0x10", "1e", "$", "%", "(1", "\"1,5,\""}) {
    const CsvTable t = CsvTable::parse(std::string("value\n") + cell + "\n", "cells.csv");
    try {
      t.numeric("value");
      ADD_FAILURE() << cell;
    } catch (const Error& e) {
      EXPECT_TRUE(std::string_view(e.what()).ends_with("is not a number")) << e.what();
    }
  }
}

// Missing cells: empty ones, the words written for a missing value (any case) and the codes of
// data.missing_values, a number matching by value and a text by its letters; NaN with
// numeric_or_missing, an error naming the cell with numeric.
TEST_F(CsvTest, MissingWordsAndCodesAreMissingCells) {
  CsvTable t =
      CsvTable::parse("v\n1\n\n NA \nNone\n<NA>\n-99.99\n-99.990\n-99.9\nn.a.\n9999\n", "m.csv");
  auto missing = [&] {
    std::vector<int> rows;
    const Doubles x = t.numeric_or_missing("v");
    for (size_t r = 0; r < x.size(); ++r)
      if (std::isnan(x[r])) rows.push_back(int(r));
    return rows;
  };
  expect_error([&] { missing(); }, {"m.csv:10: column 'v': 'n.a.' is not a number"});
  t.set_missing_codes({"n.a."});
  EXPECT_EQ(missing(), (std::vector<int>{1, 2, 3, 4, 8}));
  t.set_missing_codes({"-99.99", " n.a. "});
  EXPECT_EQ(missing(), (std::vector<int>{1, 2, 3, 4, 5, 6, 8}));
  EXPECT_EQ(t.numeric_or_missing("v")[7], -99.9);
  EXPECT_EQ(t.numeric_or_missing("v")[9], 9999);
  // A code with a decimal comma matches by value as well.
  CsvTable semi = CsvTable::parse("v;w\n1,5;0\n-1,00;1\n", "c.csv");
  semi.set_missing_codes({"-1,0"});
  EXPECT_TRUE(std::isnan(semi.numeric_or_missing("v")[1]));
  // Without the words (data.missing_words: false, pandas' keep_default_na=False) only empty cells
  // and the codes are missing: "None" is a text, a category's name.
  t.set_missing_codes({"n.a."}, false);
  EXPECT_TRUE(t.is_missing(" ") && t.is_missing("n.a.") && !t.is_missing("None"));
  expect_error([&] { missing(); }, {"m.csv:4: column 'v': ' NA ' is not a number"});
  const CsvTable u = CsvTable::parse("v\n1\n-99.990\n", "u.csv");
  CsvTable coded = u;
  coded.set_missing_codes({"-99.99"});
  EXPECT_EQ(u.numeric("v"), (Doubles{1, -99.99}));
  expect_error([&] { coded.numeric("v"); },
               {"u.csv:3: column 'v': '-99.990' marks a missing value, not a number"});
  for (double x : {9.0, -99.0, 99.9, -99.99, -999.0, 9999.0, -9999.9, 999999.0})
    EXPECT_TRUE(is_nines(x)) << x;
  for (double x : {0.9, 8.0, 90.0, -99.98, 1e10, 99.5, 0.0, 19.0}) EXPECT_FALSE(is_nines(x)) << x;
}

TEST_F(CsvTest, AHeaderWithoutCommasTellsTheSeparator) {
  const CsvTable semi = CsvTable::parse("date;value\n2020-01-01;1\n", "semi.csv");
  EXPECT_EQ(semi.delimiter(), ';');
  EXPECT_EQ(semi.columns(), (Strings{"date", "value"}));
  EXPECT_EQ(semi.numeric("value"), (Doubles{1}));
  const CsvTable tabs = CsvTable::parse("date\tvalue\t\n2020-01-01\t1\t\n", "tabs.tsv");
  EXPECT_EQ(tabs.delimiter(), '\t');
  EXPECT_EQ(tabs.delimiter_name(), "tabs");
  EXPECT_EQ(tabs.columns(), (Strings{"date", "value"}));  // the trailing tab: an empty column
  const CsvTable quoted = CsvTable::parse("\"a\"\"\"\t\"b\"\n1\t2\n", "q.tsv");
  EXPECT_EQ(quoted.columns(), (Strings{"a\"", "b"}));
  const CsvTable pipes = CsvTable::parse("a | b\n1 | 2\n", "p.txt");
  EXPECT_EQ(pipes.delimiter(), '|');
  EXPECT_EQ(pipes.numeric("b"), (Doubles{2}));
  // A comma in the header, outside quotes, makes it comma-separated whatever else it holds.
  const CsvTable comma = CsvTable::parse("\"a;b\"\t,c\n\"1;2\",3\n", "c.csv");
  EXPECT_EQ(comma.delimiter(), ',');
  EXPECT_EQ(comma.columns(), (Strings{"a;b", "c"}));
  // Unless the next line separates as often by another of the header's separators.
  const CsvTable unit = CsvTable::parse("date;x;y, mm\n2021-01-01;1;2,5\n", "u.csv");
  EXPECT_EQ(unit.delimiter(), ';');
  EXPECT_EQ(unit.columns(), (Strings{"date", "x", "y, mm"}));
  EXPECT_EQ(unit.numeric("y, mm"), (Doubles{2.5}));
  // As often: the other separator too ("Temperatur, °C" beside decimal commas).
  const CsvTable tie =
      CsvTable::parse("Datum;Temperatur, C;Druck, hPa\n2023-01-01;20,3;1013,2\n", "tie.csv");
  EXPECT_EQ(tie.delimiter(), ';');
  EXPECT_EQ(tie.numeric("Druck, hPa"), (Doubles{1013.2}));
  // A header split at commas that holds another separator says so where a column is missing.
  expect_error([&] { CsvTable::parse("a;b,c\n1,2\n", "w.csv").text("a"); },
               {"w.csv: no column 'a' (columns: a;b, c; the header was split at ',': a file "
                "separated by another starts with a line naming it, such as sep=;)"});
  // Neither: one column, whose cells may hold any of them; a trailing tab separates nothing.
  const CsvTable one = CsvTable::parse("text\t\n\"a;b,c\"\n", "one.csv");
  EXPECT_EQ(one.delimiter(), ',');
  EXPECT_EQ(one.columns(), (Strings{"text"}));
  expect_rejected("a;b\n1;2\n3\n", ":3",
                  "1 field, the header has 2 (separated by ';', as the header is)");
  expect_rejected("a\tb\n1\t2\t3\n", ":2", "3 fields, the header has 2 (separated by tabs");
  // A spreadsheet's "sep=" first line names the separator; line numbers still count it.
  const CsvTable excel = CsvTable::parse("sep=;\r\ndate;v,w\r\n2020-01-01;1,5\r\n", "x.csv");
  EXPECT_EQ(excel.delimiter(), ';');
  EXPECT_EQ(excel.columns(), (Strings{"date", "v,w"}));
  EXPECT_EQ(excel.numeric("v,w"), (Doubles{1.5}));
  EXPECT_EQ(excel.line_of_row(0), 3);
  const CsvTable excel_tabs = CsvTable::parse("sep=\t\na\tb\n1\t2\n", "x.tsv");
  EXPECT_EQ(excel_tabs.columns(), (Strings{"a", "b"}));
  expect_rejected("sep=,\n", "", "empty file, expected a header row");
  expect_rejected("sep=;\na;b\n1;2;3\n", ":3", "3 fields, the header has 2");
  // A logger's comment lines before the header.
  expect_rejected("# logger v2\ntime,value\n0,1\n", ":2",
                  "2 fields, the header has 1; the header '# logger v2' reads as a comment: a "
                  "file's first line is its header, so remove the lines before it");
}

TEST_F(CsvTest, TabsLeaveQuotesThatDoNotCloseAFieldAsText) {
  // GLUE's TSV files quote nothing and hold quotes as text; a field quoted as RFC 4180 quotes it
  // (a tab inside) is read as such.
  const CsvTable t = CsvTable::parse(
      "label\ttext\n"
      "1\tAmrozi called his brother \" the witness \" .\n"
      "0\t\" I think so \" , he said .\n"
      "1\t\"a\tb \"\"c\"\"\"\n"
      "0\t\"open\n",
      "glue.tsv");
  EXPECT_EQ(texts(t.text("text")),
            (Strings{"Amrozi called his brother \" the witness \" .",
                     "\" I think so \" , he said .", "a\tb \"c\"", "\"open"}));
  EXPECT_EQ(t.numeric("label"), (Doubles{1, 0, 1, 0}));
  // Commas and semicolons keep RFC 4180's rule: a quote that does not close its field is an error.
  expect_rejected("a;b\n1;\"x\" y\n", ":2", "after the closing quote of field 2");
}

TEST_F(CsvTest, SemicolonsTakeDecimalCommasAndNeverGuessAPoint) {
  const CsvTable t = CsvTable::parse(
      "temp;load;code\n"
      "20,5;100;1.5\n"
      "-0,25;1e3;2\n"
      "NA;7;3\n",
      "eu.csv");
  EXPECT_TRUE(t.decimal_commas("temp"));
  EXPECT_FALSE(t.decimal_commas("load"));
  EXPECT_FALSE(t.decimal_commas("code"));
  const Doubles temp = t.numeric_or_missing("temp");
  EXPECT_EQ(temp[0], 20.5);
  EXPECT_EQ(temp[1], -0.25);
  EXPECT_TRUE(std::isnan(temp[2]));
  EXPECT_EQ(t.numeric("load"), (Doubles{100, 1000, 7}));
  CsvTable coded = CsvTable::parse("v;w\n1,5;0\nn.a.;0\n-99,9;0\n", "coded.csv");
  coded.set_missing_codes({"n.a.", "-99.9"});
  const Doubles v = coded.numeric_or_missing("v");
  EXPECT_EQ(v[0], 1.5);
  EXPECT_TRUE(std::isnan(v[1]) && std::isnan(v[2]));
  EXPECT_EQ(t.numeric("code"), (Doubles{1.5, 2, 3}));  // no comma: points are decimal points
  const CsvTable mixed = CsvTable::parse("v;w\n1,5;0\n1.234;0\n2,5,1;0\n", "mixed.csv");
  expect_error([&] { mixed.numeric("v"); },
               {"mixed.csv:3: column 'v': '1.234' has a point where the column writes decimal "
                "commas ('1,5' on line 2): a thousands separator?"});
  // Nor may another column write points that could group thousands: "1.010" is 1010 or 1.01.
  const CsvTable grouped = CsvTable::parse("v;w\n1,5;950\n2,5;1.010\n3,5;1.25\n", "grouped.csv");
  expect_error([&] { grouped.numeric("w"); },
               {"grouped.csv:3: column 'w': '1.010' has a point where the file writes decimal "
                "commas ('1,5' in column 'v' on line 2): a thousands separator?"});
  EXPECT_EQ(CsvTable::parse("v;w\n1,5;950\n2,5;1.25\n", "points.csv").numeric("w"),
            (Doubles{950, 1.25}));
  // No decimal comma anywhere: a point is a decimal point, unless every point could group
  // thousands beside integers of three digits (950, then 1.01: a German export of counts).
  expect_error([&] { CsvTable::parse("v;w\nx;950\ny;1.010\n", "counts.csv").numeric("w"); },
               {"counts.csv:3: column 'w': '1.010' reads as a decimal beside '950' on line 2: a "
                "thousands separator? Write the column's numbers without the points (or, where "
                "they are decimal points, write a point in the integers too: '950.0')"});
  EXPECT_EQ(CsvTable::parse("v;w\nx;950.0\ny;1.010\n", "no_commas.csv").numeric("w"),
            (Doubles{950, 1.01}));
  EXPECT_EQ(CsvTable::parse("v;w\nx;95\ny;1.010\n", "small.csv").numeric("w"), (Doubles{95, 1.01}));
  EXPECT_EQ(CsvTable::parse("v,w\nx,950\ny,1.010\n", "commas.csv").numeric("w"),
            (Doubles{950, 1.01}));
  const CsvTable twice = CsvTable::parse("v;w\n1,5;0\n2,5,1;0\n", "twice.csv");
  expect_error([&] { twice.numeric("v"); }, {"twice.csv:3: column 'v': '2,5,1' is not a number"});
  // A tab- or '|'-separated file (Excel's "Unicode Text" in a decimal-comma locale) reads decimal
  // commas where a comma cannot group thousands; a column whose commas all could ("3,699") stays
  // an error, naming both readings where another column writes "1,5" (which may be a list, not
  // a number); the points of a file that writes decimal commas are checked as a ';' file's are.
  const CsvTable tabs = CsvTable::parse("v\tw\tk\n1,5\t0\t1,234\n-0,125\t1\t2,000\n", "t.tsv");
  EXPECT_TRUE(tabs.decimal_commas("v"));
  EXPECT_EQ(tabs.numeric("v"), (Doubles{1.5, -0.125}));
  EXPECT_FALSE(tabs.decimal_commas("k"));
  expect_error([&] { tabs.numeric("k"); },
               {"t.tsv:2: column 'k': '1,234' is not a number: a decimal comma (1.234, as '1,5' "
                "in column 'v' on line 2 may write) or a thousands separator (1234)? Write the "
                "column's numbers with a decimal point"});
  const CsvTable thousands = CsvTable::parse("w\tk\n0\t1,234\n1\t2,000\n", "k.tsv");
  EXPECT_FALSE(thousands.decimal_commas("k"));
  expect_error([&] { thousands.numeric("k"); },
               {"k.tsv:2: column 'k': '1,234' is not a number (a thousands separator"});
  expect_error([&] { CsvTable::parse("v\tn\n20,3\t1.142\n20,5\t919\n", "n.tsv").numeric("n"); },
               {"n.tsv:2: column 'n': '1.142' reads as a decimal beside '919' on line 3"});
  EXPECT_EQ(CsvTable::parse("v\tn\n20.3\t1.142\n20.5\t919\n", "points.tsv").numeric("n"),
            (Doubles{1.142, 919}));
  // A comma that cannot group thousands in other forms: four digits before it (pandas'
  // to_csv(decimal=',') of 1023.031), points between thousands before it, an exponent.
  const CsvTable forms =
      CsvTable::parse("a\tb\tc\n1023,031\t1.234,5\t2,5e3\n7,125\t2,000\t1,5e-05\n", "f.tsv");
  EXPECT_EQ(forms.numeric("a"), (Doubles{1023.031, 7.125}));
  EXPECT_TRUE(forms.decimal_commas("c"));
  EXPECT_EQ(forms.numeric("c"), (Doubles{2500, 1.5e-5}));
  for (const char* evidence : {"1.234,50", "2,5e3", "1234,567"})
    expect_error(
        [&] {
          CsvTable::parse(std::string("stueck\tev\n1.250\t") + evidence + "\n2.500\t1\n", "e.tsv")
              .numeric("stueck");
        },
        {"e.tsv:2: column 'stueck': '1.250' has a point where the file writes decimal commas"});
  // Not a comma file's quoted "0,5", nor "1,2" in a column of other texts (a list): a point
  // there is a decimal point.
  EXPECT_EQ(
      CsvTable::parse("anteil,stueck\n\"0,5\",51.507\n\"0,75\",980\n", "q.csv").numeric("stueck"),
      (Doubles{51.507, 980}));
  EXPECT_EQ(CsvTable::parse("tags\tlat\n1,2\t51.507\nb\t1.250\n", "l.tsv").numeric("lat"),
            (Doubles{51.507, 1.25}));
  // A code keeps matching its own text where its comma is no decimal one.
  CsvTable listed = CsvTable::parse("t\tv\na\t10.5\nb\t-9,999\n", "k.tsv");
  listed.set_missing_codes({"-9,999"});
  EXPECT_TRUE(std::isnan(listed.numeric_or_missing("v")[1]));
  EXPECT_EQ(CsvTable::parse("v|w\n1,234|0\n20,5|1\n", "p.txt").numeric("v"),
            (Doubles{1.234, 20.5}));
  // A comma-separated file's quoted "1,5" is no decimal comma.
  const CsvTable commas = CsvTable::parse("v,w\n\"1,5\",0\n", "c.csv");
  EXPECT_FALSE(commas.decimal_commas("v"));
  expect_error([&] { commas.numeric("v"); }, {"c.csv:2: column 'v': '1,5' is not a number"});
}

TEST_F(CsvTest, UnknownColumnListsTheColumns) {
  const CsvTable t = CsvTable::parse("a,b,c\n1,2,3\n", "cols.csv");
  expect_error([&] { t.text("x"); }, {"cols.csv: no column 'x' (columns: a, b, c)"});
  expect_error([&] { t.numeric("A"); }, {"cols.csv: no column 'A' (columns: a, b, c)"});
  std::string header, row;
  for (int i = 0; i < 30; ++i) {
    header += (i ? ",c" : "c") + std::to_string(i);
    row += i ? ",0" : "0";
  }
  const CsvTable wide = CsvTable::parse(header + "\n" + row + "\n", "wide.csv");
  expect_error([&] { wide.text("zz"); }, {"wide.csv: no column 'zz'", "c19, ... (30 in all)"});
}

TEST_F(CsvTest, ErrorMessagesStayOnOneLineForHostileCells) {
  const CsvTable t = CsvTable::parse("x\n\"a\nb\x01'\\\"\n", "h.csv");
  expect_error([&] { t.numeric("x"); }, {"h.csv:2: column 'x': \"a\\x0ab\\x01'\\x5c\""});
  const CsvTable long_cell = CsvTable::parse("x\n" + std::string(10000, 'z') + "\n", "l.csv");
  try {
    long_cell.numeric("x");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u);
    EXPECT_NE(std::string(e.what()).find("...' is not a number"), std::string::npos);
  }
}

// ---------------------------------------------------------------------------------------------
// Malformed files

TEST_F(CsvTest, RejectsMissingFileAndDirectory) {
  const std::string missing = (dir_ / "no_such.csv").string();
  expect_error([&] { CsvTable::read(missing); }, {missing + ": cannot open"});
  const std::string sub = (dir_ / "sub").string();
  fs::create_directory(sub);
  expect_error([&] { CsvTable::read(sub); }, {sub + ": not a regular file"});
  // A named pipe without a writer is refused at once, not waited on.
  const std::string pipe = (dir_ / "pipe.csv").string();
  ASSERT_EQ(::mkfifo(pipe.c_str(), 0600), 0);
  expect_error([&] { CsvTable::read(pipe); }, {pipe + ": not a regular file"});
}

TEST_F(CsvTest, RejectsAFileLargerThanTheMemoryAvailable) {
  // Sparse: as large as the memory available and a GiB more, on no disk.
  const std::string huge = (dir_ / "huge.csv").string();
  write("huge.csv", "a,b\n1,2\n");
  fs::resize_file(huge, static_cast<uintmax_t>(available_memory_bytes()) + (uintmax_t{1} << 30));
  expect_error([&] { CsvTable::read(huge); },
               {huge + ": ", "MB, more than the ", " MB of memory available to read it into"});
}

TEST_F(CsvTest, CellsKeepTheirTextAndOrder) {
  // A column's cells back to back: empty ones, quoted ones with doubled quotes, long ones.
  const std::string long_cell(100, 'x');
  const CsvTable t =
      CsvTable::read(write("cells.csv", "a,b\n,\"q \"\"x\"\"\"\n" + long_cell + ",2\nlast,\n"));
  EXPECT_EQ(texts(t.text("a")), (Strings{"", long_cell, "last"}));
  EXPECT_EQ(texts(t.text("b")), (Strings{"q \"x\"", "2", ""}));
  EXPECT_EQ(t.text("a").size(), 3u);
  EXPECT_EQ(t.text("b")[1], "2");
}

TEST_F(CsvTest, RejectsEmptyFile) {
  for (const std::string& bytes :
       {std::string(), std::string("\xef\xbb\xbf"), std::string("\n"), std::string("\r\n \n\n")}) {
    SCOPED_TRACE(bytes);
    expect_rejected(bytes, ": empty file", "expected a header row");
  }
  expect_rejected("\na,b\n1,2\n", ":1: blank line", "expected a header row");
}

TEST_F(CsvTest, RejectsHeaderWithoutDataRows) {
  for (const std::string& bytes : {std::string("a,b"), std::string("a,b\n"),
                                   std::string("a,b\r\n\r\n\n"), std::string("\"a\nb\",c\n")}) {
    SCOPED_TRACE(bytes);
    expect_rejected(bytes, ": no data rows", "after the header");
  }
}

TEST_F(CsvTest, RejectsRaggedRows) {
  expect_rejected("a,b,c,d\n1,2,3,4\n1,2,3\n", ":3: 3 fields, the header has 4", "the header has");
  expect_rejected("a,b\n1,2,3\n", ":2: 3 fields, the header has 2", "the header has");
  expect_rejected("a,b\n1,2\n3\n", ":3: 1 field, the header has 2", "the header has");
  expect_rejected("a,b\n1,2,\n", ":2: 3 fields", "the header has 2");
  // The line is where the row starts, counting lines inside quoted fields.
  expect_rejected("a,b\n\"x\ny\",1\n\"z\r\nw\"\n", ":4: 1 field", "the header has 2");
}

TEST_F(CsvTest, RejectsBlankLineInsideMultiColumnData) {
  expect_rejected("a,b\n1,2\n\n3,4\n", ":3: blank line inside the data", "expected 2 fields");
  expect_rejected("a,b\r\n1,2\r\n  \r\n\r\n3,4\r\n", ":3: blank line", "expected 2 fields");
}

TEST_F(CsvTest, RejectsUnterminatedQuote) {
  expect_rejected("a,b\n1,\"open\n2,3\n4,5\n", ":2: unterminated quoted field 2", "never closed");
  expect_rejected("a,b\n1,2\n3,\"", ":3: unterminated quoted field", "never closed");
  expect_rejected("\"a,b\n1,2\n", ":1: unterminated quoted field 1", "never closed");
}

TEST_F(CsvTest, RejectsTextAfterClosingQuote) {
  expect_rejected("a,b\n1,\"x\"y\n", ":2: unexpected 'y' after the closing quote of field 2",
                  "written \"\"");
  expect_rejected("a,b\n\"x\"\"\"z,1\n", ":2: unexpected 'z'", "closing quote");
  expect_rejected("a,b\n1,\"two\nlines\" \"\n", ":3: unexpected '\"'", "closing quote");
}

// A first column without a name that holds values is the index pandas writes by default, named
// as pandas reads it back; a second such column, or one that is not first, is an error.
TEST_F(CsvTest, AFirstUnnamedColumnWithValuesIsPandasIndex) {
  for (const char* header : {",a,b", " ,a,b", "\"\",a,b"}) {
    const CsvTable t =
        CsvTable::parse(std::string(header) + "\n2020-01-01,1,2\n2020-01-02,3,4\n", "pd.csv");
    EXPECT_EQ(t.columns(), (Strings{CsvTable::kIndexColumn, "a", "b"})) << header;
    EXPECT_EQ(texts(t.text("Unnamed: 0")), (Strings{"2020-01-01", "2020-01-02"}));
    EXPECT_EQ(t.numeric("b"), (Doubles{2, 4}));
  }
  const CsvTable empty_index = CsvTable::parse(",a\n,1\n", "e.csv");  // no values: dropped
  EXPECT_EQ(empty_index.columns(), (Strings{"a"}));
  expect_rejected(",Unnamed: 0,a\n0,1,2\n", ":1: column 1", "empty name");
  expect_rejected(",a,\n0,1,2\n", ":1: column 3 of the header has an empty name", "values");
}

// A column without a name is dropped when it is empty (a spreadsheet's trailing commas), and an
// error naming its first value otherwise.
TEST_F(CsvTest, UnnamedColumnsMustBeEmptyAndAreDropped) {
  expect_rejected("a,,c\n1,2,3\n",
                  ":1: column 2 of the header has an empty name, and holds "
                  "values (line 2)",
                  "empty name");
  expect_rejected("a,b,\n1,2,\n4,5,6\n",
                  ":1: column 3 of the header has an empty name, and "
                  "holds values (line 3)",
                  "empty name");
  expect_rejected(",b,\n1,2,3\n", ":1: column 3", "empty name");
  // One name of three: a title above the header, said so.
  expect_rejected("Sensor export 2023,,\ndate,temp,count\n2023-01-01,1,2\n",
                  ":1: column 2 of the header has an empty name, and holds values (line 2); is "
                  "line 1 a title above the header? A file's first line is its header",
                  "empty name");
  expect_rejected("\"\"\n1\n", ":1: column 1", "empty name");
  expect_rejected(",\n,\n", ":1: the header names no column", "names no column");
  const CsvTable t = CsvTable::parse("a,,b,,\n1,,2,,\n3, ,4,\"\",\n", "x.csv");
  EXPECT_EQ(t.columns(), (Strings{"a", "b"}));
  EXPECT_EQ(t.numeric("b"), (Doubles{2, 4}));
  EXPECT_EQ(t.numeric("a"), (Doubles{1, 3}));
  EXPECT_EQ(t.columns_hint(), " (columns: a, b)");
}

TEST_F(CsvTest, RejectsDuplicateHeaderNames) {
  expect_rejected("a,b,a\n1,2,3\n", ":1: duplicate column name 'a' (columns 1 and 3)", "duplicate");
  expect_rejected("a, b,\"b\"\n1,2,3\n", ":1: duplicate column name 'b' (columns 2 and 3)",
                  "spaces around an unquoted header name are not part of it");
}

// ---------------------------------------------------------------------------------------------
// parse_datetime

TEST(ParseDatetime, DatesAndTimes) {
  EXPECT_EQ(parse_datetime("1970-01-01"), 0);
  EXPECT_EQ(parse_datetime("2012-01-01"), 1325376000);
  EXPECT_EQ(parse_datetime("2012-01-01 13:00"), 1325376000 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012-01-01T13:00"), 1325376000 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012-01-01T13:00:00"), 1325376000 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012-01-01T13:00:00Z"), 1325376000 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012-01-01 13:45:59"), 1325376000 + 13 * 3600 + 45 * 60 + 59);
  EXPECT_EQ(parse_datetime("2012-01-01t13:00z"), 1325376000 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012-01-01T13:00:00.999"), 1325376000 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012-01-01T13:00:00.5Z"), 1325376000 + 13 * 3600);
  EXPECT_EQ(microseconds_of("2012-01-01T13:00:00.5Z"), 500000);
  EXPECT_EQ(parse_datetime("2012-01-01 13:00:00,250"), 1325376000 + 13 * 3600);
  EXPECT_EQ(microseconds_of("2012-01-01 13:00:00,250"), 250000);
  EXPECT_EQ(parse_datetime("2012-01-01 13:00:00,"), std::nullopt);
  EXPECT_EQ(microseconds_of("01/31/2012 1:45:09.001 PM"), 1000);
  EXPECT_EQ(microseconds_of("2012-01-01T13:00:00.123456789"), 123456);
  EXPECT_EQ(microseconds_of("2012-01-01 13:00:00.000007+02:00"), 7);
  EXPECT_EQ(microseconds_of("2012-01-01T13:00:00.000"), 0);
  EXPECT_EQ(microseconds_of("2012-01-01T13:00:00"), 0);
  EXPECT_EQ(microseconds_of("2012-01-01"), 0);
  EXPECT_EQ(parse_datetime("  2012-01-01 "), 1325376000);
  EXPECT_EQ(parse_datetime("2000-02-29"), 951782400);  // divisible by 400: leap
  EXPECT_EQ(parse_datetime("2016-02-29T23:59:59"), 1456790399);
  EXPECT_EQ(parse_datetime("1969-12-31T23:59:59"), -1);
  EXPECT_EQ(parse_datetime("1958-03-01"), -373593600);
  EXPECT_EQ(parse_datetime("0001-01-01"), -62135596800);
  EXPECT_EQ(parse_datetime("9999-12-31T23:59:59Z"), 253402300799);
  // Whether a time is marked as UTC or with an offset, +00:00 included.
  for (const auto& [text, marked] : {std::pair{"2012-01-01T13:00", false},
                                     {"2012-01-01T13:00Z", true},
                                     {"2012-01-01 13:00 UTC", true},
                                     {"2012-01-01 13:00+00:00", true},
                                     {"2012-01-01 13:00-0500", true},
                                     {"2012-01-01", false}}) {
    bool zoned = !marked;
    int64_t offset = 1;
    EXPECT_TRUE(parse_date(text, DateLayout::iso, &offset, &zoned).has_value()) << text;
    EXPECT_EQ(zoned, marked) << text;
  }
  bool zoned = true;
  EXPECT_TRUE(parse_date("12/31/2020 1:45 PM GMT", DateLayout::month_first, nullptr, &zoned));
  EXPECT_TRUE(zoned);
  EXPECT_TRUE(parse_date("12/31/2020 1:45 PM", DateLayout::month_first, nullptr, &zoned));
  EXPECT_FALSE(zoned);
}

TEST(ParseDatetime, SlashesAndMonths) {
  EXPECT_EQ(parse_datetime("2012/01/01"), 1325376000);
  EXPECT_EQ(parse_datetime("2012/01/01 13:00"), 1325376000 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012-01"), 1325376000);  // a month: its first day
  EXPECT_EQ(parse_datetime("1958-03"), -373593600);
}

TEST(ParseDate, DayOrMonthFirst) {
  const int64_t jan2 = 1325376000 + 86400;  // 2012-01-02
  EXPECT_EQ(parse_date("02/01/2012", DateLayout::day_first), jan2);
  EXPECT_EQ(parse_date("2/1/2012", DateLayout::day_first), jan2);
  EXPECT_EQ(parse_date("02.01.2012", DateLayout::day_first), jan2);
  EXPECT_EQ(parse_date("02-01-2012", DateLayout::day_first), jan2);
  EXPECT_EQ(parse_date("01/02/2012", DateLayout::month_first), jan2);
  EXPECT_EQ(parse_date(" 1/2/2012 ", DateLayout::month_first), jan2);
  EXPECT_EQ(parse_date("01/02/2012", DateLayout::day_first), jan2 + 30 * 86400);  // 1 February
  EXPECT_EQ(parse_date("31/12/2020 13:45", DateLayout::day_first), 1609422300);
  EXPECT_EQ(parse_date("31.12.2020 13:45:59", DateLayout::day_first), 1609422359);
  EXPECT_EQ(parse_date("12/31/2020 1:45 PM", DateLayout::month_first), 1609422300);
  EXPECT_EQ(parse_date("12/31/2020 1:45:00 pm", DateLayout::month_first), 1609422300);
  EXPECT_EQ(parse_date("12/31/2020 12:05 AM", DateLayout::month_first), 1609372800 + 300);
  EXPECT_EQ(parse_date("12/31/2020 12:05 PM", DateLayout::month_first),
            1609372800 + 12 * 3600 + 300);
  EXPECT_EQ(parse_date("12/31/2020 9:05", DateLayout::month_first), 1609372800 + 9 * 3600 + 300);
  EXPECT_EQ(parse_date("12/31/2020T09:05Z", DateLayout::month_first), 1609372800 + 9 * 3600 + 300);
  for (const char* s :
       {"31/12/2020", "12/31/20", "12/31/2020 13:45 PM", "12/31/2020 0:45 AM", "12/31/2020 1:45 XM",
        "12/31/2020 1:45PM", "12/31/2020 1:4", "12/31/2020 T", "12/31-2020", "12//2020",
        "123/1/2020", "12/31/2020x", "02/30/2020", "2012-01-02", "20120102", ""})
    EXPECT_EQ(parse_date(s, DateLayout::month_first), std::nullopt) << "'" << s << "'";
  EXPECT_EQ(day_month_fields("31/12/2020 13:45"), (std::pair{31, 12}));
  EXPECT_EQ(day_month_fields("1.2.2012"), (std::pair{1, 2}));
  EXPECT_EQ(day_month_fields("2012-01-02"), std::nullopt);
  EXPECT_EQ(day_month_fields("1/2/12"), std::nullopt);
}

TEST(ParseDate, CompactAndIso) {
  EXPECT_EQ(parse_date("20120102", DateLayout::compact), 1325376000 + 86400);
  EXPECT_EQ(parse_date(" 20201231", DateLayout::compact), 1609372800);
  for (const char* s :
       {"20121301", "20120230", "2012010", "201201021", "17991231", "22000101", "2012-01-02",
        "20120102 13:00", "+2012010", "2012010200", "20120102.", "20120102.01"})
    EXPECT_EQ(parse_date(s, DateLayout::compact), std::nullopt) << "'" << s << "'";
  // A float column's writing, and YYYYMM months.
  EXPECT_EQ(parse_date("20120102.0", DateLayout::compact), 1325376000 + 86400);
  EXPECT_EQ(parse_date("201202", DateLayout::compact_month), 1325376000 + 31 * 86400);
  EXPECT_EQ(parse_date("201202.00", DateLayout::compact_month), 1325376000 + 31 * 86400);
  for (const char* s : {"201213", "201200", "20121", "2012021", "179912", "220001", "201202.5",
                        "201202.", "2012-02", "20120201"})
    EXPECT_EQ(parse_date(s, DateLayout::compact_month), std::nullopt) << "'" << s << "'";
  EXPECT_EQ(parse_date("2012-01-02T13:00", DateLayout::iso), parse_datetime("2012-01-02T13:00"));
  // YYYYMMDDHH[MM[SS]] (Germany's weather service's MESS_DATUM).
  EXPECT_EQ(parse_date("2012010213", DateLayout::compact_time), 1325376000 + 86400 + 13 * 3600);
  EXPECT_EQ(parse_date("201201021345", DateLayout::compact_time),
            1325376000 + 86400 + 13 * 3600 + 45 * 60);
  EXPECT_EQ(parse_date("20120102134507", DateLayout::compact_time),
            1325376000 + 86400 + 13 * 3600 + 45 * 60 + 7);
  for (const char* s : {"2012010224", "201201021360", "20120102134560", "20120102", "20120102134",
                        "1709071200", "2012013113x", "2012-01-0213"})
    EXPECT_EQ(parse_date(s, DateLayout::compact_time), std::nullopt) << "'" << s << "'";
}

// BigQuery's " UTC", one-digit months and days (R's and Excel's "2012-1-5"), and dates with the
// month's English name (Yahoo's "Jan 05, 2024", Excel's "05-Jan-2024").
TEST(ParseDate, UnpaddedIsoUtcAndNamedMonths) {
  const int64_t jan5 = 1325376000 + 4 * 86400;  // 2012-01-05
  EXPECT_EQ(parse_datetime("2012-1-5"), jan5);
  EXPECT_EQ(parse_datetime("2012-01-5 13:00"), jan5 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012/1/05"), jan5);
  EXPECT_EQ(parse_datetime("2012-01-05 13:00:00 UTC"), jan5 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012-01-05T13:00:00 gmt"), jan5 + 13 * 3600);
  EXPECT_EQ(parse_datetime("2012-1"), std::nullopt) << "a month takes two digits";
  for (const char* s :
       {"Jan 5, 2012", "January 05 2012", "jan 5 2012", "JAN. 5, 2012", "5 Jan 2012", "05-Jan-2012",
        "5/jan/2012", "5 January, 2012", " 05 jan 2012 "})
    EXPECT_EQ(parse_date(s, DateLayout::named_month), jan5) << "'" << s << "'";
  EXPECT_EQ(parse_date("Sept 30, 2012", DateLayout::named_month), 1348963200);
  EXPECT_EQ(parse_date("May. 1, 2012", DateLayout::named_month), parse_datetime("2012-05-01"));
  EXPECT_EQ(parse_date("Sep. 30, 2012 1:45 PM", DateLayout::named_month),
            1348963200 + 13 * 3600 + 45 * 60);
  EXPECT_EQ(parse_date("30-Sep-2012 13:45", DateLayout::named_month),
            1348963200 + 13 * 3600 + 45 * 60);
  for (const char* s :
       {"Jan 5, 12", "05-Jan-12", "Janu 5 2012", "Ja 5 2012", "Feb 30, 2012", "5 Jan-2012",
        "5-Jan 2012", "Jan5, 2012", "Jan 5,2012", "Jan 5, 2012x", "May", "5 May", "2012-01-05",
        "01/05/2012", "Septe 5 2012", "Jan. 5 2012 25:00"})
    EXPECT_EQ(parse_date(s, DateLayout::named_month), std::nullopt) << "'" << s << "'";
}

TEST(ParseDatetime, UtcOffsets) {
  int64_t offset = 1;
  EXPECT_EQ(parse_date("2012-01-01T13:00:00+01:00", DateLayout::iso, &offset),
            1325376000 + 12 * 3600);
  EXPECT_EQ(offset, 3600);
  EXPECT_EQ(parse_date("31/12/2020 23:30 -05:30", DateLayout::day_first, &offset), std::nullopt);
  EXPECT_EQ(parse_date("31/12/2020 23:30-05:30", DateLayout::day_first, &offset),
            1609457400 + 5 * 3600 + 1800);
  EXPECT_EQ(offset, -(5 * 3600 + 1800));
  EXPECT_EQ(parse_date("2012-01-01T13:00:00Z", DateLayout::iso, &offset), 1325376000 + 13 * 3600);
  EXPECT_EQ(offset, 0);
  EXPECT_EQ(parse_datetime("2012-01-01T13:00:00+01:00"), 1325376000 + 12 * 3600);
  EXPECT_EQ(parse_datetime("2012-01-01T13:00-0530"), 1325376000 + 18 * 3600 + 30 * 60);
  EXPECT_EQ(parse_datetime("2012-01-01T00:30+01:00"), 1325376000 - 1800);
  EXPECT_EQ(parse_datetime("2012-01-01 13:00:00+01"), 1325376000 + 12 * 3600);  // PostgreSQL's
  EXPECT_EQ(parse_datetime("2012-01-01 13:00:00-05"), 1325376000 + 18 * 3600);
}

TEST(ParseDatetime, RejectsEverythingElse) {
  for (const char* s : {"",
                        " ",
                        "2012",
                        "2012-1",
                        "2012/01",
                        "2012-13",
                        "12-01-01",
                        "2012/01-01",
                        "2012-01/01",
                        "2012-01 13:00",
                        "20120101",
                        "2013-02-29",
                        "1900-02-29",
                        "2012-00-10",
                        "2012-13-01",
                        "2012-04-31",
                        "2012-01-00",
                        "2012-01-32",
                        "2012-01-01T",
                        "2012-01-01T13",
                        "2012-01-01T13:",
                        "2012-01-01T1:00",
                        "2012-01-01T24:00",
                        "2012-01-01T23:60",
                        "2012-01-01T23:59:60",
                        "2012-01-01T13:00:0",
                        "2012-01-01T13:00:00.",
                        "2012-01-01T13:00:00Zjunk",
                        "2012-01-01 13:00 UTC junk",
                        "2012-01-01 UTC",
                        "2012-01-1 13:00 CET",
                        "2012-001-01",
                        "2012-01-01Z",
                        "2012-01-01x",
                        "2012-01-01T13:00+1",
                        "2012-01-01T13:00+01:60",
                        "2012-01-01T13:00+24:00",
                        "2012-01-01T13:00+01:00:00",
                        "2012-01-01T13:00+01:",
                        "2012-01-01T13:00+013",
                        "+2012-01-01",
                        "-2012-01-01",
                        "２０１２-01-01",
                        "abc",
                        "1.5",
                        "2012-01-01\n13:00"}) {
    EXPECT_EQ(parse_datetime(s), std::nullopt) << "'" << s << "'";
  }
}

}  // namespace
}  // namespace seqforge::io::csv_test
