// Series datasets: several series in one file, duplicate dates and gaps, transforms and their
// inverses, and the windows of inference (every window of a file, targets optional).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numbers>
#include <set>

#include "data/calendar.hpp"
#include "data/data_file.hpp"
#include "io/file_util.hpp"
#include "seqforge/data/datasets.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/dates.hpp"
#include "seqforge/io/npy.hpp"
#include "seqforge/train/data_options.hpp"
#include "test_util.hpp"

namespace seqforge::series_test {
namespace {

namespace fs = std::filesystem;
using test::error_of;

std::string write(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path.string();
}

// Two daily series, "a" and "b", their rows interleaved and out of order; a's values are
// 1000 + day, b's 2000 + day, so a row's value tells its series and day.
std::string two_series_csv(const fs::path& dir, int days_a, int days_b) {
  std::string text = "date,city,value\n";
  for (int day = std::max(days_a, days_b) - 1; day >= 0; --day) {
    const std::string date = io::format_datetime(int64_t{1577836800} + day * int64_t{86400});
    if (day < days_b) text += date + ",b," + std::to_string(2000 + day) + "\n";
    if (day < days_a) text += date + ",a," + std::to_string(1000 + day) + "\n";
  }
  return write(dir / "two.csv", text);
}

// A file of one series, "date,value", its k-th row the given date and value k.
std::string dated_csv(const fs::path& path, const std::vector<std::string>& dates) {
  std::string text = "date,value\n";
  for (size_t k = 0; k < dates.size(); ++k) text += dates[k] + "," + std::to_string(k) + "\n";
  return write(path, text);
}

Config series_config(const std::string& path, const std::vector<std::string>& overrides = {}) {
  return Config::parse("data: {path: " + path +
                           ", date_column: date, series_column: city, features: [value], "
                           "targets: [value], lookback: 4, split: {train: 0.5, val: 0.25}, "
                           "normalize: none}\n",
                       "s.yaml", overrides);
}

double raw(const SeriesData& d, int64_t row) { return d.source.at(row, d.feature_cols[0]); }

TEST(Series, WindowsNeverCrossSeriesAndEverySeriesIsSplit) {
  const fs::path dir = test::temp_dir("two");
  const SeriesData d = load_series(series_config(two_series_csv(dir, 40, 24)));
  ASSERT_EQ(d.series.size(), 2u);
  EXPECT_EQ(d.series[0].name, "a");
  EXPECT_EQ(d.series[1].name, "b");
  EXPECT_EQ(d.series[0].end - d.series[0].begin, 40);
  EXPECT_EQ(d.series[0].step, 86400);
  EXPECT_TRUE(d.series[0].regular);
  std::map<std::string, std::set<int>> days;  // per split: "a"/"b" windows
  for (const auto& [name, starts] :
       {std::pair{"train", &d.split.train}, {"val", &d.split.val}, {"test", &d.split.test}}) {
    EXPECT_FALSE(starts->empty()) << name;
    for (int64_t s : *starts) {
      // Every row of the window and its target: one series, consecutive days.
      const double first = raw(d, s);
      for (int64_t r = s; r <= d.target_row(s); ++r) EXPECT_EQ(raw(d, r), first + (r - s)) << s;
      EXPECT_EQ(std::floor(first / 1000), std::floor(raw(d, d.target_row(s)) / 1000));
    }
  }
  // Each series is cut at its own fractions: a's training part is its first 20 days, b's its
  // first 12; every training target lies inside them, every validation target after.
  for (int64_t s : d.split.train) {
    const double target = raw(d, d.target_row(s));
    EXPECT_LT(target < 2000 ? target - 1000 : target - 2000, target < 2000 ? 20 : 12);
  }
  bool a_val = false, b_val = false;
  for (int64_t s : d.split.val) {
    const double v = raw(d, d.target_row(s));
    (v < 2000 ? a_val : b_val) = true;
    EXPECT_GE(v < 2000 ? v - 1000 : v - 2000, v < 2000 ? 20 : 12);
  }
  EXPECT_TRUE(a_val && b_val);
}

// A series shorter than one window gives none: a note names it and its rows, in training (time
// and random splits) and in inference; the other series' windows are unchanged.
// A column of dates that no data.date_column names orders nothing: said, and when its dates run
// newest first, said so, since the split then validates and tests on the oldest rows.
TEST(Series, AnUnnamedDateColumnIsSaidToOrderNothing) {
  const fs::path dir = test::temp_dir("unnamed_dates");
  std::vector<std::string> dates;
  for (int day = 20; day >= 1; --day)
    dates.push_back("2020-01-" + std::string(day < 10 ? "0" : "") + std::to_string(day));
  const std::string path = dated_csv(dir / "newest_first.csv", dates);
  auto notes = [&](const std::string& file) {
    return load_series(Config::parse("data: {path: " + file +
                                         ", features: [value], targets: [value], lookback: 4}\n",
                                     "u.yaml"))
        .notes;
  };
  const std::string said =
      path +
      ": column 'date' holds dates, but no data.date_column names it: the rows "
      "are taken in the file's order";
  const std::vector<std::string> newest = notes(path);
  EXPECT_NE(
      std::find(newest.begin(), newest.end(),
                said + ", which runs newest first (2020-01-20 to 2020-01-01): validation and "
                       "test take the oldest rows (data.date_column: date orders them by it)"),
      newest.end());
  std::reverse(dates.begin(), dates.end());
  const std::string oldest_first = dated_csv(dir / "oldest_first.csv", dates);
  const std::vector<std::string> oldest = notes(oldest_first);
  EXPECT_NE(std::find(oldest.begin(), oldest.end(),
                      oldest_first +
                          ": column 'date' holds dates, but no data.date_column names it: the rows "
                          "are taken in the file's order (data.date_column: date orders them by "
                          "it)"),
            oldest.end());
}

TEST(Series, ASeriesShorterThanAWindowIsNamed) {
  const fs::path dir = test::temp_dir("short");
  const std::string path = two_series_csv(dir, 40, 4);  // b: 4 rows, a window spans 5
  const std::string note = "1 of 2 series in " + path +
                           " (city) is shorter than one window (5 rows: data.lookback 4 + "
                           "data.horizon 1) and gives none: 'b' (4 rows)";
  for (const std::string mode : {"time", "random"}) {
    const SeriesData d = load_series(series_config(path, {"data.split.mode=" + mode}));
    ASSERT_EQ(d.series.size(), 2u);
    EXPECT_EQ(d.split.train.size() + d.split.val.size() + d.split.test.size(), 36u) << mode;
    EXPECT_NE(std::find(d.notes.begin(), d.notes.end(), note), d.notes.end()) << mode;
  }
  const SeriesData every = load_series(series_config(path), nullptr, WindowSet::with_targets);
  EXPECT_EQ(every.split.test.size(), 36u);
  EXPECT_NE(std::find(every.notes.begin(), every.notes.end(), note), every.notes.end());
  const SeriesData long_enough = load_series(series_config(two_series_csv(dir, 40, 5)));
  for (const std::string& n : long_enough.notes)
    EXPECT_EQ(n.find("shorter than one window"), std::string::npos) << n;
}

// data.split.context on 100 daily rows, lookback 10, horizon 1, train 0.7, val 0.2: training
// targets are rows 10..69; with history, validation scores every target in rows 70..89 (windows
// from row 60) and test every one in 90..99; strict keeps whole windows inside each part (10
// validation windows, no test window). Series are never crossed, and mae stays strict.
TEST(Series, ValidationAndTestWindowsTakeTheirLookbackFromTheRowsBefore) {
  const fs::path dir = test::temp_dir("context");
  const std::string one = two_series_csv(dir, 100, 0);
  auto load = [&](std::vector<std::string> overrides) {
    for (const char* o : {"data.lookback=10", "data.split.train=0.7", "data.split.val=0.2"})
      overrides.push_back(o);
    return load_series(series_config(one, overrides));
  };
  auto day = [&](const SeriesData& d, int64_t row) { return int64_t(raw(d, row)) - 1000; };
  const SeriesData history = load({});
  ASSERT_EQ(history.split.train.size(), 60u);
  EXPECT_EQ(day(history, history.target_row(history.split.train.back())), 69);
  ASSERT_EQ(history.split.val.size(), 20u);
  EXPECT_EQ(day(history, history.split.val.front()), 60);
  EXPECT_EQ(day(history, history.target_row(history.split.val.front())), 70);
  EXPECT_EQ(day(history, history.target_row(history.split.val.back())), 89);
  ASSERT_EQ(history.split.test.size(), 10u);
  EXPECT_EQ(day(history, history.target_row(history.split.test.front())), 90);
  EXPECT_EQ(day(history, history.target_row(history.split.test.back())), 99);

  const SeriesData strict = load({"data.split.context=strict"});
  EXPECT_EQ(strict.split.train, history.split.train);
  ASSERT_EQ(strict.split.val.size(), 10u);
  EXPECT_EQ(day(strict, strict.split.val.front()), 70);
  EXPECT_TRUE(strict.split.test.empty());

  // Two series: b's windows start no earlier than b's first row, however long the lookback.
  const SeriesData two = load_series(
      series_config(two_series_csv(dir, 100, 20),
                    {"data.lookback=8", "data.split.train=0.5", "data.split.val=0.25"}));
  for (int64_t s : two.split.val) {
    const auto first = int64_t(raw(two, s)), target = int64_t(raw(two, two.target_row(s)));
    EXPECT_EQ(first / 1000, target / 1000) << "a window crosses series";
    EXPECT_GE(target % 1000, first / 1000 == 1 ? 50 : 10);
  }
  int64_t b_val = 0;
  for (int64_t s : two.split.val) b_val += raw(two, s) >= 2000;
  EXPECT_EQ(b_val, 5) << "b's validation rows 10..14, each with 8 rows of b before it";

  const SeriesData mae = load({"data.task=mae", "data.targets=[]"});
  for (int64_t s : mae.split.val) EXPECT_GE(day(mae, s), 70) << "mae's targets are its window";
  EXPECT_EQ(error_of([&] { load({"data.split.context=all"}); }),
            "override 'data.split.context=all': data.split.context must be history or strict, "
            "got 'all'");
}

// A classifier of whole series (each series one example, its class on every row): the error for
// a window too long for them says to take the class at the window's last row.
TEST(Series, WholeSeriesExamplesAreToldToUseHorizonZero) {
  const fs::path dir = test::temp_dir("whole_series");
  std::string text = "digit,row,pixels,label\n";
  for (int k = 0; k < 12; ++k)
    for (int r = 0; r < 6; ++r)
      text += "d" + std::to_string(k) + "," + std::to_string(r) + "," +
              std::to_string((k * 7 + r) % 5) + "," + (k % 2 ? "odd" : "even") + "\n";
  const std::string path = write(dir / "digits.csv", text);
  auto config = [&](const std::string& extra) {
    return Config::parse("data: {path: " + path +
                             ", series_column: digit, features: [pixels], task: classify, "
                             "class_column: label, lookback: 6" +
                             extra + "}\n",
                         "d.yaml");
  };
  const std::string e = error_of([&] { load_series(config(", split: {mode: random}")); });
  EXPECT_NE(e.find("; when each series is one example, set data.horizon: 0 (the class at its "
                   "window's last row)"),
            std::string::npos)
      << e;
  EXPECT_EQ(e.find("data.split.mode: random"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { load_series(config("")); }).find(" and data.split.mode: random"),
            std::string::npos);
  const SeriesData d = load_series(config(", horizon: 0, split: {mode: random}"));
  EXPECT_EQ(d.split.train.size() + d.split.val.size() + d.split.test.size(), 12u);
}

// Integer classes are numbered by value (class k is output k, as a label encoder numbers an
// integer column), other names by bytes; a saved model's own order is kept.
TEST(Series, NumberedClassesAreOrderedByValue) {
  EXPECT_EQ(io::ordered_class_names({"10", "2", "1", "2", "0"}),
            (std::vector<std::string>{"0", "1", "2", "10"}));
  EXPECT_EQ(io::ordered_class_names({"1.0", "-3", "+2", "1e1", "1", "0.5"}),
            (std::vector<std::string>{"-3", "0.5", "1", "1.0", "+2", "1e1"}));
  EXPECT_EQ(io::ordered_class_names({"10", "2", "b", "a"}),
            (std::vector<std::string>{"10", "2", "a", "b"}));
  EXPECT_EQ(io::ordered_class_names({"10", "2", ""}), (std::vector<std::string>{"", "10", "2"}));
  EXPECT_EQ(io::ordered_class_names({"inf", "2"}), (std::vector<std::string>{"2", "inf"}));
  const fs::path dir = test::temp_dir("numbered_classes");
  std::string text = "digit,row,pixels,label\n";
  for (int k = 0; k < 24; ++k)
    for (int r = 0; r < 3; ++r)
      text += "d" + std::to_string(k) + "," + std::to_string(r) + "," + std::to_string(k) + "," +
              std::to_string(k % 12) + "\n";
  const SeriesData d = load_series(Config::parse(
      "data: {path: " + write(dir / "digits.csv", text) +
          ", series_column: digit, features: [pixels], task: classify, class_column: label, "
          "lookback: 3, horizon: 0, split: {train: 1.0, val: 0.0}}\n",
      "d.yaml"));
  ASSERT_EQ(d.class_names.size(), 12u);
  for (size_t k = 0; k < 12; ++k) EXPECT_EQ(d.class_names[k], std::to_string(k));
  for (int64_t s : d.split.train)
    EXPECT_EQ(d.classes[d.target_row(s)], static_cast<int64_t>(raw(d, d.target_row(s))) % 12);
}

// Two interleaved daily series with empty cells.
// a: days 0..5 = 10, _, _, 40, 50, _   b: days 0..5 = _, 200, 300, _, 500, 600
constexpr const char* kGappyCsv =
    "date,city,value\n"
    "2020-01-01,a,10\n2020-01-01,b,\n2020-01-02,a,\n"
    "2020-01-02,b,200\n2020-01-03,a,\n2020-01-03,b,300\n"
    "2020-01-04,a,40\n2020-01-04,b,\n2020-01-05,a,50\n"
    "2020-01-05,b,500\n2020-01-06,a,\n2020-01-06,b,600\n";

// data.missing: empty cells filled within each series in date order (never from the other
// series), counted in a note; the default is an error naming the file, line and column.
TEST(Series, EmptyCellsAreFilledWithinTheirSeries) {
  const fs::path dir = test::temp_dir("missing");
  const std::string path = write(dir / "m.csv", kGappyCsv);
  auto values = [&](const std::string& how) {
    const SeriesData d =
        load_series(series_config(path, {"data.missing=" + how, "data.lookback=2",
                                         "data.split.train=1", "data.split.val=0"}));
    std::vector<double> out;
    for (int64_t r = 0; r < d.rows; ++r) out.push_back(raw(d, r));
    return std::pair{out, d.notes};
  };
  const auto [interpolated, notes] = values("interpolate");
  EXPECT_EQ(interpolated,
            (std::vector<double>{10, 20, 30, 40, 50, 50, 200, 200, 300, 400, 500, 600}));
  EXPECT_NE(std::find(notes.begin(), notes.end(),
                      "data.missing interpolate: 5 missing cells of 'value' filled"),
            notes.end());
  EXPECT_EQ(error_of([&] { values("ffill"); }),
            path +
                ":3: column 'value': a missing cell with no value before it in its series, "
                "which data.missing ffill needs (data.missing: interpolate takes the nearest "
                "value)");
  EXPECT_EQ(error_of([&] { load_series(series_config(path, {"data.lookback=2"})); }),
            path +
                ":3: column 'value': empty cell is not a number (data.missing: ffill or "
                "interpolate fills missing cells, mask masks them)");
  const std::string later = write(dir / "m2.csv",
                                  "date,city,value\n2020-01-01,a,1\n2020-01-02,a,\n"
                                  "2020-01-03,a,\n2020-01-04,a,4\n");
  const SeriesData f = load_series(series_config(
      later, {"data.missing=ffill", "data.lookback=2", "data.split.train=1", "data.split.val=0"}));
  EXPECT_EQ(std::vector<double>({raw(f, 0), raw(f, 1), raw(f, 2), raw(f, 3)}),
            (std::vector<double>{1, 1, 1, 4}));
}

// data.missing_values: a code (-99.99, in a file whose other values lie near 300) is a missing
// cell like an empty or NA one: filled, or an error naming it. Left a value, it gets a note
// naming it and where it first is. In a .npy array a code matches by value.
TEST(Series, MissingCodesAreMissingCellsAndANinesCodeGetsANote) {
  const fs::path dir = test::temp_dir("codes");
  const std::string path = write(dir / "c.csv",
                                 "date,city,value\n2020-01-01,a,300\n2020-01-02,a,-99.99\n"
                                 "2020-01-03,a,NA\n2020-01-04,a,330\n2020-01-05,a,340\n"
                                 "2020-01-06,a,-99.990\n2020-01-07,a,360\n");
  auto load = [&](std::vector<std::string> overrides) {
    for (const char* o : {"data.lookback=2", "data.split.train=1", "data.split.val=0"})
      overrides.push_back(o);
    return load_series(series_config(path, overrides));
  };
  auto values = [](const SeriesData& d) {
    std::vector<double> out;
    for (int64_t r = 0; r < d.rows; ++r) out.push_back(raw(d, r));
    return out;
  };
  auto has_note = [](const SeriesData& d, const std::string& part) {
    return std::any_of(d.notes.begin(), d.notes.end(),
                       [&](const std::string& n) { return n.find(part) != std::string::npos; });
  };
  const SeriesData filled = load({"data.missing=interpolate", "data.missing_values=[-99.99]"});
  EXPECT_EQ(values(filled), (std::vector<double>{300, 310, 320, 330, 340, 350, 360}));
  EXPECT_TRUE(has_note(filled, "data.missing interpolate: 3 missing cells of 'value' filled"));
  EXPECT_FALSE(has_note(filled, "a code for a missing value"));

  const SeriesData kept = load({"data.missing=interpolate"});
  const std::vector<double> v = values(kept);
  EXPECT_EQ(v[1], -99.99);
  EXPECT_EQ(v[5], -99.99);
  EXPECT_NEAR(v[2], (-99.99 + 330) / 2, 1e-9);
  EXPECT_TRUE(has_note(kept, "column 'value': 2 cells hold -99.99 (the first at " + path +
                                 ":3), far outside its other values (300 to 360): a code for a "
                                 "missing value? data.missing_values: [-99.99] (eval and "
                                 "predict: --missing-values -99.99) makes such cells missing"));
  EXPECT_EQ(error_of([&] { load({"data.missing_values=[-99.99]"}); }),
            path +
                ":3: column 'value': '-99.99' marks a missing value, not a number (data.missing: "
                "ffill or interpolate fills missing cells, mask masks them)");

  const std::string npy = (dir / "c.npy").string();
  const std::vector<double> array = {300, -99.99, NAN, 330, 340, -99.99, 360};
  io::write_npy(npy, DType::f64, {7, 1}, array.data());
  const std::string yaml = "data: {path: " + npy +
                           ", features: ['0'], targets: ['0'], lookback: 2, split: {train: 1, "
                           "val: 0}, normalize: none, missing: interpolate}\n";
  const SeriesData from_npy =
      load_series(Config::parse(yaml, "n.yaml", {"data.missing_values=[-99.99]"}));
  EXPECT_EQ(values(from_npy), (std::vector<double>{300, 310, 320, 330, 340, 350, 360}));
  EXPECT_EQ(
      error_of([&] { load_series(Config::parse(yaml, "n.yaml", {"data.missing_values=[n.a.]"})); }),
      npy + ": data.missing_values: 'n.a.' is no number, and a .npy array holds only numbers");
  // numpy's float16 reads as its values; a 3-D array (windows cut already) says what to save.
  const std::string half = (dir / "half.npy").string();
  std::vector<uint16_t> halves;
  for (float v : {300.0f, 310.5f, -2.25f, 330.0f, 340.0f, 65504.0f, 360.0f})
    halves.push_back(to_f16(v));
  io::write_npy(half, DType::f16, {7, 1}, halves.data());
  EXPECT_EQ(values(load_series(Config::parse(yaml, "n.yaml", {"data.path=" + half}))),
            (std::vector<double>{300, 310.5, -2.25, 330, 340, 65504, 360}));
  std::vector<int64_t> columns;  // held as float32, which holds a half exactly, not float64
  EXPECT_EQ(DataFile(half, {}).array({"0"}, &columns).dtype, DType::f32);
  const std::string cube = (dir / "cube.npy").string();
  const std::vector<float> windows(2 * 3 * 1, 1.0f);
  io::write_npy(cube, DType::f32, {2, 3, 1}, windows.data());
  EXPECT_EQ(error_of([&] { load_series(Config::parse(yaml, "n.yaml", {"data.path=" + cube})); }),
            cube +
                ": expected a 2-D array (rows, columns), got 3 dimensions (windows cut "
                "already? save the series itself, a row per time step: seqforge cuts the "
                "windows, data.lookback)");
  const std::string line = (dir / "line.npy").string();
  io::write_npy(line, DType::f32, {6}, windows.data());
  EXPECT_EQ(error_of([&] { load_series(Config::parse(yaml, "n.yaml", {"data.path=" + line})); }),
            line +
                ": expected a 2-D array (rows, columns), got 1 dimension (one series? save it as "
                "a column: a.reshape(-1, 1))");
}

// Series that no data.series_column tells apart, one after another or taking turns row by row,
// are read as one: a note names the column. A category that changes irregularly gets none, and
// nor do the series once the column is named.
TEST(Series, NamesOfSeriesNoColumnTellsApartGetANote) {
  const fs::path dir = test::temp_dir("unnamed_series");
  std::string stacked = "unit,weather,value\n", interleaved = "unit,value\n";
  const char* weather[] = {"sun", "rain", "rain", "fog", "sun", "sun", "snow"};
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < 10; ++i)
      stacked += "u" + std::to_string(k) + "," + weather[(i * 3 + k) % 7] + "," +
                 std::to_string(k * 10 + i) + "\n";
  for (int i = 0; i < 10; ++i)
    for (const char* name : {"AAPL", "MSFT"}) interleaved += std::string(name) + ",1\n";
  auto load = [&](const std::string& path, std::vector<std::string> overrides) {
    for (const char* o : {"data.date_column=", "data.series_column=", "data.lookback=2",
                          "data.split.train=1", "data.split.val=0"})
      overrides.insert(overrides.begin(), o);
    return load_series(series_config(path, overrides));
  };
  const std::string a = write(dir / "stacked.csv", stacked);
  const SeriesData one = load(a, {});
  ASSERT_EQ(one.notes.size(), 1u);
  EXPECT_EQ(one.notes[0], a + ": column 'unit' holds 3 names ('u0', 'u1', 'u2') in blocks one "
                              "after another, but no data.series_column names it: the rows are "
                              "read as one series, windows across the names; if they are "
                              "series, data.series_column: unit");
  EXPECT_TRUE(load(a, {"data.series_column=unit"}).notes.empty());
  const std::string b = write(dir / "interleaved.csv", interleaved);
  const SeriesData turns = load(b, {});
  ASSERT_EQ(turns.notes.size(), 1u);
  EXPECT_NE(turns.notes[0].find("column 'unit' holds 2 names ('AAPL', 'MSFT') taking turns row "
                                "by row"),
            std::string::npos)
      << turns.notes[0];
}

// One mistyped cell (1e30 among values near 300) scales the column so that its other values
// coincide: a note names it and where it is. A spike of the column's own order is no note.
TEST(Series, ALoneCellThatSwampsItsColumnGetsANote) {
  const fs::path dir = test::temp_dir("outlier");
  std::string text = "date,city,value\n";
  for (int day = 1; day <= 28; ++day)
    text += "2020-02-" + std::string(day < 10 ? "0" : "") + std::to_string(day) + ",a," +
            (day == 9    ? "1e30"
             : day == 20 ? "9000"
                         : std::to_string(300 + day)) +
            "\n";
  const std::string path = write(dir / "o.csv", text);
  const std::vector<std::string> zscore = {"data.lookback=2", "data.split.train=1",
                                           "data.split.val=0", "data.normalize=zscore"};
  const SeriesData d = load_series(series_config(path, zscore));
  ASSERT_EQ(d.notes.size(), 1u);
  EXPECT_EQ(d.notes[0], "column 'value': 1e+30 at " + path +
                            ":10 lies so far outside its other values (301 to 9000) that beside "
                            "it they all but coincide: a mistyped cell? "
                            "data.missing_values: [1e+30] makes it missing");
  EXPECT_EQ(raw(d, 8), 1e30);
  // A negative one whose square overflows a double is named as well, not its column's highest.
  std::string negative = "date,city,value,y\n";
  for (int day = 1; day <= 28; ++day)
    negative += "2020-02-" + std::string(day < 10 ? "0" : "") + std::to_string(day) + ",a," +
                (day == 9 ? "-1e200" : std::to_string(300 + day)) + "," + std::to_string(day) +
                "\n";
  const std::string far_below = write(dir / "n.csv", negative);
  std::vector<std::string> to_y = zscore;
  to_y.push_back("data.targets=[y]");
  const SeriesData n = load_series(series_config(far_below, to_y));
  ASSERT_EQ(n.notes.size(), 1u);
  EXPECT_EQ(n.notes[0].substr(0, n.notes[0].find(" lies")),
            "column 'value': -1e+200 at " + far_below + ":10");
  // Learnt as its log, the column is measured on that scale: 1e30 still swamps values from 301 to
  // 328; values over many orders of magnitude do not.
  std::vector<std::string> log = zscore;
  log.push_back("data.transform={value: log}");
  std::string near = "date,city,value\n";
  for (int day = 1; day <= 28; ++day)
    near += "2020-02-" + std::string(day < 10 ? "0" : "") + std::to_string(day) + ",a," +
            (day == 9 ? "1e30" : std::to_string(300 + day)) + "\n";
  const std::string far = write(dir / "l.csv", near);
  const SeriesData l = load_series(series_config(far, log));
  ASSERT_EQ(l.notes.size(), 1u);
  EXPECT_EQ(l.notes[0].substr(0, l.notes[0].find(" that")),
            "column 'value': 1e+30 at " + far +
                ":10 lies so far outside its other values (301 to 328, on the log scale of "
                "data.transform)");
  std::string orders = "date,city,value\n";
  for (int day = 1; day <= 28; ++day)
    orders += "2020-02-" + std::string(day < 10 ? "0" : "") + std::to_string(day) + ",a,1e" +
              std::to_string(day == 9 ? 37 : day * 2 - 30) + "\n";
  const std::string wide = write(dir / "w.csv", orders);
  EXPECT_TRUE(load_series(series_config(wide, log)).notes.empty());
  EXPECT_EQ(load_series(series_config(wide, zscore)).notes.size(), 1u);
  const std::string spike = write(dir / "s.csv", text.replace(text.find("1e30"), 4, "309"));
  EXPECT_TRUE(load_series(series_config(
                              spike, {"data.lookback=2", "data.split.train=1", "data.split.val=0"}))
                  .notes.empty());
}

// data.missing mask on the same cells: a missing input is 0 (here unnormalised) with its
// indicator feature 1, and the windows whose target is missing are left out. Lookback 2, the
// target the next day: a keeps the windows ending days 1 and 2 (targets 40, 50), b those ending
// days 0, 2 and 3 (targets 300, 500, 600).
TEST(Series, MaskedCellsAreZeroInputsBesideAnIndicatorAndNoTarget) {
  const fs::path dir = test::temp_dir("mask");
  const std::string path = write(dir / "m.csv", kGappyCsv);
  const SeriesData d = load_series(series_config(
      path, {"data.missing=mask", "data.lookback=2", "data.split.train=1", "data.split.val=0"}));
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"value", "value_missing"}));
  EXPECT_EQ(d.split.train, (std::vector<int64_t>{1, 2, 6, 8, 9}));
  for (const char* note : {"data.missing mask: 5 missing cells of 'value' masked",
                           "data.missing mask: 3 windows whose target is missing are left out of "
                           "training and evaluation"})
    EXPECT_NE(std::find(d.notes.begin(), d.notes.end(), note), d.notes.end()) << note;
  auto window = [&](int64_t start) {
    std::vector<float> x(4);
    d.copy_window(start, x.data());
    return x;
  };
  EXPECT_EQ(window(1), (std::vector<float>{0, 1, 0, 1}));
  EXPECT_EQ(window(2), (std::vector<float>{0, 1, 40, 0}));
  EXPECT_EQ(window(6), (std::vector<float>{0, 1, 200, 0}));
  float y = 0;
  d.copy_target(6, &y);
  EXPECT_EQ(y, 300);
}

// data.static: a category per series fed as one-hot features (normalize none here, then a
// scaler per series), from the training file's categories; a value that changes within a series, or
// (predicting) a category the model does not know, is named.
TEST(Series, StaticCategoriesAreOneHotFeaturesPerSeries) {
  const fs::path dir = test::temp_dir("static");
  std::string text = "date,city,kind,value\n";
  for (int day = 0; day < 20; ++day)  // line 2 + 3 * day + (0, 1, 2) for a, b, c
    for (const char* city : {"a", "b", "c"})
      text += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + "," + city + "," +
              (std::string(city) == "b" ? "coastal" : "inland") + "," + std::to_string(day) + "\n";
  const std::string path = write(dir / "s.csv", text);
  const SeriesData d = load_series(series_config(path, {"data.static=[kind]"}));
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"value", "kind=coastal", "kind=inland"}));
  ASSERT_EQ(d.static_categories.size(), 1u);
  for (int64_t s : d.split.train) {
    std::vector<float> x(4 * 3);
    d.copy_window(s, x.data());
    const bool coastal = d.series_of(s).name == "b";
    for (int t = 0; t < 4; ++t) {
      EXPECT_EQ(x[t * 3 + 1], coastal ? 1.0f : 0.0f) << s;
      EXPECT_EQ(x[t * 3 + 2], coastal ? 0.0f : 1.0f) << s;
    }
  }
  // With a scaler per series, the one-hot columns keep the pooled one: a series' own would
  // shift its constant category to 0, the same input in every series.
  const SeriesData per = load_series(series_config(
      path, {"data.static=[kind]", "data.normalize=zscore", "data.normalize_per=series"}));
  ASSERT_EQ(per.feature_norm.series.size(), 3u);
  for (size_t k = 0; k < 3; ++k)
    for (size_t j : {1, 2}) {
      EXPECT_EQ(per.feature_norm.series_shift[k][j], per.feature_norm.shift[j]);
      EXPECT_EQ(per.feature_norm.series_scale[k][j], per.feature_norm.scale[j]);
    }
  EXPECT_NE(per.feature_norm.series_shift[0][0], per.feature_norm.shift[0]) << "value's own";
  std::vector<float> coastal(12), inland(12);
  for (int64_t s : per.split.train)
    per.copy_window(s, (per.series_of(s).name == "b" ? coastal : inland).data());
  EXPECT_NE(coastal[1], inland[1]);
  EXPECT_NE(coastal[1], 0.0f);
  std::string changed = text;
  changed.replace(changed.rfind("coastal"), 7, "inland");
  const std::string bad = write(dir / "changed.csv", changed);
  EXPECT_EQ(error_of([&] { load_series(series_config(bad, {"data.static=[kind]"})); }),
            bad + ":60: column 'kind' (data.static) is 'inland' where " + bad +
                ":3 of the same series has 'coastal': a static column holds one value per series");
  std::string other = text;
  other.replace(other.rfind("coastal"), 7, "alpine");
  for (size_t at = other.find("coastal"); at != std::string::npos; at = other.find("coastal"))
    other.replace(at, 7, "alpine");
  const std::string unseen = write(dir / "unseen.csv", other);
  EXPECT_EQ(error_of([&] {
              load_series(series_config(unseen, {"data.static=[kind]"}), &d,
                          WindowSet::every_window);
            }),
            unseen +
                ": series 'b' has kind 'alpine', which the model was not trained on "
                "(data.static)");
}

// data.categorical: a one-hot feature per category of the training file, row by row; an empty
// cell, and at inference a category the model was not trained on, all 0.
TEST(Series, CategoricalColumnsAreOneHotFeaturesRowByRow) {
  const fs::path dir = test::temp_dir("categorical");
  const char* weather[] = {"sun", "rain", "", "fog"};
  std::string text = "date,city,weather,value\n";
  for (int day = 0; day < 20; ++day)
    text += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + ",a," +
            weather[day % 4] + "," + std::to_string(day) + "\n";
  const std::string path = write(dir / "c.csv", text);
  const SeriesData d = load_series(series_config(path, {"data.categorical=[weather]"}));
  EXPECT_EQ(d.feature_names,
            (std::vector<std::string>{"value", "weather=fog", "weather=rain", "weather=sun"}));
  auto one_hot = [](const SeriesData& s, int64_t row) {
    std::vector<double> v;
    for (size_t j = 1; j < s.feature_cols.size(); ++j)
      v.push_back(s.source.at(row, s.feature_cols[j]));
    return v;
  };
  for (int64_t r = 0; r < d.rows; ++r) {
    const int day = static_cast<int>(raw(d, r));
    const std::string w = weather[day % 4];
    const auto is = [&](const char* name) { return w == name ? 1.0 : 0.0; };
    EXPECT_EQ(one_hot(d, r), (std::vector<double>{is("fog"), is("rain"), is("sun")})) << day;
  }
  EXPECT_TRUE(d.notes.empty()) << d.notes[0];
  // A category only in the rows after the training windows' would train nothing: the model
  // leaves it out, as a category new at inference, and says so.
  std::string late = text;
  late.replace(late.rfind(",sun,"), 5, ",snow,");
  const SeriesData l =
      load_series(series_config(write(dir / "late.csv", late), {"data.categorical=[weather]"}));
  ASSERT_EQ(l.notes.size(), 1u);
  EXPECT_EQ(l.notes[0],
            "data.categorical: column 'weather' holds 'snow' in no row a training window reads: "
            "the model leaves it out of its categories, and the rows that hold it have all their "
            "one-hot features 0, as a category new to the model has (merge it into another "
            "category, or make its cells missing)");
  EXPECT_EQ(l.feature_names, d.feature_names);
  EXPECT_EQ(l.categories, d.categories);
  // One category typed two ways (a no-break space after it): two categories, said.
  std::string typed = text;
  typed.replace(typed.find(",rain,"), 6, ",Rain\u00a0,");
  const SeriesData t =
      load_series(series_config(write(dir / "typed.csv", typed), {"data.categorical=[weather]"}));
  EXPECT_EQ(t.feature_names.size(), d.feature_names.size() + 1);
  ASSERT_FALSE(t.notes.empty());
  EXPECT_EQ(t.notes[0], dir.string() +
                            "/typed.csv: categories 'Rain\\u00a0' and 'rain' in column 'weather' "
                            "(data.categorical) differ only in case, spaces or how a number is "
                            "written: each is a category of its own");
  for (int64_t r = 0; r < l.rows; ++r)
    if (raw(l, r) == 16) {  // the snowy day
      EXPECT_EQ(one_hot(l, r), (std::vector<double>{0, 0, 0}));
    }
  // A column whose every category is left out adds no feature, and reads back at inference.
  std::string alarm = "date,city,weather,alarm,value\n";
  for (int day = 0; day < 20; ++day)
    alarm += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + ",a," +
             weather[day % 4] + "," + (day == 18 ? "on" : "") + "," + std::to_string(day) + "\n";
  const std::string alarm_path = write(dir / "alarm.csv", alarm);
  const SeriesData a =
      load_series(series_config(alarm_path, {"data.categorical=[weather, alarm]"}));
  EXPECT_EQ(a.feature_names, d.feature_names);
  ASSERT_EQ(a.categories.size(), 2u);
  EXPECT_EQ(a.categories[1], (std::pair<std::string, std::vector<std::string>>{"alarm", {}}));
  const SeriesData at_inference =
      load_series(series_config(alarm_path, {"data.categorical=[weather, alarm]"}), &a,
                  WindowSet::every_window);
  EXPECT_EQ(at_inference.feature_names, d.feature_names);
  EXPECT_NE(std::find(at_inference.notes.begin(), at_inference.notes.end(),
                      "1 row has alarm 'on', which the model was not trained on "
                      "(data.categorical): all its one-hot features 0"),
            at_inference.notes.end());
  std::string later = text;
  for (size_t at = later.find(",fog,"); at != std::string::npos; at = later.find(",fog,"))
    later.replace(at, 5, ",hail,");
  const std::string unseen = write(dir / "unseen.csv", later);
  const SeriesData u = load_series(series_config(unseen, {"data.categorical=[weather]"}), &d,
                                   WindowSet::every_window);
  EXPECT_EQ(u.feature_names, d.feature_names);
  for (int64_t r = 0; r < u.rows; ++r)
    if (static_cast<int>(raw(u, r)) % 4 == 3) {
      EXPECT_EQ(one_hot(u, r), (std::vector<double>{0, 0, 0}));
    }
  EXPECT_NE(std::find(u.notes.begin(), u.notes.end(),
                      "5 rows have weather 'hail', which the model was not trained on "
                      "(data.categorical): all its one-hot features 0"),
            u.notes.end());
  // The same category written in another case or with spaces is named beside the model's.
  std::string other_case = text;
  for (size_t at = other_case.find(",sun,"); at != std::string::npos; at = other_case.find(",sun,"))
    other_case.replace(at, 5, ", Sun,");
  const SeriesData c = load_series(
      series_config(write(dir / "case.csv", other_case), {"data.categorical=[weather]"}), &d,
      WindowSet::every_window);
  EXPECT_NE(std::find(c.notes.begin(), c.notes.end(),
                      "5 rows have weather ' Sun', which the model was not trained on "
                      "(data.categorical) (the model knows 'sun'): all its one-hot features 0"),
            c.notes.end());
  EXPECT_EQ(
      error_of([&] { load_series(series_config(path, {"data.categorical=[weather, value]"})); }),
      "override 'data.categorical=[weather, value]': data.categorical: 'value' is also a "
      "feature, a target or a static column "
      "(data.features, data.targets, data.static): a column is one of them");
  std::string many = "date,city,id,value\n";
  for (int day = 0; day < 300; ++day)
    many += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + ",a,id" +
            std::to_string(day) + "," + std::to_string(day) + "\n";
  const std::string ids = write(dir / "ids.csv", many);
  EXPECT_EQ(error_of([&] { load_series(series_config(ids, {"data.categorical=[id]"})); }),
            ids +
                ": column 'id' (data.categorical) holds 300 categories, more than the 256 that "
                "one-hot features take (an identifier, or free text?)");
}

// data.known_future with two steps ahead: each step of a window also holds the known column at
// the two rows after it (value = day, promo = 10 * day, normalize none).
TEST(Series, KnownFutureValuesAreThoseOfTheRowsForecast) {
  const fs::path dir = test::temp_dir("known_future");
  std::string text = "date,city,value,promo\n";
  for (int day = 0; day < 30; ++day)
    text += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + ",a," +
            std::to_string(day) + "," + std::to_string(10 * day) + "\n";
  const std::string path = write(dir / "k.csv", text);
  const SeriesData d = load_series(
      series_config(path, {"data.known_future=[promo]", "data.lookback=3", "data.horizon=2"}));
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"value", "promo+1", "promo+2"}));
  ASSERT_FALSE(d.split.val.empty());
  for (int64_t s : d.split.train) {
    std::vector<float> x(3 * 3);
    d.copy_window(s, x.data());
    for (int64_t t = 0; t < 3; ++t) {
      EXPECT_EQ(x[t * 3], float(s + t));
      EXPECT_EQ(x[t * 3 + 1], float(10 * (s + t + 1)));
      EXPECT_EQ(x[t * 3 + 2], float(10 * (s + t + 2)));
    }
  }
  EXPECT_NE(error_of([&] {
              load_series(series_config(path, {"data.known_future=[value]"}));
            }).find("data.known_future: 'value' is a target"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_series(series_config(path, {"data.known_future=[dayofweek]"})); })
                .find("data.known_future: 'dayofweek' is a calendar feature only when "
                      "data.calendar lists it too (data.calendar: [dayofweek])"),
            std::string::npos);
  // A calendar feature among them comes from the dates of the rows forecast, past the file's
  // end too (the dates are regular: a day apart).
  const SeriesData c = load_series(
      series_config(path, {"data.calendar=[dayofweek]", "data.known_future=[dayofweek]",
                           "data.lookback=3", "data.horizon=2", "data.features=[promo]"}));
  EXPECT_EQ(c.feature_names,
            (std::vector<std::string>{"promo", "dayofweek_sin", "dayofweek_cos", "dayofweek_sin+1",
                                      "dayofweek_cos+1", "dayofweek_sin+2", "dayofweek_cos+2"}));
  const int64_t last = c.rows - 1;
  EXPECT_EQ(*c.time_ahead(last, 3), c.times[last] + 3 * 86400);
  std::vector<float> x(3 * 7);
  c.copy_window(c.split.train.back(), x.data());
  const int64_t row = c.split.train.back() + 2;  // the window's last step
  for (int a = 1; a <= 2; ++a) {
    const auto [sin, cos] = calendar_features("dayofweek", c.times[row + a]);
    EXPECT_NEAR(x[2 * 7 + 1 + 2 * a], sin, 1e-6);
    EXPECT_NEAR(x[2 * 7 + 2 + 2 * a], cos, 1e-6);
  }
}

// data.normalize_per series: each series scaled by its own training rows (a's values are
// 1000 + day, b's 2000 + day), predictions scaled back by their own series' scaler, the scalers
// kept per name through JSON; a series without one is an error or (fallback pooled) a note.
TEST(Series, EachSeriesCanHaveItsOwnScaler) {
  const fs::path dir = test::temp_dir("per_series");
  const std::string path = two_series_csv(dir, 40, 40);
  const SeriesData d = load_series(series_config(
      path, {"data.normalize=zscore", "data.normalize_per=series", "data.lookback=4"}));
  ASSERT_EQ(d.feature_norm.series, (std::vector<std::string>{"a", "b"}));
  // Training rows: the first 20 days of each series (train 0.5): mean day 9.5.
  EXPECT_NEAR(d.feature_norm.series_shift[0][0], 1009.5, 1e-9);
  EXPECT_NEAR(d.feature_norm.series_shift[1][0], 2009.5, 1e-9);
  EXPECT_NEAR(d.feature_norm.series_scale[1][0], std::sqrt((20.0 * 20 - 1) / 12), 1e-9);
  EXPECT_NEAR(d.feature_norm.shift[0], 1509.5, 1e-9) << "the pooled scaler stays";
  for (int64_t start : {d.split.val.front(), d.split.val.back()}) {
    const int64_t k = d.scaler_of(start);
    ASSERT_GE(k, 0);
    float window[4];
    d.copy_window(start, window);
    EXPECT_NEAR(
        window[0],
        (raw(d, start) - d.feature_norm.series_shift[k][0]) / d.feature_norm.series_scale[k][0],
        1e-5);
    EXPECT_NEAR(d.prediction(start, 0, 0, 0.0), d.target_norm.series_shift[k][0], 1e-9);
  }
  const Normalizer back = Normalizer::from_json(d.target_norm.to_json(), "t");
  EXPECT_EQ(back.series, d.target_norm.series);
  EXPECT_EQ(back.series_shift, d.target_norm.series_shift);
  // A file whose series "c" has no scaler.
  const std::string other = write(dir / "c.csv",
                                  "date,city,value\n2020-01-01,c,5\n"
                                  "2020-01-02,c,6\n2020-01-03,c,7\n"
                                  "2020-01-04,c,8\n2020-01-05,c,9\n");
  const Config c = series_config(other, {"data.normalize_per=series", "data.lookback=4"});
  EXPECT_EQ(error_of([&] { load_series(c, &d, WindowSet::every_window); }),
            other +
                ": series 'c' was not in the training data, so data.normalize_per series has "
                "no scaler for it; a run trained with data.normalize_fallback: pooled scales it "
                "by all series' training rows");
  const SeriesData pooled =
      load_series(series_config(other, {"data.normalize_per=series", "data.lookback=4",
                                        "data.normalize_fallback=pooled"}),
                  &d, WindowSet::every_window);
  EXPECT_EQ(pooled.scaler_of(0), -1);
  ASSERT_FALSE(pooled.notes.empty());
  EXPECT_NE(pooled.notes.back().find("1 series ('c') without a scaler of their own"),
            std::string::npos)
      << pooled.notes.back();
  // A name that differs from a trained one only in case is pointed at it.
  const std::string upper = write(dir / "upper.csv",
                                  "date,city,value\n2020-01-01,A,5\n"
                                  "2020-01-02,A,6\n2020-01-03,A,7\n"
                                  "2020-01-04,A,8\n2020-01-05,A,9\n");
  EXPECT_EQ(error_of([&] {
              load_series(series_config(upper, {"data.normalize_per=series", "data.lookback=4"}),
                          &d, WindowSet::every_window);
            }),
            upper +
                ": series 'A' was not in the training data (the training data has 'a': names "
                "match as written), so data.normalize_per series has no scaler for it; a run "
                "trained with data.normalize_fallback: pooled scales it by all series' training "
                "rows");
  // So is one with spaces around it.
  const std::string spaced = write(dir / "spaced.csv",
                                   "date,city,value\n2020-01-01,a ,5\n"
                                   "2020-01-02,a ,6\n2020-01-03,a ,7\n"
                                   "2020-01-04,a ,8\n2020-01-05,a ,9\n");
  EXPECT_NE(error_of([&] {
              load_series(series_config(spaced, {"data.normalize_per=series", "data.lookback=4"}),
                          &d, WindowSet::every_window);
            }).find(": series 'a ' was not in the training data (the training data has 'a': "),
            std::string::npos);
  // Two trained names alike: both named.
  std::string numbered = "date,city,value\n";
  for (const char* city : {"007", "7"})
    for (int day = 1; day <= 20; ++day)
      numbered += "2020-01-" + std::string(day < 10 ? "0" : "") + std::to_string(day) + "," + city +
                  "," + std::to_string(day) + "\n";
  const SeriesData numbers = load_series(
      series_config(write(dir / "numbered.csv", numbered), {"data.normalize_per=series"}));
  const std::string seven = write(dir / "seven.csv",
                                  "date,city,value\n2020-01-01,7.0,5\n"
                                  "2020-01-02,7.0,6\n2020-01-03,7.0,7\n"
                                  "2020-01-04,7.0,8\n2020-01-05,7.0,9\n");
  EXPECT_NE(error_of([&] {
              load_series(series_config(seven, {"data.normalize_per=series"}), &numbers,
                          WindowSet::every_window);
            })
                .find(": series '7.0' was not in the training data (the training data has '007' "
                      "and '7': names match as written)"),
            std::string::npos);
}

// A class only validation or test rows hold is named: no training window teaches it.
TEST(Series, AClassWithoutATrainingWindowIsNamed) {
  const fs::path dir = test::temp_dir("late_class");
  std::string text = "date,x,kind\n";
  for (int day = 0; day < 40; ++day)
    text += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + "," +
            std::to_string(day % 5) + "," +
            (day >= 36 ? "late"
             : day % 2 ? "odd"
                       : "even") +
            "\n";
  const std::string path = write(dir / "late.csv", text);
  const auto config = [&](const std::string& mode) {
    return Config::parse("data: {path: " + path +
                             ", task: classify, date_column: date, features: [x], class_column: "
                             "kind, lookback: 4, split: {train: 0.5, val: 0.25, mode: " +
                             mode + "}}\n",
                         "c.yaml");
  };
  const SeriesData d = load_series(config("time"));
  EXPECT_NE(std::find(d.notes.begin(), d.notes.end(),
                      "1 of 3 classes ('late') in no training window, only in validation or test: "
                      "the model cannot learn them (data.split.mode: random deals windows of every "
                      "class to the training split)"),
            d.notes.end());
  for (const std::string& note : load_series(config("random")).notes)
    EXPECT_EQ(note.find("no training window"), std::string::npos) << note;
  // Classes that differ only in case, spaces or how a number is written are said to be two.
  EXPECT_EQ(io::names_alike({"even", "late", "odd"}), "");
  EXPECT_EQ(io::names_alike({"Rain", "rain ", "sun"}), "'Rain' and 'rain '");
  EXPECT_EQ(io::names_alike({"0", "1", "1.0"}), "'1' and '1.0'");
  EXPECT_EQ(io::names_alike({"Rain", "Sun", "rain ", "sun", "RAIN", "fog"}),
            "'Rain', 'rain ' and 'RAIN'; 'Sun' and 'sun'");
  EXPECT_EQ(io::names_alike({"a", "A", "b", "B", "c", "C", "d", "D", "e", "E", "f", "F"}),
            "'a' and 'A'; 'b' and 'B'; 'c' and 'C'; 'd' and 'D'; and 2 more such groups");
  std::string spaced = text;  // 'odd', then 'odd ' in every later row of that class
  for (size_t at = spaced.find(",odd\n"), n = 0; at != std::string::npos;
       at = spaced.find(",odd\n", at + 1))
    if (n++ > 0) spaced.insert(at + 4, " ");
  const SeriesData alike = load_series(Config::parse(
      "data: {path: " + write(dir / "spaced.csv", spaced) +
          ", task: classify, date_column: date, features: [x], class_column: kind, lookback: 4}\n",
      "c.yaml"));
  EXPECT_NE(
      std::find(alike.notes.begin(), alike.notes.end(),
                "classes 'odd' and 'odd ' in column 'kind' differ only in case, spaces or how "
                "a number is written: each trains as a class of its own"),
      alike.notes.end());
  // Training windows of one class teach one answer: said, with or without other classes later.
  for (const char* later : {"even", "late"}) {
    std::string one = "date,x,kind\n";
    for (int day = 0; day < 40; ++day)
      one += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + "," +
             std::to_string(day % 5) + "," + (day >= 36 ? later : "even") + "\n";
    const std::string one_path = write(dir / (std::string(later) + ".csv"), one);
    const SeriesData o = load_series(Config::parse(
        "data: {path: " + one_path +
            ", task: classify, date_column: date, features: [x], class_column: kind, lookback: "
            "4, split: {train: 0.5, val: 0.25, mode: time}}\n",
        "c.yaml"));
    const std::string note =
        std::string(
            "every training window is of one class, 'even': the model learns to answer "
            "it always, whatever its input") +
        (std::string(later) == "late" ? "; 1 of 2 classes ('late') in no training window, only "
                                        "in validation or test: the model cannot learn them "
                                        "(data.split.mode: random deals windows of every class "
                                        "to the training split)"
                                      : "");
    EXPECT_NE(std::find(o.notes.begin(), o.notes.end(), note), o.notes.end()) << later;
  }
  // At eval --data, a class written in another case is named beside the model's.
  std::string upper = text;
  for (size_t at = upper.find(",odd"); at != std::string::npos; at = upper.find(",odd"))
    upper.replace(at, 4, ",ODD");
  const SeriesData u = load_series(
      Config::parse("data: {path: " + write(dir / "upper.csv", upper) +
                        ", task: classify, date_column: date, features: [x], class_column: kind, "
                        "lookback: 4}\n",
                    "c.yaml"),
      &d, WindowSet::with_targets);
  EXPECT_NE(std::find(u.notes.begin(), u.notes.end(),
                      "18 rows have class 'ODD' in column 'kind', which the model was not trained "
                      "on (the model knows 'odd'): no actual class for them"),
            u.notes.end());
  EXPECT_EQ(io::known_otherwise("1", {"0.0", "1.0"}), " (the model knows '1.0')");
  EXPECT_EQ(io::known_otherwise("2", {"0.0", "1.0"}), "");
}

// z-scores as a two-pass mean and variance give them: a column far from zero (a meter's
// counter, a timestamp) keeps its spread, not the noise a sum of squares leaves there, also past
// 2^53 where neighbouring doubles are 2 apart; a column of tiny values (farads) is not taken for
// a constant one; a constant one stays as it is.
TEST(Series, ZscoreIsTheTwoPassMeanAndSpreadOfEveryColumn) {
  std::vector<std::vector<double>> columns(4);
  for (int r = 0; r < 500; ++r) {
    const double wave = std::sin(r * 0.7) + 0.25 * (r % 3);
    columns[0].push_back(1.7e9 + wave);
    columns[1].push_back(1e-15 * (2 + wave));
    columns[3].push_back(0x1p53 + 2 * ((r * 7) % 43));
    columns[2].push_back(4.2);
  }
  Normalizer norm;
  norm.fit_values("zscore", columns.size(), [&](const auto& add) {
    for (size_t r = 0; r < columns[0].size(); ++r)
      for (size_t j = 0; j < columns.size(); ++j) add(j, columns[j][r]);
  });
  for (size_t j : {0, 1, 3}) {
    const double n = static_cast<double>(columns[j].size());
    const double near = columns[j][0];  // exact differences from it
    double mean = 0, var = 0;
    for (double x : columns[j]) mean += (x - near) / n;
    for (double x : columns[j]) var += (x - near - mean) * (x - near - mean) / n;
    EXPECT_NEAR(norm.shift[j], near + mean, 1e-12 * std::fabs(near + mean)) << "column " << j;
    EXPECT_NEAR(norm.scale[j], std::sqrt(var), 1e-9 * std::sqrt(var)) << "column " << j;
  }
  EXPECT_EQ(norm.shift[2], 4.2);
  EXPECT_EQ(norm.scale[2], 1.0);
}

// Names a checkpoint stores (series, categories) are UTF-8: a Latin-1 export's "Z\xfcrich" is
// refused before training, naming its line, not by the JSON writer after an epoch.
TEST(Series, NamesThatAreNotUtf8AreRefusedWhereTheyAre) {
  const fs::path dir = test::temp_dir("latin1");
  std::string text = "date,city,weather,value\n";
  for (int day = 0; day < 40; ++day)
    text += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + "," +
            (day < 20 ? "Bern" : "Z\xfcrich") + "," + (day % 3 ? "rain" : "W\xe4rme") + "," +
            std::to_string(day) + "\n";
  const std::string path = write(dir / "latin1.csv", text);
  EXPECT_EQ(error_of([&] { load_series(series_config(path)); }),
            path +
                ":22: column 'city' (data.series_column): 'Z\\xfcrich' is not UTF-8 text (byte 1; "
                "a Latin-1 or Windows-1252 export?): save the file as UTF-8");
  const std::string category = error_of([&] {
    load_series(series_config(path, {"data.series_column=", "data.categorical=[weather]"}));
  });
  EXPECT_NE(category.find(path + ":2: column 'weather' (data.categorical): 'W\\xe4rme' is not "
                                 "UTF-8 text"),
            std::string::npos)
      << category;
}

// The model computes in float32: a value beyond its range once scaled is named where it is.
TEST(Series, AValueBeyondFloat32IsNamedUnlessScaledIntoRange) {
  const fs::path dir = test::temp_dir("beyond_float");
  std::string text = "date,city,value,y\n";
  for (int day = 0; day < 40; ++day)
    text += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + ",a," +
            (day == 30 ? "1e39" : std::to_string(day)) + "," + std::to_string(day) + "\n";
  const std::string path = write(dir / "huge.csv", text);
  EXPECT_EQ(error_of([&] { load_series(series_config(path, {"data.targets=[y]"})); }),
            path +
                ":32: column 'value': 1e+39 is beyond float32's range (the model computes in "
                "float32); scale it, or set data.normalize: zscore");
  // A target stays within it in its own units, scaled or not.
  EXPECT_EQ(error_of([&] { load_series(series_config(path, {"data.normalize=zscore"})); }),
            path +
                ":32: column 'value': 1e+39 is beyond float32's range: a target must stay within "
                "it in its own units too, so that forecasts' errors and their squares are "
                "numbers; give it in larger units");
  const SeriesData d =
      load_series(series_config(path, {"data.normalize=zscore", "data.targets=[y]"}));
  float window[4];
  d.copy_window(d.split.val.back(), window);
  for (float x : window) EXPECT_TRUE(std::isfinite(x));
  // Past 2^512 a value's square overflows a double: the scalers stay finite (the value in the
  // training rows), the checkpoint that keeps them reads back, and the windows are finite.
  std::string far = "date,city,value,y\n";
  for (int day = 0; day < 40; ++day)
    far += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + ",a," +
           (day == 2 ? "-1e300" : std::to_string(day)) + "," + std::to_string(day) + "\n";
  const std::string far_path = write(dir / "far.csv", far);
  for (const char* kind : {"zscore", "minmax"}) {
    SCOPED_TRACE(kind);
    // The largest double: its scale is still a double (2^1024 is not).
    std::string largest = far;
    const std::string largest_path = write(
        dir / "largest.csv", largest.replace(far.find("-1e300"), 6, "1.7976931348623157e308"));
    const SeriesData l = load_series(
        series_config(largest_path, {std::string("data.normalize=") + kind, "data.targets=[y]"}));
    EXPECT_TRUE(std::isfinite(l.feature_norm.shift[0]) && std::isfinite(l.feature_norm.scale[0]))
        << l.feature_norm.shift[0] << " " << l.feature_norm.scale[0];
    l.copy_window(l.split.val.back(), window);
    for (float x : window) EXPECT_TRUE(std::isfinite(x));
    const SeriesData e = load_series(
        series_config(far_path, {std::string("data.normalize=") + kind, "data.targets=[y]"}));
    const Normalizer& norm = e.feature_norm;
    ASSERT_EQ(norm.scale.size(), 1u);
    const Normalizer back = Normalizer::from_json(norm.to_json(), "far");
    EXPECT_EQ(back.scale[0], norm.scale[0]);
    EXPECT_EQ(back.shift[0], norm.shift[0]);
    if (std::string(kind) == "minmax") {
      EXPECT_EQ(norm.shift[0], -1e300);
      EXPECT_DOUBLE_EQ(norm.scale[0], 1e300);
    } else {  // n training values, one -1e300: mean -1e300 / n, deviation 1e300 sqrt(n - 1) / n
      EXPECT_LT(norm.shift[0], -1e298);
      EXPECT_NEAR(norm.scale[0] / -norm.shift[0], std::sqrt(1e300 / -norm.shift[0] - 1), 1e-9);
    }
    e.copy_window(e.split.val.back(), window);
    for (float x : window) EXPECT_TRUE(std::isfinite(x));
  }
}

// data.calendar: each cycle as a sine and cosine after the file's features, from the date read
// as UTC; a run trained with them predicts on a file that has only its own columns.
TEST(Series, CalendarFeaturesComeFromTheDates) {
  const fs::path dir = test::temp_dir("calendar");
  std::string text = "when,value\n";
  for (int h = 0; h < 60; ++h)  // from Wednesday 2020-01-01 00:00, hourly
    text += io::format_datetime(int64_t{1577836800} + h * int64_t{3600}) + "," +
            std::to_string(h % 7) + "\n";
  const std::string path = write(dir / "h.csv", text);
  const Config c = Config::parse("data: {path: " + path +
                                     ", date_column: when, features: [value], targets: [value], "
                                     "lookback: 4, normalize: none, calendar: [hour, dayofweek, "
                                     "month]}\n",
                                 "c.yaml");
  const SeriesData d = load_series(c);
  EXPECT_EQ(d.feature_names,
            (std::vector<std::string>{"value", "hour_sin", "hour_cos", "dayofweek_sin",
                                      "dayofweek_cos", "month_sin", "month_cos"}));
  const double pi = std::numbers::pi;
  auto at = [&](int64_t row, int64_t col) { return d.source.at(row, d.feature_cols[col]); };
  // Row 6: Wednesday 06:00 (day 2.25 of a Monday-first week), January.
  EXPECT_NEAR(at(6, 1), 1.0, 1e-12);
  EXPECT_NEAR(at(6, 2), 0.0, 1e-12);
  EXPECT_NEAR(at(6, 3), std::sin(2 * pi * 2.25 / 7), 1e-12);
  EXPECT_NEAR(at(6, 4), std::cos(2 * pi * 2.25 / 7), 1e-12);
  EXPECT_NEAR(at(6, 5), 0.0, 1e-12);
  EXPECT_NEAR(at(6, 6), 1.0, 1e-12);
  EXPECT_NEAR(at(18, 2), 0.0, 1e-12) << "18:00";
  EXPECT_NEAR(at(18, 1), -1.0, 1e-12) << "18:00";
  // A stored model's features by name: the calendar's come from the dates, not the file.
  const SeriesData again = load_series(c, &d, WindowSet::every_window);
  EXPECT_EQ(again.feature_names, d.feature_names);
  EXPECT_EQ(error_of([&] {
              load_series(Config::parse("data: {path: " + path +
                                            ", features: [value], targets: [value], calendar: "
                                            "[hour]}\n",
                                        "c.yaml"));
            }),
            "c.yaml:1: data.calendar needs data.date_column, the dates it reads");
}

TEST(Series, SplitByDateCutsEverySeriesAtSharedDates) {
  const fs::path dir = test::temp_dir("by_date");
  // b starts 20 days after a: pooled dates put the cuts where a is further along.
  std::string text = "date,city,value\n";
  for (int day = 0; day < 40; ++day) {
    const std::string date = io::format_datetime(int64_t{1577836800} + day * int64_t{86400});
    text += date + ",a," + std::to_string(1000 + day) + "\n";
    if (day >= 20) text += date + ",b," + std::to_string(2000 + day) + "\n";
  }
  const SeriesData d =
      load_series(series_config(write(dir / "d.csv", text), {"data.split.by=date"}));
  // 60 rows pooled: the validation part starts at row 30 of the sorted dates (day 25), the
  // test part at row 45 (day 32).
  int64_t last_train_target = 0, first_val_target = INT64_MAX;
  for (int64_t s : d.split.train)
    last_train_target = std::max<int64_t>(last_train_target, d.times[d.target_row(s)]);
  for (int64_t s : d.split.val)
    first_val_target = std::min<int64_t>(first_val_target, d.times[d.target_row(s)]);
  const int64_t day25 = 1577836800 + 25 * int64_t{86400};
  EXPECT_LT(last_train_target, day25);
  EXPECT_EQ(first_val_target, day25);
  ASSERT_FALSE(d.notes.empty());
  EXPECT_NE(d.notes.back().find("2020-01-26"), std::string::npos) << d.notes.back();
  EXPECT_NE(error_of([&] {
              load_series(Config::parse("data: {path: " + (dir / "d.csv").string() +
                                            ", features: [value], targets: [value], "
                                            "split: {by: date}}\n",
                                        "s.yaml"));
            }).find("data.date_column"),
            std::string::npos);
}

TEST(Series, DuplicateDatesAndGapsAreNamed) {
  const fs::path dir = test::temp_dir("dates");
  const std::string dup = write(dir / "dup.csv",
                                "date,city,value\n2020-01-01,a,1\n2020-01-02,a,2\n2020-01-01,b,3\n"
                                "2020-01-02,a,4\n");
  const std::string e = error_of([&] { load_series(series_config(dup)); });
  EXPECT_NE(e.find("dup.csv:5"), std::string::npos) << e;
  EXPECT_NE(e.find("series 'a': duplicate date '2020-01-02'"), std::string::npos) << e;
  // Without a series column, equal dates are the sign of several series.
  const std::string merged = error_of([&] {
    load_series(Config::parse(
        "data: {path: " + dup + ", date_column: date, features: [value], targets: [value]}\n",
        "m.yaml"));
  });
  EXPECT_NE(merged.find("dup.csv:4"), std::string::npos) << merged;
  EXPECT_NE(merged.find("data.series_column"), std::string::npos) << merged;
  // A fraction of zeros is the whole second.
  std::string whole = "date,value\n";
  for (int i = 0; i < 30; ++i)
    whole += "2024-03-01T10:00:" + std::string(i < 10 ? "0" : "") + std::to_string(i) + ".000," +
             std::to_string(i % 4) + "\n";
  const SeriesData w =
      load_series(Config::parse("data: {path: " + write(dir / "whole.csv", whole) +
                                    ", date_column: date, features: [value], targets: [value], "
                                    "lookback: 4}\n",
                                "s.yaml"));
  EXPECT_EQ(w.rows, 30);
  EXPECT_FALSE(w.subsecond_times);
  EXPECT_EQ(w.usual_step(), "1 second");
  // Hourly local times where the clock went back an hour (Sunday 2021-11-07, 01:00 twice) are
  // named as such; the same repeat on a Wednesday is not.
  auto hourly = [&](const std::string& day) {
    std::string t = "date,value\n";
    for (const char* hour : {"00:00", "01:00", "01:00", "02:00", "03:00"})
      t += day + " " + hour + ",1\n";
    return error_of([&] {
      load_series(Config::parse("data: {path: " + write(dir / "dst.csv", t) +
                                    ", date_column: date, features: [value], targets: [value]}\n",
                                "h.yaml"));
    });
  };
  const std::string dst = hourly("2021-11-07");
  EXPECT_NE(dst.find("dst.csv:4: date '2021-11-07 01:00' appears again (first at " + dir.string() +
                     "/dst.csv:3): a local clock set back an hour for daylight saving time?"),
            std::string::npos)
      << dst;
  EXPECT_EQ(dst.find("data.series_column"), std::string::npos) << dst;
  EXPECT_EQ(hourly("2021-11-10").find("daylight saving"), std::string::npos);
  // The same instant written with another UTC offset: the first is named as written.
  const std::string offsets = error_of([&] {
    load_series(Config::parse("data: {path: " +
                                  write(dir / "offsets.csv",
                                        "date,value\n2024-03-31T00:00+01:00,1\n"
                                        "2024-03-31T01:00+01:00,2\n2024-03-31T02:00+02:00,3\n") +
                                  ", date_column: date, features: [value], targets: [value]}\n",
                              "o.yaml"));
  });
  EXPECT_NE(offsets.find("offsets.csv:4: date '2024-03-31T02:00+02:00' appears again (as "
                         "'2024-03-31T01:00+01:00' at " +
                         dir.string() + "/offsets.csv:3)"),
            std::string::npos)
      << offsets;
  // A missing day in an otherwise daily series is a gap, reported once.
  std::string text = "date,city,value\n";
  for (int day = 0; day < 30; ++day)
    if (day != 10 && day != 11)
      text += io::format_datetime(int64_t{1577836800} + day * int64_t{86400}) + ",a," +
              std::to_string(day) + "\n";
  const SeriesData d = load_series(series_config(write(dir / "gap.csv", text)));
  ASSERT_EQ(d.notes.size(), 1u);
  EXPECT_NE(d.notes[0].find("1 gap"), std::string::npos) << d.notes[0];
  EXPECT_NE(d.notes[0].find("3 days"), std::string::npos) << d.notes[0];
  EXPECT_TRUE(d.series[0].regular);  // a whole number of days: dates past the end are known
  EXPECT_EQ(d.time_ahead(d.rows - 1, 2), int64_t{1577836800} + 31 * int64_t{86400});
  // The series column names a series; it is no feature or target, and never empty.
  const std::string two = two_series_csv(dir, 10, 10);
  for (const char* as : {"data.features=[value,city]", "data.targets=[city]"}) {
    const std::string e = error_of([&] { load_series(series_config(two, {as})); });
    EXPECT_NE(e.find("'city' is data.series_column"), std::string::npos) << as << ": " << e;
  }
  const std::string blank =
      write(dir / "blank.csv", "date,city,value\n2020-01-01,a,1\n2020-01-02,,2\n2020-01-03,a,3\n");
  const std::string empty = error_of([&] { load_series(series_config(blank)); });
  EXPECT_NE(empty.find("blank.csv:3: column 'city' (data.series_column) is empty"),
            std::string::npos)
      << empty;
}

// Calendar months: monthly, quarterly and month-end dates are regular, their steps counted in
// months (28 to 31 days apart in seconds), and forecast dates land on the same day or month end.
// Business days: weekends are no gaps, found from the dates or with data.frequency B; listed
// holidays neither. 2020-01-01 was a Wednesday; 2020-01-20 a Monday holiday.
TEST(Series, BusinessDaysAreRegularAndHolidaysNoGaps) {
  auto at = [](const char* date) { return *io::parse_datetime(date); };
  const BusinessCalendar plain, holidays({at("2020-01-20") / 86400});
  EXPECT_EQ(plain.add(at("2020-01-03"), 1), at("2020-01-06"));  // Friday to Monday
  EXPECT_EQ(plain.add(at("2020-01-17T16:00:00"), 1), at("2020-01-20T16:00:00"));
  EXPECT_EQ(holidays.add(at("2020-01-17"), 1), at("2020-01-21"));
  EXPECT_EQ(holidays.add(at("2020-01-17"), 6), at("2020-01-28"));
  EXPECT_EQ(plain.between(at("2020-01-03"), at("2020-01-06")), 1);
  EXPECT_EQ(holidays.between(at("2020-01-17"), at("2020-01-21")), 1);
  EXPECT_EQ(plain.between(at("2020-01-17"), at("2020-01-21")), 2);
  const fs::path dir = test::temp_dir("business");
  // Every business day of January 2020 but the holiday.
  std::string text = "date,city,value\n";
  int64_t rows = 0;
  for (int64_t t = at("2020-01-01"); t < at("2020-02-01"); t += 86400)
    if (holidays.is_business_day(t))
      text += io::format_datetime(t) + ",a," + std::to_string(rows++) + "\n";
  const std::string path = write(dir / "b.csv", text);
  const std::string list = write(dir / "holidays.txt", "date\n# US\n2020-01-20\n");
  const SeriesData found = load_series(series_config(path));
  EXPECT_TRUE(found.series[0].business_days);
  EXPECT_TRUE(found.series[0].regular);  // the holiday is a gap without the list, on the grid
  EXPECT_EQ(found.notes.size(), 1u);
  EXPECT_EQ(found.time_ahead(found.rows - 1, 1), at("2020-02-03"));  // Friday to Monday
  const SeriesData listed =
      load_series(series_config(path, {"data.frequency=B", "data.holidays=" + list}));
  EXPECT_TRUE(listed.series[0].business_days);
  EXPECT_TRUE(listed.series[0].regular);
  EXPECT_TRUE(listed.notes.empty()) << listed.notes[0];
  // Every weekday, the listed holiday too: read as business days still, the holiday's row named
  // (read as calendar days with gaps, forecasts after a Friday fell on the Saturday).
  std::string weekdays = "date,city,value\n";
  rows = 0;
  for (int64_t t = at("2020-01-01"); t < at("2020-02-01"); t += 86400)
    if (plain.is_business_day(t))
      weekdays += io::format_datetime(t) + ",a," + std::to_string(rows++) + "\n";
  const std::string all_weekdays = write(dir / "weekdays.csv", weekdays);
  EXPECT_EQ(error_of([&] { load_series(series_config(all_weekdays, {"data.holidays=" + list})); }),
            all_weekdays +
                ":15: '2020-01-20' is listed in data.holidays, not a business day (the dates "
                "step by business days)");
  // A weekend date under B, a date off an explicit step, a bad holidays line: named.
  const std::string weekend = write(dir / "w.csv",
                                    "date,city,value\n2020-01-03,a,1\n"
                                    "2020-01-04,a,2\n2020-01-06,a,3\n");
  EXPECT_EQ(error_of([&] { load_series(series_config(weekend, {"data.frequency=B"})); }),
            weekend + ":3: '2020-01-04' is on a weekend, not a business day (data.frequency B)");
  const std::string hourly = write(dir / "h.csv",
                                   "date,city,value\n2020-01-03T00:00:00,a,1\n"
                                   "2020-01-03T01:00:00,a,2\n"
                                   "2020-01-03T01:30:00,a,3\n");
  EXPECT_NE(error_of([&] { load_series(series_config(hourly, {"data.frequency=H"})); })
                .find(":4: '2020-01-03T01:30:00' is 30 minutes after the row before, not a whole "
                      "number of data.frequency H"),
            std::string::npos);
  // pandas' newer lower-case hour reads as H.
  EXPECT_EQ(load_series(series_config(path, {"data.frequency=h"})).series[0].step, 3600);
  EXPECT_NE(error_of([&] {
              load_series(series_config(hourly, {"data.frequency=h"}));
            }).find("not a whole number of data.frequency h"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { load_series(series_config(hourly, {"data.frequency=500ms"})); }),
            hourly +
                ": data.frequency 500ms is finer than a second, and column 'date' holds "
                "whole seconds only");
  EXPECT_NE(error_of([&] {
              load_series(series_config(path, {"data.frequency=fortnight"}));
            }).find("data.frequency must be auto, B"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              load_series(series_config(path, {"data.frequency=999999999W"}));
            }).find("data.frequency '999999999W' is longer than any span of dates"),
            std::string::npos);
  const std::string bad = write(dir / "bad.txt", "2020-01-20\nnot a date\n");
  EXPECT_EQ(error_of([&] { load_series(series_config(path, {"data.holidays=" + bad})); }),
            bad + ":2: 'not a date' is not an ISO date (data.holidays)");
}

TEST(Series, MonthlyDatesAreRegularInCalendarMonths) {
  auto at = [](const char* date) { return *io::parse_datetime(date); };
  EXPECT_EQ(io::add_months(at("2019-12-01"), 2), at("2020-02-01"));
  EXPECT_EQ(io::add_months(at("2020-01-31"), 1), at("2020-02-29"));  // the day does not exist
  EXPECT_EQ(io::add_months(at("2019-02-28"), 1), at("2019-03-28"));
  EXPECT_EQ(io::add_months(at("2019-02-28"), 1, true), at("2019-03-31"));  // month ends
  EXPECT_EQ(io::add_months(at("2019-02-28"), 12, true), at("2020-02-29"));
  EXPECT_EQ(io::add_months(at("2020-01-15T06:30:00"), 13), at("2021-02-15T06:30:00"));
  EXPECT_EQ(io::add_months(at("1969-11-30"), 3), at("1970-02-28"));
  const fs::path dir = test::temp_dir("months");
  auto series = [&](const std::vector<std::string>& dates) {
    std::string text = "date,city,value\n";
    for (size_t i = 0; i < dates.size(); ++i) text += dates[i] + ",a," + std::to_string(i) + "\n";
    return load_series(series_config(write(dir / "m.csv", text))).series[0];
  };
  std::vector<std::string> monthly, quarter_ends, mixed, twenty_eighths;
  for (int m = 0; m < 24; ++m) {
    monthly.push_back(io::format_datetime(io::add_months(at("2010-01-01"), m)));
    quarter_ends.push_back(io::format_datetime(io::add_months(at("2010-03-31"), 3 * m, true)));
    twenty_eighths.push_back(io::format_datetime(io::add_months(at("2010-02-28"), m)));
    mixed.push_back(
        io::format_datetime(io::add_months(at("2010-01-01"), m) + (m == 7 ? 86400 : 0)));
  }
  const SeriesSpan a = series(monthly), b = series(quarter_ends), c = series(mixed);
  const SeriesSpan d = series(twenty_eighths);
  EXPECT_TRUE(a.regular);
  EXPECT_EQ(a.months, 1);
  EXPECT_FALSE(a.month_end);
  EXPECT_TRUE(b.regular);
  EXPECT_EQ(b.months, 3);
  EXPECT_TRUE(b.month_end);
  EXPECT_EQ(d.months, 1);  // starts on a month end, but keeps to the 28th
  EXPECT_FALSE(d.month_end);
  EXPECT_FALSE(c.regular);  // one date off its day of the month
  EXPECT_EQ(c.months, 0);
  // Months missing from monthly data are gaps, in auto and under data.frequency M, and the dates
  // past the end are the next months still; a step of no whole number of quarters is an error
  // under Q.
  std::vector<std::string> gappy;
  for (int m : {0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21})
    gappy.push_back(io::format_datetime(io::add_months(at("2010-01-31"), m, true)));
  std::string text = "date,city,value\n";
  for (size_t i = 0; i < gappy.size(); ++i) text += gappy[i] + ",a," + std::to_string(i) + "\n";
  const std::string path = write(dir / "gappy.csv", text);
  for (const char* frequency : {"data.frequency=auto", "data.frequency=M"}) {
    const SeriesData g = load_series(series_config(path, {frequency}));
    EXPECT_TRUE(g.series[0].regular) << frequency;
    EXPECT_EQ(g.series[0].months, 1) << frequency;
    EXPECT_TRUE(g.series[0].month_end) << frequency;
    ASSERT_EQ(g.notes.size(), 1u) << frequency;
    EXPECT_NE(g.notes[0].find("2 gaps"), std::string::npos) << g.notes[0];
    EXPECT_EQ(g.time_ahead(g.rows - 1, 2), at("2011-12-31")) << frequency;
  }
  EXPECT_NE(error_of([&] {
              load_series(series_config(path, {"data.frequency=Q"}));
            }).find("dates do not step by whole multiples of 3 calendar months"),
            std::string::npos);
}

// Dates day or month first: the column's order told by a field past 12 (or data.date_order),
// the rows ordered by date, a note saying how they were read, the dates ISO from then on; an
// undecidable or mixed column is one error each. YYYYMMDD likewise.
TEST(Series, DatesWrittenDayOrMonthFirstAreRead) {
  const fs::path dir = test::temp_dir("date_layouts");
  auto file = [&](const std::string& name, const std::vector<std::string>& dates) {
    return dated_csv(dir / name, dates);
  };
  auto config = [](const std::string& path, const std::vector<std::string>& more = {}) {
    return Config::parse("data: {path: " + path +
                             ", date_column: date, features: [value], targets: [value], "
                             "lookback: 2, split: {train: 0.5, val: 0.25}, normalize: none}\n",
                         "d.yaml", more);
  };
  // 12 days from 2020-01-08, written day first, the rows out of order.
  std::vector<std::string> day_first, month_first, compact;
  for (int k = 0; k < 12; ++k) {
    const std::string iso = io::format_datetime(int64_t{1578441600} + k * int64_t{86400}, true);
    const std::string y = iso.substr(0, 4), m = iso.substr(5, 2), d = iso.substr(8, 2);
    day_first.push_back(d + "/" + m + "/" + y);
    month_first.push_back(m + "/" + d + "/" + y);
    compact.push_back(y + m + d);
  }
  std::swap(day_first[0], day_first[5]);
  const std::string dmy = file("dmy.csv", day_first);
  const SeriesData d = load_series(config(dmy));
  ASSERT_EQ(d.dates.size(), 12u);
  EXPECT_EQ(d.dates.front(), "2020-01-08");
  EXPECT_EQ(d.dates.back(), "2020-01-19");
  EXPECT_EQ(d.series[0].step, 86400);
  EXPECT_TRUE(d.series[0].regular);
  EXPECT_EQ(raw(d, 0), 5);  // the 8th is the file's sixth row
  ASSERT_FALSE(d.notes.empty());
  EXPECT_EQ(d.notes[0], dmy +
                            ": column 'date' writes its dates day first (day/month/year: "
                            "'13/01/2020' at " +
                            dmy + ":2); predictions write them as ISO dates");
  const SeriesData m = load_series(config(file("mdy.csv", month_first)));
  EXPECT_EQ(m.dates, std::vector<std::string>(d.dates.begin(), d.dates.end()));
  EXPECT_NE(m.notes[0].find("month first (month/day/year: '01/13/2020' at "), std::string::npos)
      << m.notes[0];
  const SeriesData c = load_series(config(file("compact.csv", compact)));
  EXPECT_EQ(c.dates, m.dates);
  EXPECT_NE(c.notes[0].find("writes its dates as YYYYMMDD"), std::string::npos) << c.notes[0];
  std::vector<std::string> floats = compact;  // pandas' float column: 20200108.0
  for (std::string& date : floats) date += ".0";
  EXPECT_EQ(load_series(config(file("floats.csv", floats))).dates, m.dates);
  // YYYYMM months (were numbers, forecasts after 202012 dated 202013).
  std::vector<std::string> months;
  for (int k = 0; k < 14; ++k)
    months.push_back(std::to_string(2019 + (k + 11) / 12) + (((k + 11) % 12) < 9 ? "0" : "") +
                     std::to_string((k + 11) % 12 + 1));
  const SeriesData monthly = load_series(config(file("months.csv", months)));
  EXPECT_FALSE(monthly.numeric_times);
  EXPECT_EQ(monthly.dates.front(), "2019-12-01");
  EXPECT_EQ(monthly.dates.back(), "2021-01-01");
  EXPECT_EQ(monthly.series[0].months, 1);
  EXPECT_EQ(io::format_datetime(*monthly.time_ahead(monthly.rows - 1, 1), true), "2021-02-01");
  EXPECT_NE(monthly.notes[0].find("writes its dates as YYYYMM months"), std::string::npos)
      << monthly.notes[0];
  // Six-digit counts that pass a month's 12 stay numbers.
  std::vector<std::string> counts;
  for (int k = 0; k < 14; ++k) counts.push_back(std::to_string(201901 + k));
  EXPECT_TRUE(load_series(config(file("counts.csv", counts))).numeric_times);
  // The first of each month of 2020, month first: no field past 12 tells the order, an error
  // unless data.date_order says it (day first, they are 1 to 12 January).
  std::vector<std::string> firsts;
  for (int k = 1; k <= 12; ++k)
    firsts.push_back((k < 10 ? "0" : "") + std::to_string(k) + "/01/2020");
  const std::string early = file("early.csv", firsts);
  EXPECT_NE(error_of([&] { load_series(config(early)); })
                .find(early + ":2: column 'date': '01/01/2020' may have its day or its month "
                              "first, and no date of the column has a field past 12 to tell: set "
                              "data.date_order (eval and predict: --date-order) to dmy (day "
                              "first) or mdy (month first)"),
            std::string::npos);
  const SeriesData told = load_series(config(early, {"data.date_order=mdy"}));
  EXPECT_EQ(told.dates.back(), "2020-12-01");
  EXPECT_EQ(told.series[0].months, 1);
  EXPECT_NE(told.notes[0].find("month first (month/day/year: data.date_order)"), std::string::npos)
      << told.notes[0];
  const SeriesData days = load_series(config(early, {"data.date_order=dmy"}));
  EXPECT_EQ(days.dates.back(), "2020-01-12");
  EXPECT_EQ(days.series[0].step, 86400);
  // A told order the file does not write (a run trained day first, predicting from a month-first
  // file) names the order that reads it.
  std::vector<std::string> later = firsts;
  later[3] = "04/19/2020";
  EXPECT_NE(
      error_of([&] { load_series(config(file("later.csv", later), {"data.date_order=dmy"})); })
          .find(":5: column 'date': '04/19/2020' is not a date with its day first "
                "(dmy: data.date_order, or for eval and predict --date-order or the run's "
                "order) but reads with its month first: set data.date_order, or --date-order "
                "for eval and predict, to mdy"),
      std::string::npos);
  // Both orders in one column, and a cell that is no date of the column's kind.
  std::vector<std::string> mixed = day_first;
  mixed[8] = month_first[8];
  EXPECT_NE(error_of([&] {
              load_series(config(file("mixed.csv", mixed)));
            }).find("has its month first where"),
            std::string::npos);
  // YYYYMMDDHH, hourly: dates; Unix seconds whose first reads so (1801010100, 2027) stay numbers.
  std::vector<std::string> hours, seconds;
  for (int k = 0; k < 12; ++k) {
    const std::string iso = io::format_datetime(int64_t{1578441600} + k * int64_t{3600}, false);
    hours.push_back(iso.substr(0, 4) + iso.substr(5, 2) + iso.substr(8, 2) + iso.substr(11, 2));
    seconds.push_back(std::to_string(int64_t{1801010100} + k * 3600));
  }
  const SeriesData h = load_series(config(file("hours.csv", hours)));
  EXPECT_EQ(h.dates.front(), "2020-01-08T00:00:00");
  EXPECT_EQ(h.dates.back(), "2020-01-08T11:00:00");
  EXPECT_EQ(h.series[0].step, 3600);
  EXPECT_NE(h.notes[0].find("writes its dates as YYYYMMDDHH[MM[SS]] date-times"), std::string::npos)
      << h.notes[0];
  const SeriesData unix_seconds = load_series(config(file("seconds.csv", seconds)));
  EXPECT_TRUE(unix_seconds.numeric_times);
  EXPECT_EQ(unix_seconds.dates.front(), "1801010100");
  std::vector<std::string> bad = compact;
  bad[3] = "2020-01-11";
  EXPECT_NE(error_of([&] { load_series(config(file("bad.csv", bad))); })
                .find("bad.csv:5: column 'date': '2020-01-11' is not a date written as the "
                      "column's first, '20200108' (column 'date' writes its dates as YYYYMMDD"),
            std::string::npos);
  bad[3] = "20200111\u00a0";  // shown escaped, not as a date that looks right
  EXPECT_NE(error_of([&] {
              load_series(config(file("nbsp.csv", bad)));
            }).find("nbsp.csv:5: column 'date': '20200111\\u00a0' is not a date"),
            std::string::npos);
}

// Dates with UTC offsets: local midnights (a time zone's days, the offset changing with daylight
// saving time) are the days they name; other times are instants, ordered and stepped in UTC
// across the clock's change and written in UTC with a Z.
// Dates with the months' names (Yahoo's "Jan 05, 2024"), out of order as such files list them
// (newest first), read as their ISO twins, with a note.
TEST(Series, DatesWithMonthNamesReadAsTheirIsoTwins) {
  const fs::path dir = test::temp_dir("month_names");
  const char* months[] = {"Jan", "Feb", "Mar"};
  std::string named = "Date,Close\n", iso = "Date,Close\n";
  for (int k = 29; k >= 0; --k) {
    const int month = k / 10, day = 1 + k % 10 * 2;
    const std::string close = std::to_string(100 + k * k % 7) + "\n";
    named += "\"" + std::string(months[month]) + " " + (day < 10 ? "0" : "") + std::to_string(day) +
             ", 2024\"," + close;
    iso += "2024-0" + std::to_string(month + 1) + "-" + (day < 10 ? "0" : "") +
           std::to_string(day) + "," + close;
  }
  auto config = [](const std::string& path) {
    return Config::parse("data: {path: " + path +
                             ", date_column: Date, targets: [Close], lookback: 3, "
                             "split: {train: 0.5, val: 0.25}, normalize: none}\n",
                         "m.yaml");
  };
  const std::string named_path = write(dir / "named.csv", named);
  const SeriesData n = load_series(config(named_path));
  const SeriesData i = load_series(config(write(dir / "iso.csv", iso)));
  EXPECT_EQ(n.dates, i.dates);
  EXPECT_EQ(n.dates.front(), "2024-01-01");
  ASSERT_EQ(n.source.rows, i.source.rows);
  for (int64_t r = 0; r < n.source.rows; ++r)
    EXPECT_EQ(n.source.at(r, n.target_cols[0]), i.source.at(r, i.target_cols[0])) << r;
  EXPECT_NE(
      std::find(n.notes.begin(), n.notes.end(),
                named_path + ": column 'Date' writes its dates with the months' names; predictions "
                             "write them as ISO dates"),
      n.notes.end());
}

TEST(Series, ASemicolonFileWithDecimalCommasReadsAsItsCommaTwin) {
  const fs::path dir = test::temp_dir("semicolons");
  std::string eu = "date;temp;load\n", us = "date,temp,load\n";
  for (int k = 0; k < 12; ++k) {
    const std::string day = std::to_string(10 + k);
    eu += day + ".01.2020;" + std::to_string(k - 3) + "," + (k % 2 ? "5" : "25") + ";" +
          std::to_string(100 + k) + "\n";
    us += "2020-01-" + day + "," + std::to_string(k - 3) + "." + (k % 2 ? "5" : "25") + "," +
          std::to_string(100 + k) + "\n";
  }
  auto config = [](const std::string& path) {
    return Config::parse("data: {path: " + path +
                             ", date_column: date, features: [temp, load], targets: [load], "
                             "lookback: 2, split: {train: 0.5, val: 0.25}, normalize: none}\n",
                         "e.yaml");
  };
  const std::string eu_path = write(dir / "eu.csv", eu);
  const SeriesData e = load_series(config(eu_path));
  const SeriesData u = load_series(config(write(dir / "us.csv", us)));
  EXPECT_EQ(e.dates, u.dates);
  ASSERT_EQ(e.source.rows, u.source.rows);
  for (int64_t r = 0; r < e.source.rows; ++r)
    for (int64_t c : e.feature_cols) EXPECT_EQ(e.source.at(r, c), u.source.at(r, c)) << r;
  EXPECT_EQ(e.source.at(1, e.feature_cols[0]), -2.5);
  ASSERT_FALSE(e.notes.empty());
  EXPECT_EQ(e.notes[0], eu_path +
                            ": fields separated by ';' (as the header's are); decimal "
                            "commas in 'temp'");
  for (const std::string& n : u.notes) EXPECT_EQ(n.find("separated"), std::string::npos) << n;
}

TEST(Series, DatesInAColumnThatIsNotTheDateColumnAreNamed) {
  const fs::path dir = test::temp_dir("dates_as_feature");
  for (const char* date : {"2020-01-10", "10.01.2020", "01/10/2020 1:45 PM"}) {
    const std::string path = write(
        dir / "d.csv", "when,value\n" + std::string(date) + ",1\n" + std::string(date) + ",2\n");
    const std::string error = error_of([&] {
      load_series(
          Config::parse("data: {path: " + path + ", targets: [value], lookback: 1}\n", "f.yaml"));
    });
    EXPECT_EQ(error, path + ":2: column 'when' holds dates ('" + date +
                         "'): name it in data.date_column, which orders the rows (dates are no "
                         "feature)");
  }
}

// pandas' to_csv writes a frame's index as a first column without a name.
TEST(Series, PandasIndexOfDatesOrdersTheRowsAndANumberedOneIsNoFeature) {
  const fs::path dir = test::temp_dir("pandas_index");
  std::string dated = ",value,other\n", numbered = dated;
  for (int k = 11; k >= 0; --k) {  // rows out of order
    const std::string v = std::to_string(k) + "," + std::to_string(100 + k) + "\n";
    dated += io::format_datetime(int64_t{1577836800} + k * int64_t{86400}) + "," + v;
    numbered += std::to_string(k) + "," + v;
  }
  auto config = [](const std::string& path) {
    return Config::parse("data: {path: " + path +
                             ", targets: [value], lookback: 2, split: {train: 0.5, val: 0.25}, "
                             "normalize: none}\n",
                         "p.yaml");
  };
  const std::string dated_path = write(dir / "dated.csv", dated);
  const SeriesData d = load_series(config(dated_path));
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"value", "other"}));
  ASSERT_EQ(d.dates.size(), 12u);
  EXPECT_EQ(d.dates.front(), "2020-01-01");
  EXPECT_EQ(raw(d, 0), 0);  // ordered by the index's dates
  ASSERT_FALSE(d.notes.empty());
  EXPECT_EQ(d.notes[0], dated_path +
                            ": column 1 has no name, as pandas writes a frame's index, and holds "
                            "dates: they order the rows (data.date_column 'Unnamed: 0')");
  const std::string numbered_path = write(dir / "numbered.csv", numbered);
  const SeriesData n = load_series(config(numbered_path));
  EXPECT_EQ(n.feature_names, (std::vector<std::string>{"value", "other"}));
  EXPECT_EQ(raw(n, 0), 11);  // the file's order
  ASSERT_FALSE(n.notes.empty());
  EXPECT_EQ(n.notes[0], numbered_path +
                            ": column 1 has no name, as pandas writes a frame's index: not a "
                            "feature (data.features: ['Unnamed: 0', ...] makes it one)");
  const SeriesData listed = load_series(Config::parse(
      "data: {path: " + numbered_path +
          ", features: ['Unnamed: 0', value], targets: [value], lookback: 2, normalize: none}\n",
      "l.yaml"));
  EXPECT_EQ(listed.feature_names, (std::vector<std::string>{"Unnamed: 0", "value"}));
  EXPECT_EQ(raw(listed, 0), 11);
}

// A directory of files, or a pattern, is no data.path: the error says where several series go.
TEST(Series, ADirectoryOrPatternIsNoDataPath) {
  const fs::path dir = test::temp_dir("many_files");
  write(dir / "a.csv", "t,v\n1,1\n2,2\n");
  for (const std::string& path : {dir.string(), (dir / "*.csv").string()})
    EXPECT_EQ(error_of([&] {
                load_series(Config::parse(
                    "data: {path: '" + path + "', targets: [v], lookback: 1}\n", "d.yaml"));
              }),
              "d.yaml:1: data.path '" + path + "' is " +
                  (path == dir.string() ? "a directory" : "a pattern") +
                  "; give one file: series from several files go in one, with a column naming "
                  "each series (data.series_column)");
}

TEST(Series, ATextColumnTakenAsAFeatureByDefaultSaysSo) {
  const fs::path dir = test::temp_dir("text_feature");
  const std::string path = write(dir / "w.csv",
                                 "date,temp,weather\n2020-01-01,1,rain\n2020-01-02,2,sun\n"
                                 "2020-01-03,3,n.a.\n");
  auto load = [&](const std::string& more) {
    return load_series(Config::parse(
        "data: {path: " + path + ", date_column: date, targets: [temp], lookback: 1" + more + "}\n",
        "t.yaml"));
  };
  EXPECT_EQ(error_of([&] { load(""); }),
            path +
                ":2: column 'weather': 'rain' is not a number (without data.features, every "
                "column but the date, series and class columns is a feature: list the "
                "features in data.features, or make a text column one-hot features with "
                "data.categorical)");
  EXPECT_EQ(load(", features: [temp]").feature_names, (std::vector<std::string>{"temp"}));
  EXPECT_EQ(error_of([&] { load(", features: [temp, weather]"); }),
            path +
                ":2: column 'weather': 'rain' is not a number (a column of categories? name it "
                "in data.categorical, or data.static if it holds one value per series)");
  // One cell that is no number among numbers is a code for a missing value, not a category.
  const std::string q = write(dir / "q.csv",
                              "date,temp,load\n2020-01-01,1,5\n2020-01-02,?,6\n"
                              "2020-01-03,3,7\n2020-01-04,4,8\n");
  EXPECT_EQ(error_of([&] {
              load_series(Config::parse("data: {path: " + q +
                                            ", date_column: date, features: [temp, load], "
                                            "targets: [load], lookback: 1}\n",
                                        "q.yaml"));
            }),
            q + ":3: column 'temp': '?' is not a number (a code for a missing value? List it in "
                "data.missing_values, and fill or mask it with data.missing)");
  // Three rows: the one training window reads the first only; the others' categories are left
  // out, as categories new to the model.
  EXPECT_EQ(load(", categorical: [weather]").feature_names,
            (std::vector<std::string>{"temp", "weather=rain"}));
  const std::string coded = write(dir / "coded.csv",
                                  "date,temp,rainy\n2020-01-01,1,n.a.\n2020-01-02,2,True\n"
                                  "2020-01-03,3,False\n");
  const SeriesData d = load_series(Config::parse(
      "data: {path: " + coded +
          ", date_column: date, targets: [temp], lookback: 1, missing_values: [n.a.], "
          "missing: interpolate, normalize: none}\n",
      "c.yaml"));
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"temp", "rainy"}));
  EXPECT_EQ(d.source.at(2, d.feature_cols[1]), 0);
}

TEST(Series, TimesWithUtcOffsets) {
  const fs::path dir = test::temp_dir("offsets");
  auto load = [&](const std::string& name, const std::vector<std::string>& dates) {
    return load_series(Config::parse("data: {path: " + dated_csv(dir / name, dates) +
                                         ", date_column: date, features: [value], targets: "
                                         "[value], lookback: 2, normalize: none}\n",
                                     "o.yaml"));
  };
  // New York's days around 2021-11-07, when its offset went from -04:00 to -05:00.
  std::vector<std::string> days;
  for (int day = 1; day <= 12; ++day)
    days.push_back("2021-11-" + std::string(day < 10 ? "0" : "") + std::to_string(day) +
                   " 00:00:00" + (day <= 7 ? "-04:00" : "-05:00"));
  const SeriesData d = load("days.csv", days);
  EXPECT_EQ(d.series[0].step, 86400);
  EXPECT_TRUE(d.series[0].regular);
  EXPECT_FALSE(d.utc_times);
  EXPECT_EQ(d.dates.front(), "2021-11-01");
  EXPECT_EQ(d.time_text(*d.time_ahead(d.rows - 1, 1), ""), "2021-11-13");
  ASSERT_FALSE(d.notes.empty());
  EXPECT_NE(d.notes[0].find("holds local midnights with UTC offsets: read as the days they name"),
            std::string::npos)
      << d.notes[0];
  // Its hours through the night the clock went back: 01:00 twice, an hour apart in UTC.
  const std::vector<std::string> hours = {"2021-11-07 00:00-04:00", "2021-11-07 01:00-04:00",
                                          "2021-11-07 01:00-05:00", "2021-11-07 02:00-05:00",
                                          "2021-11-07 03:00-05:00", "2021-11-07 04:00-05:00"};
  const SeriesData h = load("hours.csv", hours);
  EXPECT_EQ(h.series[0].step, 3600);
  EXPECT_TRUE(h.series[0].regular);
  EXPECT_TRUE(h.utc_times);
  EXPECT_EQ(h.dates[1], "2021-11-07T05:00:00Z");
  EXPECT_EQ(h.dates[2], "2021-11-07T06:00:00Z");
  EXPECT_EQ(h.time_text(*h.time_ahead(h.rows - 1, 1), ""), "2021-11-07T10:00:00Z");
  EXPECT_NE(h.notes[0].find("holds times with UTC offsets: read as instants, written in UTC "
                            "('2021-11-07 00:00-04:00' as 2021-11-07T04:00:00Z)"),
            std::string::npos)
      << h.notes[0];
  // Times marked as UTC and others not: the others are read as UTC, and said to be; an offset
  // on some that makes two times one names the cause.
  std::vector<std::string> mixed;
  for (int hour = 0; hour < 8; ++hour)
    mixed.push_back("2021-11-01 0" + std::to_string(hour) + ":00" + (hour < 5 ? "Z" : ""));
  const SeriesData m = load("mixed.csv", mixed);
  EXPECT_EQ(m.series[0].step, 3600);
  const std::string mixed_path = (dir / "mixed.csv").string();
  EXPECT_NE(std::find(m.notes.begin(), m.notes.end(),
                      mixed_path +
                          ": column 'date' marks 5 of its times as UTC or with a UTC offset and 3 "
                          "not (the first '2021-11-01 05:00' at " +
                          mixed_path + ":7): those are read as UTC"),
            m.notes.end())
      << ::testing::PrintToString(m.notes);
  for (const SeriesData* one : {&d, &h})
    for (const std::string& note : one->notes) EXPECT_EQ(note.find(" marks "), std::string::npos);
  const std::vector<std::string> shifted = {"2021-11-01 00:00", "2021-11-01 01:00",
                                            "2021-11-01 02:00", "2021-11-01 04:00+02:00",
                                            "2021-11-01 05:00+02:00"};
  const std::string shifted_path = (dir / "shifted.csv").string();
  EXPECT_EQ(error_of([&] { load("shifted.csv", shifted); }),
            shifted_path +
                ":5: date '2021-11-01 04:00+02:00' appears again (as '2021-11-01 02:00' at " +
                shifted_path +
                ":4): times without a UTC offset are read as UTC; write every time with its "
                "offset, or none");
}

// Dates that step off their usual step (10 minutes, then 11, then 9): the rows are read as evenly
// spaced with a note naming the first such step, and no date past the end is made up; with
// data.frequency the off-grid date is an error.
TEST(Series, DatesOffTheirUsualStepAreNoted) {
  const fs::path dir = test::temp_dir("off_grid");
  std::string text = "date,city,value\n";
  int minutes = 0;
  for (int k = 0; k < 20; ++k) {
    char date[40];
    std::snprintf(date, sizeof date, "2024-03-01 %02d:%02d:00", 10 + minutes / 60, minutes % 60);
    text += std::string(date) + ",a," + std::to_string(k) + "\n";
    minutes += k == 3 ? 11 : k == 7 ? 9 : 10;
  }
  const std::string path = write(dir / "jitter.csv", text);
  const SeriesData d = load_series(series_config(path, {}));
  ASSERT_EQ(d.series.size(), 1u);
  EXPECT_FALSE(d.series[0].regular);
  EXPECT_EQ(d.series[0].step, 600);
  EXPECT_FALSE(d.time_ahead(d.rows - 1, 1).has_value());
  std::string noted;
  for (const std::string& note : d.notes)
    if (note.find("not a whole number") != std::string::npos) noted = note;
  EXPECT_EQ(noted, path +
                       ": 2 steps between dates not a whole number of the usual one (10 minutes; "
                       "the first '2024-03-01 10:41:00' at " +
                       path +
                       ":6, 11 minutes after the row before): the rows are read as evenly spaced, "
                       "and predict cannot date forecasts past the end (data.frequency makes a "
                       "date off its step an error)")
      << ::testing::PrintToString(d.notes);
  EXPECT_EQ(error_of([&] { load_series(series_config(path, {"data.frequency=10min"})); }),
            path +
                ":6: '2024-03-01 10:41:00' is 11 minutes after the row before, not a whole "
                "number of data.frequency 10min");
  // Numbers as times say their steps in the column's units.
  const std::string numbers = write(dir / "numbers.csv",
                                    "t,city,value\n0,a,0\n1,a,1\n2,a,2\n3.5,a,3\n4.5,a,4\n5.5,a,5\n"
                                    "6.5,a,6\n7.5,a,7\n8.5,a,8\n9.5,a,9\n");
  const SeriesData t = load_series(series_config(numbers, {"data.date_column=t"}));
  std::string numbered;
  for (const std::string& note : t.notes)
    if (note.find("not a whole number") != std::string::npos) numbered = note;
  EXPECT_NE(numbered.find(": 1 step between times not a whole number of the usual one (1; the "
                          "first '3.5' at " +
                          numbers +
                          ":5, 1.5 after the row before): the rows are read as evenly "
                          "spaced, and predict cannot date forecasts past the end"),
            std::string::npos)
      << numbered;
  // On the grid, with a gap, there is no such note.
  std::string even_text = "date,city,value\n";
  for (int k = 0; k < 20; ++k) {
    char date[40];
    const int at = k * 10 + (k > 9 ? 30 : 0);
    std::snprintf(date, sizeof date, "2024-03-01 %02d:%02d:00", 10 + at / 60, at % 60);
    even_text += std::string(date) + ",a," + std::to_string(k) + "\n";
  }
  const SeriesData even = load_series(series_config(write(dir / "even.csv", even_text), {}));
  EXPECT_TRUE(even.series[0].regular);
  for (const std::string& note : even.notes)
    EXPECT_EQ(note.find("not a whole number"), std::string::npos) << note;
}

// Dates with fractions of a second (a sensor sampled every 250 ms, as pandas writes them): each
// series ordered and stepped in microseconds, gaps named in milliseconds, the forecasts past the
// end dated to the millisecond, the calendar from the whole seconds; the calendar's own steps
// (business days, months, holidays) are refused.
TEST(Series, DatesWithFractionsOfASecondKeepThem) {
  const fs::path dir = test::temp_dir("subsecond");
  std::string text = "date,city,value\n";
  for (const char* city : {"b", "a"})
    for (int k = 23; k >= 0; --k) {  // newest first; b misses 10:00:03.000 and .250
      if (city[0] == 'b' && (k == 12 || k == 13)) continue;
      char date[40];
      std::snprintf(date, sizeof date, "2024-03-01 10:00:%02d.%03d", k / 4, k % 4 * 250);
      text += std::string(date) + "," + city + "," + std::to_string(k) + "\n";
    }
  const std::string path = write(dir / "ms.csv", text);
  const SeriesData d = load_series(series_config(path, {"data.calendar=[hour]"}));
  EXPECT_TRUE(d.subsecond_times);
  ASSERT_EQ(d.series.size(), 2u);
  EXPECT_EQ(d.series[0].name, "a");
  EXPECT_EQ(d.series[0].step, 250000);
  EXPECT_TRUE(d.series[1].regular);
  std::vector<double> a;
  for (int64_t r = d.series[0].begin; r < d.series[0].end; ++r) a.push_back(raw(d, r));
  EXPECT_EQ(a.size(), 24u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(d.times[1] - d.times[0], 250000);
  EXPECT_EQ(d.dates[1], "2024-03-01 10:00:00.250");
  EXPECT_EQ(d.usual_step(), "250 milliseconds");
  const auto ahead = d.time_ahead(d.rows - 1, 3);
  ASSERT_TRUE(ahead.has_value());
  EXPECT_EQ(d.time_text(*ahead, ""), "2024-03-01T10:00:06.500");
  EXPECT_EQ(d.time_text(*ahead + 1, ""), "2024-03-01T10:00:06.500001");
  bool gap_noted = false;
  for (const std::string& note : d.notes)
    gap_noted = gap_noted || note.find(
                                 "1 gap in the dates longer than the usual step (the largest "
                                 "750 milliseconds, series 'b' after 2024-03-01 "
                                 "10:00:02.750)") != std::string::npos;
  EXPECT_TRUE(gap_noted) << ::testing::PrintToString(d.notes);
  EXPECT_EQ(error_of([&] { load_series(series_config(path, {"data.frequency=B"})); }),
            path +
                ": data.frequency B needs dates to the whole second; column 'date' holds "
                "fractions of a second ('2024-03-01 10:00:05.750' at " +
                path + ":2)");
  const std::string holidays = write(dir / "holidays.txt", "2024-03-04\n");
  EXPECT_NE(error_of([&] {
              load_series(series_config(path, {"data.holidays=" + holidays}));
            }).find(": data.holidays needs dates to the whole second"),
            std::string::npos);
  // A fixed frequency counts its steps in the same units, and may be finer than a second.
  const SeriesData quarter = load_series(series_config(path, {"data.frequency=250ms"}));
  EXPECT_EQ(quarter.series[0].step, 250000);
  EXPECT_TRUE(quarter.series[1].regular);
  EXPECT_EQ(load_series(series_config(path, {"data.frequency=250000us"})).series[0].step, 250000);
  EXPECT_NE(error_of([&] { load_series(series_config(path, {"data.frequency=100ms"})); })
                .find("is 250 milliseconds after the row before, not a whole number of "
                      "data.frequency 100ms"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_series(series_config(path, {"data.frequency=s"})); })
                .find("is 250 milliseconds after the row before, not a whole number of "
                      "data.frequency s"),
            std::string::npos);
  // A logger's comma before the fraction (quoted in a CSV): read alike, written with ISO's dot.
  const std::string logged =
      dated_csv(dir / "logged.csv", {"\"2024-03-01 10:00:00,000\"", "\"2024-03-01 10:00:00,250\"",
                                     "\"2024-03-01 10:00:00,500\"", "\"2024-03-01 10:00:00,750\""});
  const SeriesData l =
      load_series(Config::parse("data: {path: " + logged +
                                    ", date_column: date, features: [value], targets: [value], "
                                    "lookback: 2, split: {train: 1, val: 0}}\n",
                                "l.yaml"));
  EXPECT_EQ(l.usual_step(), "250 milliseconds");
  EXPECT_EQ(l.dates[1], "2024-03-01T10:00:00.250");
  // Two times a microsecond apart are two rows; the same time twice is a duplicate.
  const std::string close =
      dated_csv(dir / "close.csv", {"2024-03-01T10:00:00.000001", "2024-03-01T10:00:00.000002",
                                    "2024-03-01T10:00:00.000003", "2024-03-01T10:00:00.000004",
                                    "2024-03-01T10:00:00.000005", "2024-03-01T10:00:00.000006"});
  const SeriesData c =
      load_series(Config::parse("data: {path: " + close +
                                    ", date_column: date, features: [value], targets: [value], "
                                    "lookback: 2, split: {train: 1, val: 0}}\n",
                                "c.yaml"));
  EXPECT_EQ(c.usual_step(), "1 microsecond");
  const std::string twice =
      dated_csv(dir / "twice.csv", {"2024-03-01T10:00:00.5", "2024-03-01T10:00:00.500",
                                    "2024-03-01"
                                    "T10:00:01"});
  EXPECT_NE(error_of([&] {
              load_series(Config::parse(
                  "data: {path: " + twice +
                      ", date_column: date, features: [value], targets: [value], lookback: 1}\n",
                  "t.yaml"));
            }).find("twice.csv:3: date '2024-03-01T10:00:00.500' appears again"),
            std::string::npos);
  // Nanoseconds (pandas writes them): the times differ past the microsecond kept, said so.
  const std::string nanos = dated_csv(
      dir / "nanos.csv", {"2024-03-01 10:00:00.000000000", "2024-03-01 10:00:00.000000100",
                          "2024-03-01 10:00:00.000000200"});
  EXPECT_EQ(error_of([&] {
              load_series(Config::parse(
                  "data: {path: " + nanos +
                      ", date_column: date, features: [value], targets: [value], lookback: 1}\n",
                  "n.yaml"));
            }),
            nanos +
                ":3: date '2024-03-01 10:00:00.000000100' appears again (as '2024-03-01 "
                "10:00:00.000000000' at " +
                nanos +
                ":2): times are kept to the microsecond, and these differ only past it; round "
                "them to microseconds");
}

// A date column of numbers (elapsed seconds, sampled every half second here) orders each series'
// rows in its own units: gaps are named in them, forecasts past the end dated by the usual step,
// and the calendar, which needs dates, is an error. A .npy array's column works the same.
TEST(Series, NumericTimesOrderRowsInTheirOwnUnits) {
  const fs::path dir = test::temp_dir("numeric_times");
  const std::string path = write(dir / "t.csv",
                                 "t,city,value\n1.5,a,3\n0,a,0\n0.5,a,1\n1,a,2\n3,a,6\n"
                                 "3.5,a,7\n4,a,8\n4.5,a,9\n5,a,10\n5.5,a,11\n6,a,12\n");
  auto config = [&](const std::string& file, std::vector<std::string> overrides) {
    overrides.push_back("data.date_column=t");
    overrides.push_back("data.lookback=2");
    overrides.push_back("data.split.train=1");
    overrides.push_back("data.split.val=0");
    return series_config(file, overrides);
  };
  const SeriesData d = load_series(config(path, {}));
  EXPECT_TRUE(d.numeric_times);
  std::vector<double> values;
  for (int64_t r = 0; r < d.rows; ++r) values.push_back(raw(d, r));
  EXPECT_EQ(values, (std::vector<double>{0, 1, 2, 3, 6, 7, 8, 9, 10, 11, 12}));
  // So do a ';' file's times with decimal commas, its first one "1,5" too.
  std::string semicolons = io::read_file(path);
  std::replace(semicolons.begin(), semicolons.end(), ',', ';');
  std::replace(semicolons.begin(), semicolons.end(), '.', ',');
  const SeriesData commas = load_series(config(write(dir / "semi.csv", semicolons), {}));
  EXPECT_TRUE(commas.numeric_times);
  std::vector<double> same;
  for (int64_t r = 0; r < commas.rows; ++r) same.push_back(raw(commas, r));
  EXPECT_EQ(same, values);
  ASSERT_EQ(d.notes.size(), 2u);
  EXPECT_EQ(d.notes[0], path +
                            ": column 't' holds numbers, not dates, times in its own units "
                            "(ISO dates give a calendar)");
  EXPECT_EQ(d.notes[1], path +
                            ": 1 gap in the times longer than the usual step (the largest 1.5 in "
                            "column 't', series 'a' after 1.5)");
  EXPECT_TRUE(d.series[0].regular);
  const auto ahead = d.time_ahead(d.rows - 1, 3);
  ASSERT_TRUE(ahead.has_value());
  EXPECT_EQ(d.time_text(*ahead, ""), "7.5");
  EXPECT_EQ(d.dates[0], "0");
  EXPECT_EQ(error_of([&] { load_series(config(path, {"data.calendar=[hour]"})); }),
            path + ": data.calendar needs dates; column 't' holds numbers, not dates");
  EXPECT_EQ(error_of([&] { load_series(config(path, {"data.frequency=H"})); }),
            path + ": data.frequency H needs dates; column 't' holds numbers, not dates");
  const std::string bad = write(dir / "bad.csv", "t,city,value\n0,a,0\n2020-01-01,a,1\n");
  EXPECT_EQ(error_of([&] { load_series(config(bad, {})); }),
            bad + ":3: column 't': '2020-01-01' is not a number");
  const std::string nanos =
      write(dir / "ns.csv", "t,city,value\n1700000000000000000,a,0\n1700000001000000000,a,1\n");
  EXPECT_EQ(error_of([&] { load_series(config(nanos, {})); }),
            nanos +
                ":2: column 't': 1.7e+18 is too large a time (at most 9e12 in magnitude): a Unix "
                "time in microseconds or nanoseconds? Write it in seconds, or as dates "
                "(2023-11-14T22:13:20Z)");
  // Unix milliseconds a millisecond apart: the times read exactly (in millionths they pass
  // 2^53), the steps are even, and the dates ahead are written as the file writes its times.
  std::string millis = "t,city,value\n";
  for (int k = 0; k < 40; ++k)
    millis += std::to_string(int64_t{1700000000000} + k) + ",a," + std::to_string(k) + "\n";
  const SeriesData ms = load_series(config(write(dir / "ms.csv", millis), {}));
  EXPECT_EQ(ms.notes.size(), 1u);  // numbers, not dates; no uneven steps
  EXPECT_TRUE(ms.series[0].regular);
  EXPECT_EQ(ms.dates.back(), "1700000000039");
  EXPECT_EQ(ms.time_text(*ms.time_ahead(ms.rows - 1, 1), ""), "1700000000040");
  const std::string round = write(dir / "round.csv",
                                  "t,city,value\n1699999999998,a,0\n"
                                  "1699999999999,a,1\n1700000000000,a,2\n");
  const SeriesData r = load_series(config(round, {}));
  EXPECT_EQ(r.time_text(*r.time_ahead(r.rows - 2, 1), ""), "1700000000000");
  EXPECT_EQ(r.time_text(*r.time_ahead(r.rows - 1, 2), ""), "1700000000002");
  // Times written with one decimal ("860.0"): the times ahead are written so too.
  std::string tenths = "t,city,value\n";
  for (int k = 0; k < 10; ++k)
    tenths += std::to_string(860 + k) + ".0,a," + std::to_string(k) + "\n";
  const SeriesData tn = load_series(config(write(dir / "tenths.csv", tenths), {}));
  EXPECT_EQ(tn.time_text(*tn.time_ahead(tn.rows - 1, 1), ""), "870.0");
  EXPECT_EQ(d.time_text(*d.time_ahead(d.rows - 1, 2), ""), "7");  // "0", "1.5", ...: as needed
  // Hours as fractions of a day (a spreadsheet's serial dates): 1/24 reads as 41666 or 41667
  // millionths from row to row, and the steps are still even; 26 hours ahead is a whole day.
  std::string hours = "t,city,value\n";
  for (int k = 0; k < 48; ++k) {
    char cell[40];
    std::snprintf(cell, sizeof cell, "%.17g", 44197.0 + k / 24.0);
    hours += std::string(cell) + ",a," + std::to_string(k) + "\n";
  }
  const SeriesData h = load_series(config(write(dir / "hours.csv", hours), {}));
  EXPECT_EQ(h.notes.size(), 1u) << h.notes.back();  // numbers, not dates; no uneven steps
  EXPECT_TRUE(h.series[0].regular);
  EXPECT_EQ(h.time_text(*h.time_ahead(h.rows - 1, 1), ""), "44199");
  EXPECT_EQ(h.time_text(*h.time_ahead(h.rows - 1, 13), ""), "44199.5");
  // Times a few millionths apart are exact: a step of 3 where the usual one is 2 is off the grid.
  std::string micro = "t,city,value\n";
  for (int k = 0; k < 10; ++k)
    micro += "0.0000" + std::to_string(10 + 2 * k + (k == 9)) + ",a," + std::to_string(k) + "\n";
  EXPECT_FALSE(load_series(config(write(dir / "micro.csv", micro), {})).series[0].regular);
  const std::string dated = write(dir / "dated.csv", "t,city,value\n2020-01-01,a,0\n7,a,1\n");
  EXPECT_EQ(error_of([&] { load_series(config(dated, {})); }),
            dated +
                ":3: column 't': '7' is not a date written as the column's first, "
                "'2020-01-01'");

  const std::string npy = (dir / "t.npy").string();
  const std::vector<double> array = {1.5, 3, 0, 0, 0.5, 1, 1, 2};  // (time, value) rows
  io::write_npy(npy, DType::f64, {4, 2}, array.data());
  const SeriesData n = load_series(
      Config::parse("data: {path: " + npy +
                        ", date_column: '0', features: ['1'], targets: ['1'], lookback: 2, "
                        "split: {train: 1, val: 0}, normalize: none}\n",
                    "n.yaml"));
  std::vector<double> from_npy;
  for (int64_t r = 0; r < n.rows; ++r) from_npy.push_back(raw(n, r));
  EXPECT_EQ(from_npy, (std::vector<double>{0, 1, 2, 3}));
  EXPECT_EQ(n.dates, (std::vector<std::string>{"0", "0.5", "1", "1.5"}));
}

TEST(Transforms, ApplyAndInvertRoundTrip) {
  for (Transform t :
       {Transform::log, Transform::diff, Transform::log_return, Transform::pct_change}) {
    for (double base : {0.5, 3.0, 1234.5})
      for (double x : {0.25, 2.0, 1500.0}) {
        const double y = apply_transform(t, x, base);
        EXPECT_NEAR(invert_transform(t, y, base), x, 1e-12 * x) << transform_name(t);
      }
    EXPECT_EQ(parse_transform(transform_name(t)), t);
  }
  EXPECT_TRUE(std::isnan(apply_transform(Transform::log, 0.0, 1.0)));
  EXPECT_TRUE(std::isnan(apply_transform(Transform::log_return, 2.0, -1.0)));
  EXPECT_NE(error_of([] { parse_transform("sqrt"); }).find("sqrt"), std::string::npos);
}

// A price series with log returns as features and the target: the source holds returns, the
// first row is dropped, the target spans the horizon, and predictions invert to prices.
TEST(Transforms, TargetsSpanTheHorizonAndInvertToOwnUnits) {
  const fs::path dir = test::temp_dir("transform");
  std::string text = "date,price,volume\n";
  std::vector<double> price;
  for (int day = 0; day < 60; ++day) {
    price.push_back(100 * std::exp(0.01 * day + 0.05 * std::sin(day)));
    char row[96];
    std::snprintf(row, sizeof row, "%s,%.17g,%d\n",
                  io::format_datetime(int64_t{1577836800} + day * int64_t{86400}).c_str(),
                  price.back(), 1000 + day);
    text += row;
  }
  const std::string path = write(dir / "p.csv", text);
  const Config c = Config::parse(
      "data: {path: " + path +
          ", date_column: date, features: [price, volume], targets: [price], lookback: 5, "
          "horizon: 3, horizon_mode: last, transform: {price: log_return, volume: log}, split: "
          "{train: 0.6, val: "
          "0.2}}\n",
      "t.yaml");
  const SeriesData d = load_series(c);
  EXPECT_EQ(d.rows, 59);  // the first day has no return
  EXPECT_NEAR(d.source.at(0, d.feature_cols[0]), std::log(price[1] / price[0]), 1e-12);
  EXPECT_NEAR(d.source.at(0, d.feature_cols[1]), std::log(1001.0), 1e-12);
  for (int64_t s : d.split.val) {
    // Source row r is day r + 1. The target: the log return from the window's last day to the
    // target day, 3 days later.
    const int64_t last = d.last_row(s) + 1, target = d.target_row(s) + 1;
    float y = 0;
    d.copy_target(s, &y);
    const double normalised =
        (std::log(price[target] / price[last]) - d.target_norm.shift[0]) / d.target_norm.scale[0];
    EXPECT_NEAR(y, normalised, 1e-5);
    EXPECT_NEAR(d.prediction(s, 0, 0, y), price[target], 1e-4 * price[target]);
    EXPECT_NEAR(d.actual(s, 0, 0), price[target], 1e-9 * price[target]);
  }
  // A price that is not positive has no log return: the error names file, line and column.
  const std::string bad = write(dir / "bad.csv",
                                "date,price,volume\n2020-01-01,5,1\n"
                                "2020-01-02,-1,1\n2020-01-03,4,1\n");
  const std::string e = error_of([&] {
    load_series(Config::parse("data: {path: " + bad +
                                  ", date_column: date, features: [price], targets: [price], "
                                  "lookback: 1, transform: {price: log_return}}\n",
                              "b.yaml"));
  });
  EXPECT_NE(e.find("bad.csv:3: column 'price'"), std::string::npos) << e;
  EXPECT_NE(e.find("log_return"), std::string::npos) << e;
  EXPECT_NE(error_of([&] {
              load_series(Config::parse("data: {path: " + path +
                                            ", features: [price], targets: [price], "
                                            "transform: {price: sqrt}}\n",
                                        "b.yaml"));
            }).find("data.transform: price"),
            std::string::npos);
}

// data.label volatility: high when the realised volatility of the next `horizon` log returns is
// above the training windows' median (between the two middle values for an even count). Calm
// days alternate with stormy stretches; 200 and 201 days give both parities.
TEST(Series, VolatilityLabelsSplitAtTheTrainingMedian) {
  const fs::path dir = test::temp_dir("volatility");
  for (const int days : {200, 201}) {
    SCOPED_TRACE(days);
    std::string text = "date,close\n";
    double price = 100;
    std::vector<double> r;
    for (int day = 0; day < days; ++day) {
      const double ret =
          ((day / 10) % 2 ? 0.03 : 0.002) * (day % 2 ? 1 : -1) * (1 + 0.3 * std::sin(day));
      price *= std::exp(ret);
      r.push_back(ret);
      char row[64];
      std::snprintf(row, sizeof row, "%s,%.17g\n",
                    io::format_datetime(int64_t{1577836800} + day * int64_t{86400}).c_str(), price);
      text += row;
    }
    const SeriesData d = load_series(Config::parse(
        "data: {path: " + write(dir / "v.csv", text) +
            ", task: classify, label: volatility, label_column: close, date_column: date, "
            "features: [close], transform: {close: log_return}, lookback: 5, horizon: 3}\n",
        "v.yaml"));
    EXPECT_EQ(d.class_names, (std::vector<std::string>{"low", "high"}));
    std::vector<double> volatilities;
    int high = 0;
    for (int64_t s : d.split.train) {
      // Source row k is day k + 1; the target's returns are days t - 2 .. t.
      const int64_t t = d.target_row(s) + 1;
      double sq = 0;
      for (int64_t day = t - 2; day <= t; ++day) sq += r[day] * r[day];
      volatilities.push_back(std::sqrt(sq));
      high += d.classes[d.target_row(s)];
    }
    std::sort(volatilities.begin(), volatilities.end());
    const size_t n = volatilities.size(), mid = n / 2;
    ASSERT_GT(n, 100u);
    const double median =
        n % 2 ? volatilities[mid] : 0.5 * (volatilities[mid - 1] + volatilities[mid]);
    EXPECT_NEAR(d.label_threshold, median, 1e-12);
    EXPECT_EQ(high, static_cast<int>(n / 2));  // no ties here: the upper half, less an odd median
    for (int64_t s : d.split.train) {
      const int64_t t = d.target_row(s) + 1;
      double sq = 0;
      for (int64_t day = t - 2; day <= t; ++day) sq += r[day] * r[day];
      if (std::fabs(std::sqrt(sq) - d.label_threshold) < 1e-12) continue;  // an odd median
      EXPECT_EQ(d.classes[d.target_row(s)], std::sqrt(sq) > d.label_threshold ? 1 : 0) << s;
    }
  }
}

TEST(Series, InferenceWindowsNeedNoTargets) {
  const fs::path dir = test::temp_dir("inference");
  std::string text = "date,city,value\n";  // no target column; a's 10 days, b's 3 (too short)
  for (int day = 0; day < 10; ++day) {
    const std::string date = io::format_datetime(int64_t{1577836800} + day * int64_t{86400});
    text += date + ",a," + std::to_string(day) + "\n";
    if (day < 3) text += date + ",b," + std::to_string(day) + "\n";
  }
  const Config c = Config::parse("data: {path: " + write(dir / "new.csv", text) +
                                     ", date_column: date, series_column: city, features: "
                                     "[value], targets: [temperature], lookback: 4}\n",
                                 "i.yaml");
  SeriesData stored;
  stored.feature_norm.kind = stored.target_norm.kind = "none";
  stored.feature_norm.shift = stored.target_norm.shift = {0.0};
  stored.feature_norm.scale = stored.target_norm.scale = {1.0};
  const SeriesData d = load_series(c, &stored, WindowSet::every_window);
  EXPECT_FALSE(d.has_targets);
  ASSERT_EQ(d.split.test.size(), 7u);  // every complete window of a: days 0-3 ... 6-9
  EXPECT_EQ(d.last_row(d.split.test.back()), d.series[0].end - 1);  // up to the last row
  EXPECT_TRUE(d.split.train.empty() && d.split.val.empty());
  ASSERT_EQ(d.notes.size(), 1u);
  EXPECT_NE(d.notes[0].find("is shorter than one window (4 rows: data.lookback 4) and gives "
                            "none: 'b' (3 rows)"),
            std::string::npos)
      << d.notes[0];
  // Evaluation needs the targets.
  EXPECT_NE(error_of([&] {
              load_series(c, &stored, WindowSet::with_targets);
            }).find("no column 'temperature'"),
            std::string::npos);
}

// data.targets on a task whose truth is not a target (an autoencoder's, a classifier's) is ignored
// (warned at start-up): a column the file lacks is no error, and it takes no column out of the
// default features.
TEST(Series, TargetsOfAnAutoencoderAreIgnored) {
  const fs::path dir = test::temp_dir("mae_targets");
  const std::string path = two_series_csv(dir, 40, 24);
  const SeriesData d = load_series(series_config(path, {"data.task=mae", "data.targets=[zzz]"}));
  EXPECT_EQ(d.feature_names, (std::vector<std::string>{"value"}));
  EXPECT_TRUE(d.target_names.empty());
}

}  // namespace
}  // namespace seqforge::series_test
