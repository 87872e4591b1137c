// The everyday path end to end: predict and eval on new files, several series, runs that never
// mix, no validation on purpose, non-finite training, and evaluation that reproduces training's
// numbers exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/file_util.hpp"
#include "seqforge/backend/backend.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/dates.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"
#include "train/run.hpp"
#include "train/sampling.hpp"

namespace seqforge::inference_test {
namespace {

namespace fs = std::filesystem;
using test::error_of;

// Hourly rows of a sine `signal`, a slow `other` and the target `y` (the signal 3 steps ahead);
// `series` > 1 writes that many phase-shifted series, named s0, s1, ...
std::string write_hourly(const fs::path& path, int rows, bool with_target, int series = 1) {
  std::ofstream f(path);
  f << "when," << (series > 1 ? "site," : "") << "signal,other" << (with_target ? ",y" : "")
    << "\n";
  for (int k = 0; k < series; ++k)
    for (int i = 0; i < rows; ++i) {
      const double phase = 0.3 * i + k;
      f << io::format_datetime(int64_t{1577836800} + i * int64_t{3600}, false) << ","
        << (series > 1 ? "s" + std::to_string(k) + "," : "") << std::sin(phase) << ","
        << std::cos(i * 0.05);
      if (with_target) f << "," << std::sin(phase + 0.9);
      f << "\n";
    }
  return path.string();
}

std::string yaml(const std::string& data, const fs::path& run, const std::string& extra = "") {
  return "data:\n  path: " + data +
         "\n  date_column: when\n  features: [signal, other]\n  targets: [y]\n  lookback: 8\n" +
         extra + "model: {hidden: 16}\noptim: {lr: 0.01}\ntrain: {epochs: 3, batch_size: 16, " +
         "save: last, run_dir: " + run.string() + "}\n";
}

// Two of predict's tables equal column by column, an empty cell (NaN) equal to an empty cell.
void expect_same_predictions(const Predictions& a, const Predictions& b) {
  ASSERT_EQ(a.columns.size(), b.columns.size());
  for (size_t c = 0; c < a.columns.size(); ++c) {
    EXPECT_EQ(a.columns[c].text, b.columns[c].text) << a.columns[c].name;
    const std::vector<double>& x = a.columns[c].values;
    const std::vector<double>& y = b.columns[c].values;
    ASSERT_EQ(x.size(), y.size()) << a.columns[c].name;
    for (size_t i = 0; i < x.size(); ++i)
      EXPECT_TRUE(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))
          << a.columns[c].name << " row " << i << ": " << x[i] << " vs " << y[i];
  }
}

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::ifstream f(path);
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(f, line);) {
    rows.emplace_back();
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) rows.back().push_back(cell);
    if (!line.empty() && line.back() == ',') rows.back().emplace_back();
  }
  return rows;
}

std::vector<nlohmann::json> metrics_of(const fs::path& run) {
  std::ifstream f(run / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(f, line);)  // per-epoch lines; the test split's left out
    if (auto j = nlohmann::json::parse(line); j.contains("epoch")) out.push_back(std::move(j));
  return out;
}

// A new file with gaps, from a run trained on a whole one: predict and eval --data refuse it
// naming the cell and --missing, and with --missing ffill predict as on the file filled by hand.
// generate's draw: temperature 0 takes the first of the likeliest; top_k keeps the logits equal
// to the k-th too (HF's top_k); top_p keeps the fewest likeliest whose mass reaches it; the
// draws follow softmax(logits / temperature) over what is kept (40000 draws, within 5 sigma).
TEST(Generate, SamplingFollowsTheKeptSoftmax) {
  const std::vector<float> row = {1.0f, 3.0f, 3.0f, 2.0f, 0.5f};
  Rng rng(5);
  EXPECT_EQ(sample_next(row, 0.0, 0, rng), 1);
  EXPECT_EQ(sample_next(row, 0.0, 4, rng, 0.3), 1);
  auto frequencies = [&](double temperature, int64_t top_k, double top_p) {
    std::vector<double> n(row.size());
    for (int draw = 0; draw < 40000; ++draw) n[sample_next(row, temperature, top_k, rng, top_p)]++;
    return n;
  };
  auto expect = [&](const std::vector<double>& n, std::vector<int> kept, double temperature) {
    double total = 0;
    for (int i : kept) total += std::exp(row[i] / temperature);
    for (size_t i = 0; i < row.size(); ++i) {
      const bool in = std::find(kept.begin(), kept.end(), static_cast<int>(i)) != kept.end();
      const double p = in ? std::exp(row[i] / temperature) / total : 0.0;
      EXPECT_NEAR(n[i] / 40000, p, 5 * std::sqrt(p * (1 - p) / 40000) + 1e-12)
          << "token " << i << ", temperature " << temperature;
    }
  };
  expect(frequencies(1.0, 0, 1.0), {0, 1, 2, 3, 4}, 1.0);
  expect(frequencies(0.5, 0, 1.0), {0, 1, 2, 3, 4}, 0.5);
  expect(frequencies(1.0, 1, 1.0), {1, 2}, 1.0);  // tokens 1 and 2 tie for the top
  expect(frequencies(1.0, 2, 1.0), {1, 2}, 1.0);
  expect(frequencies(2.0, 3, 1.0), {1, 2, 3}, 2.0);
  // Probabilities 0.386, 0.386, 0.142, 0.052, 0.032: 0.5 needs two, 0.8 three, 0.3 one.
  expect(frequencies(1.0, 0, 0.5), {1, 2}, 1.0);
  expect(frequencies(1.0, 0, 0.8), {1, 2, 3}, 1.0);
  expect(frequencies(1.0, 0, 0.3), {1}, 1.0);
  for (const float bad : {NAN, INFINITY})
    EXPECT_NE(error_of([&] {
                sample_next({1.0f, bad, 0.0f}, 1.0, 0, rng);
              }).find("generate: the model's logit for token 1 is "),
              std::string::npos);
}

TEST(Predict, MissingCellsOfANewFileFilledOnRequest) {
  const fs::path dir = test::temp_dir("missing");
  std::ostringstream log;
  train(Config::parse(yaml(write_hourly(dir / "train.csv", 200, true), dir / "run"), "p.yaml"),
        log);
  const std::string whole = io::read_file(write_hourly(dir / "whole.csv", 40, true));
  std::vector<std::string> lines;
  for (size_t at = 0, end; (end = whole.find('\n', at)) != std::string::npos; at = end + 1)
    lines.push_back(whole.substr(at, end - at));
  // Line 21's signal empty, line 31's other NA; filled by hand with the lines before.
  auto cells = [](const std::string& line) {
    std::vector<std::string> c;
    std::stringstream ss(line);
    for (std::string cell; std::getline(ss, cell, ',');) c.push_back(cell);
    return c;
  };
  auto join = [](const std::vector<std::string>& c) {
    return c[0] + "," + c[1] + "," + c[2] + "," + c[3];
  };
  // codes.csv writes the gaps as codes the run was not trained with: -999 and "n/v".
  std::string gaps, filled, codes;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string> c = cells(lines[i]), f = c, k = c;
    if (i == 20) c[1] = "", f[1] = cells(lines[19])[1], k[1] = "-999";
    if (i == 30) c[2] = "NA", f[2] = cells(lines[29])[2], k[2] = "n/v";
    gaps += join(c) + "\n";
    filled += join(f) + "\n";
    codes += join(k) + "\n";
  }
  const fs::path gaps_csv = dir / "gaps.csv", filled_csv = dir / "filled.csv",
                 codes_csv = dir / "codes.csv";
  std::ofstream(gaps_csv) << gaps;
  std::ofstream(filled_csv) << filled;
  std::ofstream(codes_csv) << codes;
  const std::string run = (dir / "run").string();
  std::ostringstream out;
  EXPECT_NE(error_of([&] {
              predict(run, {gaps_csv.string(), "-", false}, out);
            })
                .find("gaps.csv:21: column 'signal': empty cell is not a number (--missing ffill "
                      "or interpolate fills the file's missing cells)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { evaluate(run, "test", gaps_csv.string()); }).find("--missing ffill"),
            std::string::npos);
  const Predictions by_hand = predictions(run, filled_csv.string(), false);
  const Predictions on_request = predictions(run, gaps_csv.string(), false, {"ffill", {}, ""});
  const Predictions coded =
      predictions(run, codes_csv.string(), false, {"ffill", {"-999.0", "n/v"}, ""});
  expect_same_predictions(coded, on_request);
  // Without --missing the codes are missing cells the run does not fill: one line naming one.
  const std::string e = error_of([&] {
    predictions(run, codes_csv.string(), false, {"", {"-999", "n/v"}, ""});
  });
  EXPECT_NE(e.find("codes.csv:21: column 'signal': '-999' marks a missing value, not a number "
                   "(--missing ffill or interpolate fills"),
            std::string::npos)
      << e;
  expect_same_predictions(by_hand, on_request);
  EXPECT_NE(std::find(on_request.notes.begin(), on_request.notes.end(),
                      "data.missing ffill: 1 missing cells of 'signal' filled"),
            on_request.notes.end());
  EXPECT_EQ(
      evaluate(run, "test", gaps_csv.string(), nullptr, {"interpolate", {}, ""}).at("samples"),
      evaluate(run, "test", filled_csv.string(), nullptr).at("samples"));
  EXPECT_NE(error_of([&] {
              predictions(run, gaps_csv.string(), false, {"mask", {}, ""});
            }).find("--missing: expected error, ffill or interpolate, got 'mask'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              evaluate(run, "test", "", nullptr, {"ffill", {}, ""});
            }).find("--missing reads the missing cells of a file given with --data"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              evaluate(run, "test", "", nullptr, {"", {"-999"}, ""});
            }).find("--missing-values reads the missing cells of a file given with --data"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              predictions(run, codes_csv.string(), false, {"ffill", {""}, ""});
            }).find("--missing-values: an empty entry"),
            std::string::npos);
  // A file whose dates write the day first, none past the 12th, is read with --date-order.
  std::string day_first;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<std::string> c = cells(lines[i]);
    if (i > 0)
      c[0] = c[0].substr(8, 2) + "/" + c[0].substr(5, 2) + "/" + c[0].substr(0, 4) + " " +
             c[0].substr(11);
    day_first += join(c) + "\n";
  }
  const fs::path day_first_csv = dir / "day_first.csv", whole_csv = dir / "whole.csv";
  std::ofstream(day_first_csv) << day_first;
  EXPECT_NE(
      error_of([&] { predictions(run, day_first_csv.string(), false); })
          .find("no date of the column has a field past 12 to tell: set data.date_order (eval "
                "and predict: --date-order) to dmy (day first) or mdy (month first)"),
      std::string::npos);
  const Predictions read = predictions(run, day_first_csv.string(), false, {"", {}, "dmy"}),
                    iso = predictions(run, whole_csv.string(), false);
  expect_same_predictions(read, iso);
  EXPECT_EQ(evaluate(run, "test", day_first_csv.string(), nullptr, {"", {}, "dmy"}),
            evaluate(run, "test", whole_csv.string(), nullptr));
  EXPECT_NE(error_of([&] {
              predictions(run, day_first_csv.string(), false, {"", {}, "ymd"});
            }).find("--date-order: expected dmy (day first) or mdy (month first), got 'ymd'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              evaluate(run, "test", "", nullptr, {"", {}, "dmy"});
            }).find("--date-order reads the dates of a file given with --data"),
            std::string::npos);
  // A run that masks its missing cells reads them as masked: --missing would change its inputs.
  train(Config::parse(yaml(dir / "train.csv", dir / "masked", "  missing: mask\n"), "m.yaml"), log);
  EXPECT_NE(error_of([&] {
              predictions((dir / "masked").string(), gaps_csv.string(), false, {"ffill", {}, ""});
            }).find("masks missing cells (data.missing: mask)"),
            std::string::npos);
  EXPECT_GT(predictions((dir / "masked").string(), gaps_csv.string(), false).windows, 0);
}

// --last reads each series' last window alone: an empty cell before it is no error, and the
// forecasts equal those of the file filled by hand; one in it is named (the row before it too,
// where a transform differences against that row).
TEST(Predict, LastReadsTheLastWindowsAlone) {
  const fs::path dir = test::temp_dir("last_gaps");
  std::ostringstream log;
  const std::string data = write_hourly(dir / "train.csv", 120, true, 2);
  train(
      Config::parse(yaml(data, dir / "run", "  series_column: site\n  transform: {signal: diff}\n"),
                    "l.yaml"),
      log);
  const std::string run = (dir / "run").string();
  // 2 series of 40 rows: file lines 2-41 are s0's, 42-81 s1's; each window is 8 rows (the
  // difference reads one more).
  const std::string whole = io::read_file(write_hourly(dir / "new.csv", 40, true, 2));
  std::vector<std::string> lines;
  for (size_t at = 0, end; (end = whole.find('\n', at)) != std::string::npos; at = end + 1)
    lines.push_back(whole.substr(at, end - at));
  // Line `line`'s column `col` (0 when, 1 site, 2 signal, 3 other) emptied, or given `value`.
  auto with_cell = [&](const std::string& name, size_t line, int col, const std::string& value) {
    std::string text;
    for (size_t i = 0; i < lines.size(); ++i) {
      std::string l = lines[i];
      if (i + 1 == line) {
        size_t a = 0;
        for (int c = 0; c < col; ++c) a = l.find(',', a) + 1;
        l = l.substr(0, a) + value + l.substr(l.find(',', a));
      }
      text += l + "\n";
    }
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  auto cell = [&](size_t line, int col) {
    std::stringstream ss(lines[line - 1]);
    std::string c;
    for (int k = 0; k <= col; ++k) std::getline(ss, c, ',');
    return c;
  };
  const Predictions whole_last = predictions(run, (dir / "new.csv").string(), true);
  ASSERT_EQ(whole_last.windows, 2);
  // s0's line 11 and s1's line 50: far before the last windows.
  const std::string early = with_cell("early.csv", 11, 2, "");
  const Predictions gaps = predictions(run, early, true);
  const Predictions by_hand = predictions(run, with_cell("by_hand.csv", 11, 2, cell(10, 2)), true);
  for (const Predictions* p : {&gaps, &by_hand}) {
    ASSERT_EQ(p->columns.size(), whole_last.columns.size());
    for (size_t c = 0; c < p->columns.size(); ++c) {
      EXPECT_EQ(p->columns[c].text, whole_last.columns[c].text);
      ASSERT_EQ(p->columns[c].values.size(), whole_last.columns[c].values.size());
      for (size_t i = 0; i < p->columns[c].values.size(); ++i) {
        const double a = p->columns[c].values[i], b = whole_last.columns[c].values[i];
        EXPECT_TRUE(a == b || (std::isnan(a) && std::isnan(b))) << p->columns[c].name;
      }
    }
  }
  // Every window still needs every cell.
  EXPECT_NE(error_of([&] {
              predictions(run, early, false);
            }).find("early.csv:11: column 'signal': empty cell is not a number"),
            std::string::npos);
  // s0's last window: lines 34-41, its first difference from line 33.
  EXPECT_NE(error_of([&] { predictions(run, with_cell("in.csv", 38, 3, ""), true); })
                .find("in.csv:38: column 'other': empty cell in the last window of series 's0' "
                      "(--last forecasts from its last 8 rows; --missing ffill or interpolate "
                      "fills the file's missing cells)"),
            std::string::npos);
  // A cell written "NA" is named as it is written, not as an empty one.
  EXPECT_NE(error_of([&] { predictions(run, with_cell("na.csv", 38, 3, "NA"), true); })
                .find("na.csv:38: column 'other': 'NA' (a missing value) in the last window of "
                      "series 's0'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { predictions(run, with_cell("before.csv", 73, 2, ""), true); })
                .find("before.csv:73: column 'signal': empty cell, which data.transform "
                      "differences the window's first row against, in the last window of series "
                      "'s1'"),
            std::string::npos);
  const Predictions filled =
      predictions(run, with_cell("filled.csv", 38, 3, ""), true, {"ffill", {}, ""});
  EXPECT_EQ(filled.windows, 2);
  // A series' first cell empty: nothing before it to fill forward from, and no matter to --last.
  EXPECT_EQ(predictions(run, with_cell("lead.csv", 2, 2, ""), true, {"ffill", {}, ""}).windows, 2);
}

// Series names that differ only in case or spaces ("s0" and "S0 ": one cell typed twice) are
// two series, said in a note.
TEST(Series, NamesAlikeAreNamed) {
  const fs::path dir = test::temp_dir("alike");
  std::string text = io::read_file(write_hourly(dir / "two.csv", 60, true, 2));
  for (size_t at = 0; (at = text.find(",s1,", at)) != std::string::npos;)
    text.replace(at, 4, ",S0 ,");
  std::ofstream(dir / "two.csv", std::ios::trunc) << text;
  std::ostringstream log;
  train(Config::parse(yaml((dir / "two.csv").string(), dir / "run", "  series_column: site\n"),
                      "a.yaml"),
        log);
  EXPECT_NE(log.str().find("series 'S0 ' and 's0' in column 'site' differ only in case, spaces "
                           "or how a number is written: each is a series of its own"),
            std::string::npos)
      << log.str();
}

// eval --split re-splits the run's own data: after the file changed (rows appended to a log,
// say) its splits are other rows, and eval says so rather than score them; --data still reads it.
TEST(Eval, SplitOfAChangedFileIsRefused) {
  const fs::path dir = test::temp_dir("changed");
  std::ostringstream log;
  const std::string data = write_hourly(dir / "train.csv", 120, true);
  const TrainSummary s = train(Config::parse(yaml(data, dir / "run"), "c.yaml"), log);
  const std::string run = (dir / "run").string();
  EXPECT_EQ(evaluate(run, "val").at("val_loss"), s.last.at("val_loss"));
  const std::string grown = io::read_file(write_hourly(dir / "grown.csv", 160, true));
  std::ofstream(data, std::ios::binary | std::ios::trunc) << grown;
  const std::string e = error_of([&] { evaluate(run, "val"); });
  EXPECT_NE(e.find(data + ": changed since " + run + " trained on it ("), std::string::npos) << e;
  EXPECT_NE(e.find("evaluate the new file with --data"), std::string::npos) << e;
  EXPECT_GT(evaluate(run, "test", data, nullptr).at("samples"), 0);
}

// A column of a new file far from its training values (another unit) is named in a note; the
// training file itself is not.
TEST(Predict, ValuesFarFromTrainingAreNamed) {
  const fs::path dir = test::temp_dir("far");
  std::ostringstream log;
  const std::string data = write_hourly(dir / "train.csv", 200, true);
  train(Config::parse(yaml(data, dir / "run"), "p.yaml"), log);
  const std::string run = (dir / "run").string();
  for (const std::string& note : predictions(run, data, false).notes)
    EXPECT_EQ(note.find("far outside"), std::string::npos) << note;
  std::string text = io::read_file(data), scaled = "when,signal,other,y\n";
  for (size_t at = text.find('\n') + 1, end; (end = text.find('\n', at)) != std::string::npos;
       at = end + 1) {
    std::stringstream row(text.substr(at, end - at));
    std::string when, signal, other, y;
    std::getline(row, when, ','), std::getline(row, signal, ','), std::getline(row, other, ',');
    std::getline(row, y, ',');
    scaled +=
        when + "," + signal + "," + std::to_string(std::stod(other) * 1000 + 5000) + "," + y + "\n";
  }
  std::ofstream(dir / "scaled.csv") << scaled;
  const Predictions p = predictions(run, (dir / "scaled.csv").string(), false);
  ASSERT_EQ(p.notes.size(), 1u);
  EXPECT_EQ(p.notes[0].find("column 'other' of " + (dir / "scaled.csv").string() + " averages "),
            0u)
      << p.notes[0];
  EXPECT_NE(p.notes[0].find(" standard deviations from its training values ("), std::string::npos);
  EXPECT_NE(p.notes[0].find("far outside what the model was trained on"), std::string::npos);
  // A file of rows a day apart, where the model trained on hourly ones.
  std::string daily = "when,signal,other,y\n";
  for (int i = 0; i < 40; ++i)
    daily += io::format_datetime(int64_t{1577836800} + i * int64_t{86400}, false) + "," +
             std::to_string(std::sin(0.3 * i)) + "," + std::to_string(std::cos(i * 0.05)) + ",\n";
  std::ofstream(dir / "daily.csv") << daily;
  const Predictions days = predictions(run, (dir / "daily.csv").string(), false);
  EXPECT_NE(std::find(days.notes.begin(), days.notes.end(),
                      (dir / "daily.csv").string() +
                          ": its rows are 1 day apart, the model's training data's 1 hour: the "
                          "model takes each row for one of its training steps"),
            days.notes.end());
}

TEST(Predict, EveryWindowOfANewFileWithoutTargets) {
  const fs::path dir = test::temp_dir("predict");
  std::ostringstream log;
  train(Config::parse(yaml(write_hourly(dir / "train.csv", 300, true), dir / "run"), "p.yaml"),
        log);
  // The same rows with and without the target column: the same predictions, one per complete
  // window (rows - lookback + 1), the last one past the file's end.
  const std::string with = write_hourly(dir / "with.csv", 50, true);
  const std::string without = write_hourly(dir / "without.csv", 50, false);
  std::ostringstream out;
  EXPECT_EQ(predict((dir / "run").string(), {with, (dir / "a.csv").string(), false}, out), 43);
  EXPECT_EQ(predict((dir / "run").string(), {without, (dir / "b.csv").string(), false}, out), 43);
  EXPECT_NE(out.str().find("windows/s"), std::string::npos);
  const auto a = read_csv((dir / "a.csv").string()), b = read_csv((dir / "b.csv").string());
  ASSERT_EQ(a.size(), 44u);
  ASSERT_EQ(b.size(), 44u);
  EXPECT_EQ(a[0], (std::vector<std::string>{"window_end", "forecast_for", "y", "y_actual"}));
  EXPECT_EQ(b[0], (std::vector<std::string>{"window_end", "forecast_for", "y"}));
  for (size_t i = 1; i < a.size(); ++i) {
    EXPECT_EQ(a[i][0], b[i][0]);
    EXPECT_EQ(a[i][2], b[i][2]);  // the same batches: the same f32, the same text
  }
  // Row 1: the first window ends at hour 7 and forecasts hour 8; its actual is y at hour 8.
  EXPECT_EQ(a[1][0], "2020-01-01T07:00:00");
  EXPECT_EQ(a[1][1], "2020-01-01T08:00:00");
  EXPECT_NEAR(std::stod(a[1][3]), std::sin(0.3 * 8 + 0.9), 1e-6);
  EXPECT_LT(std::fabs(std::stod(a[1][2]) - std::stod(a[1][3])), 0.5);  // it learned something
  // The last window ends at the last row; its forecast is for the hour after, with no actual.
  EXPECT_EQ(a.back()[0], "2020-01-03T01:00:00");
  EXPECT_EQ(a.back()[1], "2020-01-03T02:00:00");
  EXPECT_EQ(a.back()[3], "");
  // --last: only that forecast.
  EXPECT_EQ(predict((dir / "run").string(), {without, (dir / "c.csv").string(), true}, out), 1);
  const auto last = read_csv((dir / "c.csv").string());
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[1][0], b.back()[0]);
  EXPECT_EQ(last[1][1], b.back()[1]);
  // A batch of one rounds its f32 sums differently from a batch of 43: the last bits may differ.
  EXPECT_NEAR(std::stod(last[1][2]), std::stod(b.back()[2]), 1e-6);
  // Without dates the rows past the end are numbered on from the file's last data row (50), and
  // not where series follow one another in the file (a number would name another series' row).
  {
    const fs::path undated = dir / "undated.csv";
    std::ifstream in(without);
    std::ofstream u(undated);
    std::string line;
    std::getline(in, line);
    u << "signal,other\n";
    while (std::getline(in, line)) u << line.substr(line.find(',') + 1) << "\n";
  }
  // Also where a differenced target's first row is dropped: the rows keep the file's order.
  for (const char* transform : {"{}", "{other: diff}"}) {
    SCOPED_TRACE(transform);
    const fs::path run = dir / (std::string("undated_") + (transform[1] == '}' ? "run" : "diff"));
    train(Config::parse(yaml((dir / "undated.csv").string(), run), "u.yaml",
                        {"data.date_column=", "data.targets=[other]", "data.horizon=2",
                         "data.horizon_mode=direct", "train.epochs=1",
                         std::string("data.transform=") + transform}),
          log);
    EXPECT_EQ(predict(run.string(),
                      {(dir / "undated.csv").string(), (dir / "d.csv").string(), true}, out),
              1);
    const auto undated = read_csv((dir / "d.csv").string());
    ASSERT_EQ(undated.size(), 3u);
    EXPECT_EQ(undated[1][0], "50");
    EXPECT_EQ(undated[1][1], "51");
    EXPECT_EQ(undated[2][1], "52");
  }
  // Too short for a window: one line naming the rows and the lookback.
  const std::string shorter = write_hourly(dir / "short.csv", 5, false);
  const std::string e = error_of([&] {
    predict((dir / "run").string(), {shorter, "x.csv", false}, out);
  });
  EXPECT_NE(e.find("5 rows, fewer than data.lookback = 8"), std::string::npos) << e;
  // A run of another task is named as such.
  EXPECT_NE(error_of([&] {
              predict(dir.string(), {without, "x.csv", false}, out);
            }).find("no model.safetensors"),
            std::string::npos);
}

// New data whose target is not known yet for its last rows: empty cells are no error; their
// actual stays empty. A target transform undone from an empty value gives an empty prediction.
TEST(Predict, EmptyTargetCellsAreValuesNotKnownYet) {
  const fs::path dir = test::temp_dir("missing");
  std::ostringstream log;
  train(Config::parse(yaml(write_hourly(dir / "train.csv", 300, true), dir / "run",
                           "  transform: {y: diff}\n"),
                      "m.yaml"),
        log);
  write_hourly(dir / "full.csv", 30, true);
  std::ifstream in(dir / "full.csv");
  std::ofstream out_file(dir / "gaps.csv");
  int line = 0;
  for (std::string text; std::getline(in, text); ++line)
    out_file << (line > 28 ? text.substr(0, text.rfind(',') + 1) : text) << "\n";
  out_file.close();
  std::ostringstream out;
  EXPECT_EQ(predict((dir / "run").string(),
                    {(dir / "gaps.csv").string(), (dir / "p.csv").string(), false}, out),
            23);
  const auto p = read_csv((dir / "p.csv").string());
  ASSERT_EQ(p.size(), 24u);
  // Hours 28 and 29 have no y. Row k of the predictions ends at hour k + 6: the window ending at
  // hour 27 is predicted but its target (hour 28) has no actual; the windows ending at hours 28
  // and 29 cannot undo the diff from their last y.
  EXPECT_NE(p[20][3], "");
  EXPECT_NE(p[21][2], "");
  EXPECT_EQ(p[21][3], "");
  EXPECT_EQ(p[22][2], "");
  EXPECT_EQ(p[23][2], "");
  EXPECT_NE(out.str().find("2 predictions are empty"), std::string::npos) << out.str();
  // eval --data leaves out the two windows whose targets (hours 28 and 29) are empty.
  const auto full = evaluate((dir / "run").string(), "test", (dir / "full.csv").string());
  const auto known = evaluate((dir / "run").string(), "test", (dir / "gaps.csv").string());
  EXPECT_EQ(known.at("samples"), full.at("samples") - 2);
  EXPECT_TRUE(std::isfinite(known.at("data_rmse")));
}

TEST(Predict, OneForecastPerSeriesAndEvalOnAnotherFile) {
  const fs::path dir = test::temp_dir("multi");
  std::ostringstream log;
  const std::string data = write_hourly(dir / "train.csv", 200, true, 3);
  const TrainSummary s =
      train(Config::parse(yaml(data, dir / "run", "  series_column: site\n"), "m.yaml"), log);
  EXPECT_NE(log.str().find("series: 3"), std::string::npos) << log.str();
  std::ostringstream out;
  const std::string fresh = write_hourly(dir / "fresh.csv", 30, false, 3);
  EXPECT_EQ(predict((dir / "run").string(), {fresh, (dir / "p.csv").string(), true}, out), 3);
  const auto p = read_csv((dir / "p.csv").string());
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0][0], "series");
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(p[1 + k][0], "s" + std::to_string(k));
    EXPECT_EQ(p[1 + k][1], "2020-01-02T05:00:00");  // hour 29, each series' last row
  }
  // Series too short for a window: the longest named, not the file's rows.
  const std::string short_file = write_hourly(dir / "short.csv", 5, false, 3);
  EXPECT_EQ(error_of([&] {
              predict((dir / "run").string(), {short_file, (dir / "q.csv").string(), true}, out);
            }),
            short_file +
                ": its 3 series have at most 5 rows, fewer than data.lookback = 8: no complete "
                "window to predict from");
  // eval --data: every window of the file, named data_*.
  const auto m = evaluate((dir / "run").string(), "test", write_hourly(dir / "e.csv", 40, true, 3));
  EXPECT_EQ(m.at("samples"), 3 * (40 - 8 - 1 + 1));  // windows with a target, per series
  EXPECT_TRUE(m.count("data_rmse"));
  EXPECT_FALSE(m.count("test_rmse"));
  EXPECT_LT(m.at("data_rmse"), 1.0);
  (void)s;
}

TEST(Predict, ClassifierWritesEveryClassProbability) {
  const fs::path dir = test::temp_dir("classify");
  auto write = [&](const fs::path& path, int rows, bool with_class) {
    std::ofstream f(path);
    f << "when,signal" << (with_class ? ",label" : "") << "\n";
    for (int i = 0; i < rows; ++i) {
      f << io::format_datetime(int64_t{1577836800} + i * int64_t{86400}) << ","
        << std::sin(0.3 * i);
      if (with_class) f << "," << (std::sin(0.3 * (i + 1)) > 0 ? "up" : "down");
      f << "\n";
    }
    return path.string();
  };
  std::ostringstream log;
  train(Config::parse("data: {path: " + write(dir / "t.csv", 300, true) +
                          ", task: classify, date_column: when, class_column: label, features: "
                          "[signal], lookback: 6, horizon: 0}\nmodel: {hidden: 16}\n"
                          "optim: {lr: 0.02}\ntrain: {epochs: 6, batch_size: 16, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "c.yaml"),
        log);
  std::ostringstream out;
  EXPECT_EQ(predict((dir / "run").string(),
                    {write(dir / "new.csv", 20, false), (dir / "p.csv").string(), false}, out),
            15);
  const auto p = read_csv((dir / "p.csv").string());
  EXPECT_EQ(p[0],
            (std::vector<std::string>{"window_end", "forecast_for", "class", "p_down", "p_up"}));
  int right = 0;
  for (size_t i = 1; i < p.size(); ++i) {
    EXPECT_EQ(p[i][0], p[i][1]);  // horizon 0: the class at the window's last row
    const double down = std::stod(p[i][3]), up = std::stod(p[i][4]);
    EXPECT_NEAR(down + up, 1.0, 1e-6);
    EXPECT_EQ(p[i][2], up > down ? "up" : "down");
    const int day = static_cast<int>(i) + 4;  // the window's last day
    right += p[i][2] == (std::sin(0.3 * (day + 1)) > 0 ? "up" : "down");
  }
  EXPECT_GE(right, 12) << log.str();  // the next sign of a sine follows from its past
  // A row without a class (an empty cell, a missing-value word) is no class named "" or "NaN":
  // the windows whose class it would give are left out, with a note; a column of no class at
  // all is an error.
  const auto train_with_classes = [&](const std::string& name, const std::vector<int>& lines,
                                      const std::string& label) {
    std::ifstream in(dir / "t.csv");
    std::ofstream out(dir / (name + ".csv"));
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      out << (std::count(lines.begin(), lines.end(), n)
                  ? line.substr(0, line.rfind(',') + 1) + label
                  : line)
          << "\n";
    out.close();
    std::ostringstream said;
    const std::string error = error_of([&] {
      train(Config::parse("data: {path: " + (dir / (name + ".csv")).string() +
                              ", task: classify, date_column: when, class_column: label, "
                              "features: [signal], lookback: 6, horizon: 0, split: {train: 1, "
                              "val: 0}}\ntrain: {epochs: 1, run_dir: " +
                              (dir / name).string() + "}\n",
                          "c.yaml"),
            said);
    });
    return error.empty() ? said.str() : error;
  };
  const std::string whole = train_with_classes("whole", {}, "");
  const std::string gaps = train_with_classes("gap", {10, 11, 30}, "");
  const std::string nans = train_with_classes("nan", {12}, "NaN");
  auto windows = [](const std::string& log) {
    return std::stoi(log.substr(log.find("classify, ") + 10));
  };
  EXPECT_NE(gaps.find("3 of "), std::string::npos) << gaps;
  EXPECT_NE(gaps.find(" rows have no class in column 'label' (an empty or missing cell, the first "
                      "at " +
                      (dir / "gap.csv").string() +
                      ":10): the windows whose class they would give are left out"),
            std::string::npos)
      << gaps;
  EXPECT_EQ(windows(gaps), windows(whole) - 3) << gaps;
  EXPECT_NE(nans.find("nan.csv:12): the windows"), std::string::npos) << nans;
  EXPECT_EQ(windows(nans), windows(whole) - 1) << nans;
  std::vector<int> all;
  for (int n = 2; n <= 301; ++n) all.push_back(n);  // every row of t.csv
  EXPECT_NE(train_with_classes("none", all, "")
                .find("column 'label' (data.class_column) holds no "
                      "class"),
            std::string::npos);
  // A few labelled rows all before the validation part: its emptiness is put down to the empty
  // class cells, not to windows too long for it.
  std::ifstream in(dir / "t.csv");
  std::ofstream early(dir / "early.csv");
  std::string line;
  for (int n = 1; std::getline(in, line); ++n)
    early << (n > 100 ? line.substr(0, line.rfind(',') + 1) : line) << "\n";
  early.close();
  const std::string no_val = error_of([&] {
    train(Config::parse("data: {path: " + (dir / "early.csv").string() +
                            ", task: classify, date_column: when, class_column: label, "
                            "features: [signal], lookback: 6, horizon: 0, split: {train: 0.7, "
                            "val: 0.3}}\ntrain: {epochs: 1, run_dir: " +
                            (dir / "early").string() + "}\n",
                        "c.yaml"),
          log);
  });
  EXPECT_NE(no_val.find("data.split.val: the validation split has no windows (train "),
            std::string::npos)
      << no_val;
  EXPECT_NE(no_val.find(": its 90 windows have no target (their class cells are empty); give some "
                        "of its rows a target"),
            std::string::npos)
      << no_val;
}

// eval --split val recomputes the validation loss logged for the saved epoch, to the last bit,
// in the run's precision.
TEST(Eval, ReproducesTheLoggedValidationLossExactly) {
  for (const std::string precision : {"fp32", "bf16"}) {
    std::string notice;
    if (precision == "bf16" && resolve_precision("bf16", &notice) != DType::bf16) continue;
    const fs::path dir = test::temp_dir("exact_" + precision);
    std::ostringstream log;
    train(Config::parse(yaml(write_hourly(dir / "d.csv", 300, true), dir / "run"), "e.yaml",
                        {"train.precision=" + precision}),
          log);
    const double logged = metrics_of(dir / "run").back().at("val_loss").get<double>();
    const auto m = evaluate((dir / "run").string(), "val");
    EXPECT_EQ(m.at("val_loss"), logged) << precision;
  }
}

// eval --data scores a language model on another text: every whole sequence of it. The test
// split's text, cut out as a file of its own, scores as the test split does.
TEST(Eval, LanguageModelScoresAnotherText) {
  const fs::path dir = test::temp_dir("lm_data");
  std::string text;
  for (int i = 0; text.size() < 3000; ++i)
    text += std::string(i % 3 == 0   ? "the cat sat"
                        : i % 3 == 1 ? "on a mat"
                                     : "and ran") +
            (i % 7 == 6 ? ".\n" : " ");
  { std::ofstream(dir / "all.txt") << text; }
  std::ostringstream log;
  train(Config::parse("data: {path: " + (dir / "all.txt").string() +
                          ", task: charlm, seq_len: 16, split: {train: 0.8, val: 0.1}}\n"
                          "model: {hidden: 8, embedding: 4}\n"
                          "train: {epochs: 1, batch_size: 8, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "lm.yaml"),
        log);
  const std::string run = (dir / "run").string();
  const size_t test_begin =
      static_cast<size_t>(std::floor(0.9 * double(text.size()) * (1 + 1e-12)));
  { std::ofstream(dir / "test_part.txt") << text.substr(test_begin); }
  const auto split = evaluate(run, "test");
  const auto other = evaluate(run, "test", (dir / "test_part.txt").string());
  EXPECT_EQ(other.at("samples"), split.at("samples"));
  EXPECT_EQ(other.at("data_loss"), split.at("test_loss"));
  EXPECT_EQ(other.at("data_bpc"), split.at("test_bpc"));
  EXPECT_EQ(other.at("data_perplexity"), split.at("test_perplexity"));

  { std::ofstream(dir / "short.txt") << "the cat"; }
  EXPECT_NE(error_of([&] {
              evaluate(run, "test", (dir / "short.txt").string());
            }).find("short.txt: 7 characters, fewer than data.seq_len + 1 (17)"),
            std::string::npos);
  { std::ofstream(dir / "new_letters.txt") << text.substr(0, 100) << "Zebra"; }
  EXPECT_NE(error_of([&] {
              evaluate(run, "test", (dir / "new_letters.txt").string());
            }).find("'Z' (1 time, at line"),
            std::string::npos);
}

TEST(Runs, ADirectoryHoldingARunIsNeverMixed) {
  const fs::path dir = test::temp_dir("mixed");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  const Config c = Config::parse(yaml(data, dir / "run"), "r.yaml", {"train.epochs=1"});
  std::ostringstream log;
  train(c, log);
  const std::string e = error_of([&] { train(c, log); });
  EXPECT_NE(e.find("--overwrite"), std::string::npos) << e;
  EXPECT_NE(e.find("--resume"), std::string::npos) << e;
  std::ofstream(dir / "run" / "trace.json") << "old";
  train(Config::parse(yaml(data, dir / "run"), "r.yaml", {"train.epochs=2"}), log, "", {},
        /*overwrite=*/true);
  EXPECT_EQ(metrics_of(dir / "run").size(), 2u);  // the new run's epochs only
  EXPECT_FALSE(fs::exists(dir / "run" / "trace.json"));
  // Without train.run_dir: runs/<config name>, then runs/<config name>-2.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  const Config unnamed = Config::parse(
      "data: {path: d.csv, date_column: when, features: [signal], targets: [y], lookback: 8}\n"
      "model: {hidden: 8}\ntrain: {epochs: 1}\n",
      "weather.yaml");
  const TrainSummary first = train(unnamed, log), second = train(unnamed, log);
  fs::current_path(cwd);
  EXPECT_EQ(first.run_dir, "runs/weather");
  EXPECT_EQ(second.run_dir, "runs/weather-2");
  // The stored paths are absolute, the path as written beside them: eval works from anywhere.
  std::ifstream resolved(dir / "runs" / "weather" / "config.resolved.yaml");
  std::stringstream text;
  text << resolved.rdbuf();
  EXPECT_NE(text.str().find((dir / "d.csv").string()), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("as written: d.csv"), std::string::npos) << text.str();
  EXPECT_GT(evaluate((dir / "runs" / "weather").string(), "test").at("samples"), 0);
}

// The baselines beside a forecaster's errors, against the file's own values: on 200 hourly rows
// (train 0..159, validation targets 160..179 with history context), naive predicts y[t-1],
// seasonal naive (data.season 21) y[t-21]; MASE scales the model's MAE by the mean |y[t] -
// y[t-21]| over the training targets t = 21..159; skill is 1 - MSE / naive's MSE.
TEST(Runs, ForecastsAreScoredAgainstNaiveAndSeasonalNaive) {
  const fs::path dir = test::temp_dir("baselines");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  std::ostringstream log;
  train(Config::parse(yaml(data, dir / "run"), "b.yaml", {"data.season=21", "train.epochs=1"}),
        log);
  const auto rows = read_csv(data);
  std::vector<double> y;
  for (size_t i = 1; i < rows.size(); ++i) y.push_back(std::stod(rows[i][3]));
  ASSERT_EQ(y.size(), 200u);
  double naive_abs = 0, naive_sq = 0, snaive_abs = 0, snaive_sq = 0, scale = 0;
  for (int t = 160; t < 180; ++t) {
    naive_abs += std::fabs(y[t - 1] - y[t]), naive_sq += std::pow(y[t - 1] - y[t], 2);
    snaive_abs += std::fabs(y[t - 21] - y[t]), snaive_sq += std::pow(y[t - 21] - y[t], 2);
  }
  for (int t = 21; t < 160; ++t) scale += std::fabs(y[t] - y[t - 21]) / 139;
  const nlohmann::json m = metrics_of(dir / "run").back();
  EXPECT_NEAR(m.at("val_naive_mae").get<double>(), naive_abs / 20, 1e-12);
  EXPECT_NEAR(m.at("val_naive_rmse").get<double>(), std::sqrt(naive_sq / 20), 1e-12);
  EXPECT_NEAR(m.at("val_snaive_mae").get<double>(), snaive_abs / 20, 1e-12);
  EXPECT_NEAR(m.at("val_snaive_rmse").get<double>(), std::sqrt(snaive_sq / 20), 1e-12);
  EXPECT_NEAR(m.at("val_mase").get<double>(), m.at("val_mae").get<double>() / scale, 1e-9);
  EXPECT_NEAR(m.at("val_skill").get<double>(), 1 - m.at("val_mse").get<double>() / (naive_sq / 20),
              1e-9);
  // Said once, and the epoch's line keeps to the model's errors; a model worse than naive is
  // a warning at the end.
  EXPECT_NE(log.str().find("baselines on validation: naive"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("; seasonal naive (21 rows before the target) MAE"), std::string::npos)
      << log.str();
  EXPECT_EQ(log.str().find("val_naive_mae"), std::string::npos) << log.str();
  if (m.at("val_skill").get<double>() < 0) {
    EXPECT_NE(log.str().find("warning: the saved model forecasts worse than the naive"),
              std::string::npos)
        << log.str();
  }
  // eval names them for its split.
  const auto test = evaluate((dir / "run").string(), "test");
  EXPECT_TRUE(test.count("test_naive_mae") && test.count("test_snaive_mae") &&
              test.count("test_mase") && test.count("test_skill"));
  // A file with empty targets (rows 50 and 120): their windows go unscored, and the windows
  // ending there have no naive forecast; the skill compares the model with naive on the windows
  // naive has.
  std::ifstream in(data);
  std::ofstream blanked(dir / "blanks.csv");
  std::string line;
  for (int r = -1; std::getline(in, line); ++r)
    blanked << (r == 50 || r == 120 ? line.substr(0, line.rfind(',') + 1) : line) << "\n";
  blanked.close();
  const std::string blanks = (dir / "blanks.csv").string();
  const auto scored = evaluate((dir / "run").string(), "", blanks);
  const Predictions p = predictions((dir / "run").string(), blanks, false);
  const auto column = [&](const std::string& name) {
    for (const auto& c : p.columns)
      if (c.name == name) return &c;
    throw std::runtime_error("no column " + name);
  };
  const auto &forecast = column("y")->values, &actual = column("y_actual")->values;
  double model_sq = 0, model_paired_sq = 0, naive_paired_sq = 0, largest = 0;
  int64_t scored_windows = 0, paired = 0;
  for (int64_t i = 0; i < p.rows; ++i) {
    const int64_t last = i + 7;  // the window's last row: windows start at every row
    if (std::isnan(actual[i])) continue;
    const double e = forecast[i] - actual[i];
    model_sq += e * e, ++scored_windows;
    largest = std::max(largest, std::fabs(double(forecast[i])));
    if (last == 50 || last == 120) continue;
    model_paired_sq += e * e, naive_paired_sq += std::pow(y[last] - actual[i], 2), ++paired;
  }
  EXPECT_EQ(scored_windows, 200 - 8 - 2);
  EXPECT_EQ(paired, scored_windows - 2);
  EXPECT_EQ(scored.at("samples"), double(scored_windows));
  // predict's forecasts are undone from normalisation in f32, the metrics' in f64: each error
  // moves by a few of the forecast's float roundings (here up to 4 ulps), its square by twice that
  // times the error; the mean of |e| is at most the root of the mean square.
  const double model_mse = model_sq / double(scored_windows);
  const double mse_bound = 2 * std::sqrt(model_mse) * largest * 0x1p-21;
  EXPECT_NEAR(scored.at("data_mse"), model_mse, mse_bound);
  EXPECT_NEAR(scored.at("data_naive_rmse"), std::sqrt(naive_paired_sq / double(paired)), 1e-9);
  const double skill = 1 - model_paired_sq / naive_paired_sq;
  EXPECT_NEAR(scored.at("data_skill"), skill, mse_bound * double(scored_windows) / naive_paired_sq);
  EXPECT_GT(std::fabs(skill -
                      (1 - model_sq / double(scored_windows) / (naive_paired_sq / double(paired)))),
            1e-4 * std::fabs(skill))
      << "the two windows left out of naive must matter here";
}

// A forecast's skill and MASE can be watched: `auto` maximises the skill, minimises MASE, and the
// run keeps that epoch's model.
TEST(Runs, TheForecastsSkillAndMaseCanBeWatched) {
  const fs::path dir = test::temp_dir("watched");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  for (const std::string monitor : {"val_skill", "val_mase"}) {
    std::ostringstream log;
    const TrainSummary s =
        train(Config::parse(yaml(data, dir / monitor), "w.yaml",
                            {"train.epochs=4", "train.early_stopping.monitor=" + monitor}),
              log);
    std::vector<double> values;
    for (const auto& m : metrics_of(dir / monitor)) values.push_back(m.at(monitor).get<double>());
    ASSERT_EQ(values.size(), 4u);
    const double best = monitor == "val_skill" ? *std::max_element(values.begin(), values.end())
                                               : *std::min_element(values.begin(), values.end());
    EXPECT_EQ(s.monitor, monitor);
    EXPECT_EQ(s.best, best) << log.str();
    EXPECT_NEAR(evaluate((dir / monitor).string(), "val").at(monitor), best,
                1e-6 * std::fabs(best));
  }
  // Metrics this data does not give are refused with the ones it does.
  std::ostringstream log;
  try {
    train(Config::parse(yaml(data, dir / "pinball"), "w.yaml",
                        {"train.early_stopping.monitor=val_pinball"}),
          log);
    ADD_FAILURE() << "val_pinball without quantiles was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'val_pinball' is not a metric of this task ("
                                         "train_loss, val_loss, val_mse, val_rmse, val_mae, "
                                         "val_skill, val_mase)"),
              std::string::npos)
        << e.what();
  }
}

// data.horizon 4, direct (the default): each window forecasts the 4 hours after it. On 200 hourly
// rows (train 0..159), a validation window's four targets all lie in 160..179: first targets
// 160..176, 17 windows. Naive predicts every step by the window's last value; seasonal naive
// (season 3) step h by the value ceil(h / 3) seasons before it, never a value after the window.
TEST(Runs, DirectForecastsPredictEveryStepAhead) {
  const fs::path dir = test::temp_dir("direct");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  std::ostringstream log;
  train(Config::parse(yaml(data, dir / "run", "  horizon: 4\n"), "h.yaml",
                      {"data.season=3", "train.epochs=2"}),
        log);
  const auto rows = read_csv(data);
  std::vector<double> y;
  for (size_t i = 1; i < rows.size(); ++i) y.push_back(std::stod(rows[i][3]));
  double naive_abs = 0, snaive_abs = 0;
  for (int first = 160; first <= 176; ++first)
    for (int h = 1; h <= 4; ++h) {
      const int t = first + h - 1, lag = 3 * ((h + 2) / 3);
      naive_abs += std::fabs(y[first - 1] - y[t]);
      snaive_abs += std::fabs(y[t - lag] - y[t]);
    }
  const nlohmann::json m = metrics_of(dir / "run").back();
  EXPECT_NEAR(m.at("val_naive_mae").get<double>(), naive_abs / 68, 1e-12);
  EXPECT_NEAR(m.at("val_snaive_mae").get<double>(), snaive_abs / 68, 1e-12);
  double step_mean = 0;
  for (int h = 1; h <= 4; ++h) step_mean += m.at("val_mae_h" + std::to_string(h)).get<double>() / 4;
  EXPECT_NEAR(step_mean, m.at("val_mae").get<double>(), 1e-9);  // every step has 17 windows
  EXPECT_FALSE(m.contains("val_mae_h5"));
  const auto test = evaluate((dir / "run").string(), "test");
  EXPECT_TRUE(test.count("test_mae_h1") && test.count("test_rmse_h4")) << test.size();
  // predict: a row per window and step, dated step hours after the window's last row; the
  // actual is y at that hour, empty past the file's end.
  const std::string fresh = write_hourly(dir / "fresh.csv", 20, true);
  std::ostringstream out;
  EXPECT_EQ(predict((dir / "run").string(), {fresh, (dir / "p.csv").string(), false}, out), 13);
  const auto p = read_csv((dir / "p.csv").string());
  ASSERT_EQ(p.size(), 1u + 13 * 4);
  EXPECT_EQ(p[0],
            (std::vector<std::string>{"window_end", "forecast_for", "step", "y", "y_actual"}));
  for (int w = 0; w < 13; ++w)
    for (int h = 1; h <= 4; ++h) {
      const auto& r = p[1 + w * 4 + (h - 1)];
      const int hour = w + 7 + h;
      EXPECT_EQ(r[0], io::format_datetime(int64_t{1577836800} + (w + 7) * int64_t{3600}, false));
      EXPECT_EQ(r[1], io::format_datetime(int64_t{1577836800} + hour * int64_t{3600}, false));
      EXPECT_EQ(r[2], std::to_string(h));
      if (hour < 20)
        EXPECT_NEAR(std::stod(r[4]), std::sin(0.3 * hour + 0.9), 1e-6);
      else
        EXPECT_EQ(r[4], "");
    }
  // Dates past the end are written as the file writes its own: "2020-01-01 07:00", a column of
  // one format.
  // `fresh` with each date-time line's "YYYY-MM-DDTHH:MM:SS" rewritten by `date`, as `name`.
  const auto with_dates = [&](const std::string& name, auto&& date) {
    std::string text;
    std::ifstream in(fresh);
    for (std::string line; std::getline(in, line);) {
      if (line.size() > 19 && line[10] == 'T') line = date(line.substr(0, 19)) + line.substr(19);
      text += line + "\n";
    }
    std::ofstream(dir / name) << text;
  };
  with_dates("spaced.csv",
             [](const std::string& d) { return d.substr(0, 10) + " " + d.substr(11, 5); });
  EXPECT_EQ(predict((dir / "run").string(),
                    {(dir / "spaced.csv").string(), (dir / "q.csv").string(), true}, out),
            1);
  const auto q = read_csv((dir / "q.csv").string());
  ASSERT_EQ(q.size(), 1u + 4);
  for (int h = 1; h <= 4; ++h) {
    EXPECT_EQ(q[h][0], io::format_datetime(int64_t{1577836800} + 19 * int64_t{3600}, false)
                           .replace(10, 1, " ")
                           .substr(0, 16));
    EXPECT_EQ(q[h][1], io::format_datetime(int64_t{1577836800} + (19 + h) * int64_t{3600}, false)
                           .replace(10, 1, " ")
                           .substr(0, 16));
  }
  // ... and "2020-01-01T07:00:00.000", with the fraction of zeros.
  with_dates("millis.csv", [](const std::string& d) { return d + ".000"; });
  EXPECT_EQ(predict((dir / "run").string(),
                    {(dir / "millis.csv").string(), (dir / "m.csv").string(), true}, out),
            1);
  const auto ms = read_csv((dir / "m.csv").string());
  ASSERT_EQ(ms.size(), 1u + 4);
  for (int h = 1; h <= 4; ++h) {
    EXPECT_EQ(ms[h][0],
              io::format_datetime(int64_t{1577836800} + 19 * int64_t{3600}, false) + ".000");
    EXPECT_EQ(ms[h][1],
              io::format_datetime(int64_t{1577836800} + (19 + h) * int64_t{3600}, false) + ".000");
  }
  // ... and "2020-01-01 07:00:00.500000", half a second past each hour in pandas' six digits:
  // dated to the microsecond, still an hour apart (no note of another step).
  with_dates("micros.csv", [](std::string d) { return d.replace(10, 1, " ") + ".500000"; });
  std::ostringstream micros_notes;
  EXPECT_EQ(predict((dir / "run").string(),
                    {(dir / "micros.csv").string(), (dir / "u.csv").string(), true}, micros_notes),
            1);
  EXPECT_EQ(micros_notes.str().find("apart"), std::string::npos) << micros_notes.str();
  const auto us = read_csv((dir / "u.csv").string());
  ASSERT_EQ(us.size(), 1u + 4);
  for (int h = 1; h <= 4; ++h) {
    EXPECT_EQ(
        us[h][0],
        io::format_datetime(int64_t{1577836800} + 19 * int64_t{3600}, false).replace(10, 1, " ") +
            ".500000");
    EXPECT_EQ(us[h][1], io::format_datetime(int64_t{1577836800} + (19 + h) * int64_t{3600}, false)
                                .replace(10, 1, " ") +
                            ".500000");
  }
  // A run stored before data.horizon_mode forecast one step, horizon steps ahead.
  const Config old = as_it_trained(Config::parse("data: {path: x.csv, horizon: 4}\n", "o.yaml"));
  EXPECT_EQ(old.str("data.horizon_mode"), "last");
  EXPECT_EQ(as_it_trained(Config::parse("data: {horizon_mode: direct}\n", "n.yaml"))
                .str("data.horizon_mode"),
            "direct");
}

// data.missing mask end to end: empty feature and target cells train (the features taken from
// the file, so predict finds the file's among the stored names, indicators included) and a new
// file with an empty cell gets a forecast for every window.
TEST(Runs, MaskedCellsTrainAndPredict) {
  const fs::path dir = test::temp_dir("mask");
  auto blank = [](const std::string& path, const std::vector<std::pair<int, int>>& cells) {
    auto rows = read_csv(path);
    for (const auto& [row, col] : cells) rows[row + 1][col].clear();
    std::ofstream f(path);
    for (const auto& r : rows) {
      for (size_t c = 0; c < r.size(); ++c) f << (c ? "," : "") << r[c];
      f << "\n";
    }
    return path;
  };
  const std::string data = blank(write_hourly(dir / "d.csv", 200, true),
                                 {{50, 1}, {51, 1}, {120, 2}, {70, 3}, {171, 3}});
  std::ostringstream log;
  train(Config::parse("data:\n  path: " + data +
                          "\n  date_column: when\n  targets: [y]\n  lookback: 8\n  missing: mask\n"
                          "model: {hidden: 16}\ntrain: {epochs: 2, batch_size: 16, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "m.yaml"),
        log);
  EXPECT_NE(log.str().find("data.missing mask: 2 missing cells of 'signal' masked"),
            std::string::npos)
      << log.str();
  EXPECT_NE(log.str().find("windows whose target is missing are left out"), std::string::npos);
  EXPECT_TRUE(std::isfinite(metrics_of(dir / "run").back().at("val_loss").get<double>()));
  const std::string fresh = blank(write_hourly(dir / "f.csv", 30, true), {{10, 2}});
  std::ostringstream out;
  EXPECT_EQ(predict((dir / "run").string(), {fresh, (dir / "p.csv").string(), false}, out), 23);
  const auto p = read_csv((dir / "p.csv").string());
  for (size_t i = 1; i < p.size(); ++i) EXPECT_TRUE(std::isfinite(std::stod(p[i][2]))) << i;
}

// Business-day data: predict --last dates its forecasts by business days, past the weekend and
// a listed holiday. The file ends on Friday 2020-03-06; Monday the 9th is listed.
TEST(Predict, BusinessDayForecastsAreDatedByBusinessDays) {
  const fs::path dir = test::temp_dir("business");
  const std::string data = (dir / "d.csv").string();
  {
    std::ofstream f(data);
    f << "day,price\n";
    int i = 0;
    for (int64_t t = *io::parse_datetime("2020-01-01"); t <= *io::parse_datetime("2020-03-06");
         t += 86400)
      if (const int64_t dow = (t / 86400 + 3) % 7; dow < 5)
        f << io::format_datetime(t) << "," << 100 + std::sin(0.4 * i++) << "\n";
  }
  const std::string holidays = (dir / "h.txt").string();
  std::ofstream(holidays) << "2020-03-09\n";
  std::ostringstream log;
  train(Config::parse("data: {path: " + data +
                          ", date_column: day, features: [price], targets: [price], lookback: 5, "
                          "horizon: 2, frequency: B, holidays: " +
                          holidays + "}\nmodel: {hidden: 8}\ntrain: {epochs: 1, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "b.yaml"),
        log);
  std::ostringstream out;
  predict((dir / "run").string(), {data, (dir / "p.csv").string(), true}, out);
  const auto p = read_csv((dir / "p.csv").string());
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1][0], "2020-03-06");
  EXPECT_EQ(p[1][1], "2020-03-10");
  EXPECT_EQ(p[2][1], "2020-03-11");
  // The run keeps the holidays: the list's file may go.
  fs::remove(holidays);
  predict((dir / "run").string(), {data, (dir / "q.csv").string(), true}, out);
  EXPECT_EQ(read_csv((dir / "q.csv").string()), p);
}

// The order of day and month the training file's dates showed (a day past 12) is the run's: a
// later file whose days never pass 12 reads day first too, rather than being refused as
// ambiguous.
TEST(Predict, DayFirstDatesOfTheTrainingFileReadTheNextFileDayFirst) {
  const fs::path dir = test::temp_dir("day_first");
  auto write = [&](const std::string& name, int first_day, int days) {
    const std::string path = (dir / name).string();
    std::ofstream f(path);
    f << "date,y\n";
    for (int i = 0; i < days; ++i) {
      const int64_t t = *io::parse_datetime("2020-01-01") + (first_day - 1 + i) * int64_t{86400};
      const std::string iso = io::format_datetime(t);  // YYYY-MM-DD
      f << iso.substr(8, 2) << "/" << iso.substr(5, 2) << "/" << iso.substr(0, 4) << ","
        << std::sin(0.3 * i) << "\n";
    }
    return path;
  };
  const std::string trained = write("train.csv", 10, 60), later = write("later.csv", 32, 8);
  std::ostringstream log;
  train(Config::parse("data: {path: " + trained +
                          ", date_column: date, features: [y], targets: [y], lookback: 3}\n"
                          "model: {hidden: 8}\ntrain: {epochs: 1, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "d.yaml"),
        log);
  std::ostringstream out;
  EXPECT_EQ(predict((dir / "run").string(), {later, (dir / "p.csv").string(), false}, out), 6);
  const auto p = read_csv((dir / "p.csv").string());
  ASSERT_EQ(p.size(), 7u);  // the header, 5 windows with their actual value and the next step
  EXPECT_EQ(p[1][0], "2020-02-03");  // 03/02/2020: the 3rd of February
}

// Times marked UTC ("Z", "+00:00") keep the mark on the time a forecast past the end is for.
TEST(Predict, ATimePastTheEndKeepsTheFilesMarkOfUtc) {
  const fs::path dir = test::temp_dir("utc_mark");
  for (const std::string zone : {"Z", "+00:00"}) {
    const std::string path = (dir / "z.csv").string();
    {
      std::ofstream f(path);
      f << "time,y\n";
      for (int h = 0; h < 40; ++h)
        f << io::format_datetime(*io::parse_datetime("2020-01-01") + h * 3600, false) << zone << ","
          << std::sin(0.3 * h) << "\n";
    }
    std::ostringstream log;
    train(Config::parse("data: {path: " + path +
                            ", date_column: time, features: [y], targets: [y], lookback: 3}\n"
                            "model: {hidden: 8}\ntrain: {epochs: 1, run_dir: " +
                            (dir / "run").string() + "}\n",
                        "z.yaml", {"train.save=last"}),
          log, "", {}, true);
    std::ostringstream out;
    predict((dir / "run").string(), {path, (dir / "p.csv").string(), true}, out);
    const auto p = read_csv((dir / "p.csv").string());
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[1][0], "2020-01-02T15:00:00" + zone);
    EXPECT_EQ(p[1][1], "2020-01-02T16:00:00" + zone);
  }
}

// A column of ISO times written several ways (a midnight without its time, UTC as Z and as
// +00:00, a blank after a time) comes back one way: as the first time written with its time is
// (the first, where every time is a midnight); a column written one way comes back as it is.
TEST(Predict, DatesWrittenSeveralWaysComeBackOneWay) {
  const fs::path dir = test::temp_dir("date_styles");
  const int64_t start = *io::parse_datetime("2020-01-01");
  auto hour = [&](int h) { return io::format_datetime(start + h * 3600, false); };  // ...T01:00:00
  auto day = [&](int i) { return io::format_datetime(start + i * 86400, true); };   // 2020-01-02
  auto second = [&](int i) { return io::format_datetime(start + i, false); };
  struct Case {
    std::function<std::string(int)> written;
    std::string window_end, forecast_for;  // the last window's
  };
  const std::vector<Case> cases = {
      {[&](int h) {
         const std::string t = hour(h);
         return h % 24 == 0 ? t.substr(0, 10) : t.substr(0, 10) + " " + t.substr(11);
       },
       "2020-01-02 15:00:00", "2020-01-02 16:00:00"},
      {[&](int h) { return hour(h) + (h % 2 ? "+00:00" : "Z"); }, "2020-01-02T15:00:00Z",
       "2020-01-02T16:00:00Z"},
      {[&](int h) { return hour(h).substr(0, 16) + (h % 3 ? " " : ""); }, "2020-01-02T15:00",
       "2020-01-02T16:00"},
      {[&](int h) { return hour(h) + (h % 2 ? ".000Z" : "+0000"); }, "2020-01-02T15:00:00+0000",
       "2020-01-02T16:00:00+0000"},
      {[&](int h) { return hour(h).replace(10, 1, " ") + (h % 2 ? "Z" : "+00"); },
       "2020-01-02 15:00:00+00", "2020-01-02 16:00:00+00"},
      {[&](int i) { return i % 3 ? day(i) + " 00:00:00" : day(i); }, "2020-02-09", "2020-02-10"},
      {[&](int h) { return hour(h).replace(10, 1, " ").substr(0, 16); }, "2020-01-02 15:00",
       "2020-01-02 16:00"},
      // The first cannot write a finer time: all as the longest. 30 s apart, minutes written
      // without their seconds; 250 ms apart, whole seconds without their fraction.
      {[&](int i) {
         const std::string t = second(30 * i).replace(10, 1, " ");
         return i % 2 ? t : t.substr(0, 16);
       },
       "2020-01-01 00:19:30", "2020-01-01 00:20:00"},
      {[&](int i) {
         const char* fractions[] = {"", ".250", ".500", ".750"};
         return second(i / 4) + fractions[i % 4];
       },
       "2020-01-01T00:00:09.750", "2020-01-01T00:00:10.000"}};
  for (const Case& c : cases) {
    const std::string path = (dir / "t.csv").string();
    {
      std::ofstream f(path);
      f << "time,y\n";
      for (int h = 0; h < 40; ++h) f << c.written(h) << "," << std::sin(0.3 * h) << "\n";
    }
    std::ostringstream log;
    train(Config::parse("data: {path: " + path +
                            ", date_column: time, features: [y], targets: [y], lookback: 3}\n"
                            "model: {hidden: 8}\ntrain: {epochs: 1, run_dir: " +
                            (dir / "run").string() + "}\n",
                        "t.yaml", {"train.save=last"}),
          log, "", {}, true);
    std::ostringstream out;
    predict((dir / "run").string(), {path, (dir / "p.csv").string(), false}, out);
    const auto p = read_csv((dir / "p.csv").string());
    ASSERT_EQ(p.size(), 39u);      // the header, 37 windows and the step past the end
    std::set<std::string> shapes;  // digits as 'd'
    for (size_t i = 1; i < p.size(); ++i)
      for (const std::string& date : {p[i][0], p[i][1]}) {
        if (date.empty()) continue;  // a time past the end of irregular steps
        std::string shape = date;
        for (char& ch : shape) ch = std::isdigit(static_cast<unsigned char>(ch)) ? 'd' : ch;
        shapes.insert(shape);
      }
    EXPECT_EQ(shapes.size(), 1u) << *shapes.begin() << " " << *shapes.rbegin();
    EXPECT_EQ(p.back()[0], c.window_end);
    EXPECT_EQ(p.back()[1], c.forecast_for);
  }
}

// A forecast undone to a large level (a meter's reading plus its forecast change under diff) in
// double: not rounded to a float's spacing there (128 at 1.2e9).
TEST(Predict, AForecastOnALargeLevelKeepsItsDigits) {
  const fs::path dir = test::temp_dir("large_level");
  const std::string path = (dir / "meter.csv").string();
  {
    std::ofstream f(path);
    f << "y\n";
    double y = 1234567890;
    for (int i = 0; i < 200; ++i) f << std::llround(y += 500 + 300 * std::sin(0.26 * i)) << "\n";
  }
  std::ostringstream log;
  train(Config::parse("data: {path: " + path +
                          ", features: [y], targets: [y], transform: {y: diff}, lookback: 6}\n"
                          "model: {hidden: 8}\ntrain: {epochs: 1, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "m.yaml", {"train.save=last"}),
        log, "", {}, true);
  const Predictions p = predictions((dir / "run").string(), path, false);
  const auto y =
      std::find_if(p.columns.begin(), p.columns.end(), [](const auto& c) { return c.name == "y"; });
  ASSERT_NE(y, p.columns.end());
  int off_the_float_grid = 0;
  for (const double v : y->values) off_the_float_grid += std::fmod(v, 128.0) != 0.0;
  EXPECT_GT(off_the_float_grid, static_cast<int>(y->values.size()) / 2);
  // On a level near zero a forecast has the f32 output's digits (about 8; more where the output
  // is near 0 and the level's shift is not), not a double's 17.
  const std::string wave = (dir / "wave.csv").string();
  {
    std::ofstream f(wave);
    f << "y\n";
    for (int i = 0; i < 200; ++i) f << std::sin(0.26 * i) << "\n";
  }
  train(Config::parse("data: {path: " + wave +
                          ", features: [y], targets: [y], lookback: 6}\n"
                          "model: {hidden: 8}\ntrain: {epochs: 1, run_dir: " +
                          (dir / "wave").string() + "}\n",
                      "w.yaml", {"train.save=last"}),
        log, "", {}, true);
  for (const auto& c : predictions((dir / "wave").string(), wave, false).columns) {
    if (c.name != "y") continue;
    ASSERT_FALSE(c.values.empty());
    size_t short_ones = 0;
    for (const double v : c.values) {
      const std::string text = shortest(v);
      const std::string mantissa = text.substr(0, text.find('e'));
      const size_t first = mantissa.find_first_of("123456789");
      const auto digits = std::count_if(mantissa.begin() + static_cast<int64_t>(first),
                                        mantissa.end(), [](char ch) { return std::isdigit(ch); });
      EXPECT_LE(digits, 12) << text;
      short_ones += digits <= 9;
    }
    EXPECT_GT(short_ones, c.values.size() * 3 / 4);
  }
}

// A forecast whose log transform, undone, is past a double's range is written as inf, and said so.
TEST(Predict, AForecastPastADoublesRangeIsNoted) {
  const fs::path dir = test::temp_dir("past_double");
  const std::string path = (dir / "wide.csv").string();
  {
    std::ofstream f(path);
    f << "y\n";
    for (int i = 0; i < 120; ++i) f << "1e" << (i * 7) % 600 - 300 << "\n";
  }
  std::ostringstream log;
  train(Config::parse("data: {path: " + path +
                          ", features: [y], targets: [y], transform: {y: log}, lookback: 4}\n"
                          "model: {hidden: 8}\ntrain: {epochs: 1, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "w.yaml", {"train.save=last"}),
        log, "", {}, true);
  const Predictions before = predictions((dir / "run").string(), path, false);
  EXPECT_TRUE(before.notes.empty()) << before.notes.front();
  // The head's bias moved far out: the output stays finite, exp of it does not.
  const std::string model = (dir / "run" / "model.safetensors").string();
  const io::SafetensorsFile file = io::SafetensorsFile::read(model);
  std::vector<std::vector<std::byte>> bytes;
  std::vector<io::SafetensorsTensor> tensors;
  for (const auto& e : file.entries()) {
    const auto b = file.bytes(e);
    bytes.emplace_back(b.begin(), b.end());
    if (e.name == "head.bias") {
      const float far = 1e6f;
      std::memcpy(bytes.back().data(), &far, sizeof far);
    }
  }
  for (size_t i = 0; i < bytes.size(); ++i)
    tensors.push_back({file.entries()[i].name, file.entries()[i].dtype, file.entries()[i].shape,
                       bytes[i].data()});
  std::map<std::string, std::string> metadata = file.metadata();
  metadata.erase(io::SafetensorsFile::kDataHashKey);
  metadata.erase(io::SafetensorsFile::kHeaderHashKey);
  io::write_safetensors(model, tensors, metadata);
  const Predictions after = predictions((dir / "run").string(), path, false);
  const auto y = std::find_if(after.columns.begin(), after.columns.end(),
                              [](const auto& c) { return c.name == "y"; });
  ASSERT_NE(y, after.columns.end());
  EXPECT_TRUE(std::all_of(y->values.begin(), y->values.end(),
                          [](double v) { return std::isinf(v) && v > 0; }));
  ASSERT_EQ(after.notes.size(), 1u);
  EXPECT_EQ(after.notes[0], std::to_string(y->values.size()) +
                                " predictions are inf: the model's output, with data.transform of "
                                "the target undone, is past the largest double (1.8e308)");
}

// data.static end to end: the categories travel in the checkpoint; predict feeds each series its
// own and refuses one the model was not trained on.
TEST(Predict, StaticCategoriesTravelWithTheModel) {
  const fs::path dir = test::temp_dir("static");
  auto with_zone = [&](const std::string& name, const std::string& east) {
    auto rows = read_csv(write_hourly(dir / name, 120, true, 3));
    std::ofstream f(dir / name);
    for (size_t i = 0; i < rows.size(); ++i) {
      for (const auto& cell : rows[i]) f << cell << ",";
      f << (i == 0 ? "zone" : rows[i][1] == "s1" ? east : "west") << "\n";
    }
    return (dir / name).string();
  };
  const std::string data = with_zone("d.csv", "east");
  std::ostringstream log;
  train(
      Config::parse(yaml(data, dir / "run", "  series_column: site\n  static: [zone]\n"), "s.yaml"),
      log);
  std::ostringstream out;
  EXPECT_EQ(predict((dir / "run").string(), {data, (dir / "p.csv").string(), true}, out), 3);
  const std::string north = with_zone("n.csv", "north");
  EXPECT_EQ(error_of([&] {
              predict((dir / "run").string(), {north, (dir / "q.csv").string(), true}, out);
            }),
            north +
                ": series 's1' has zone 'north', which the model was not trained on "
                "(data.static)");
}

// data.categorical end to end: the categories travel in the checkpoint; predict feeds a category
// the model was not trained on as all 0, with a note, and feeds it the same as an empty cell.
TEST(Predict, CategoricalColumnsTravelWithTheModel) {
  const fs::path dir = test::temp_dir("categorical");
  auto with_mode = [&](const std::string& name, const std::string& third) {
    auto rows = read_csv(write_hourly(dir / name, 120, true));
    std::ofstream f(dir / name);
    const std::string modes[] = {"idle", "run", third};
    for (size_t i = 0; i < rows.size(); ++i) {
      for (const auto& cell : rows[i]) f << cell << ",";
      f << (i == 0 ? "mode" : modes[i % 3]) << "\n";
    }
    return (dir / name).string();
  };
  const std::string data = with_mode("d.csv", "boost");
  std::ostringstream log;
  train(Config::parse(yaml(data, dir / "run", "  categorical: [mode]\n"), "c.yaml"), log);
  const std::string run = (dir / "run").string();
  std::ostringstream out;
  EXPECT_EQ(predict(run, {data, (dir / "p.csv").string(), true}, out), 1);
  EXPECT_EQ(out.str().find("not trained on"), std::string::npos) << out.str();
  const std::string unseen = with_mode("u.csv", "surge"), empty = with_mode("e.csv", "");
  std::ostringstream unseen_log, empty_log;
  EXPECT_EQ(predict(run, {unseen, (dir / "pu.csv").string(), false}, unseen_log), 113);
  EXPECT_NE(unseen_log.str().find("40 rows have mode 'surge', which the model was not trained on "
                                  "(data.categorical): all its one-hot features 0"),
            std::string::npos)
      << unseen_log.str();
  EXPECT_EQ(predict(run, {empty, (dir / "pe.csv").string(), false}, empty_log), 113);
  EXPECT_EQ(read_csv((dir / "pu.csv").string()), read_csv((dir / "pe.csv").string()));
  std::ostringstream known_log;
  EXPECT_EQ(predict(run, {data, (dir / "pk.csv").string(), false}, known_log), 113);
  EXPECT_NE(read_csv((dir / "pu.csv").string()), read_csv((dir / "pk.csv").string()));
}

// With data.known_future, predict still fills the missing input cells as the run's data.missing
// does: a gap before the future rows costs no window (only the future rows' cells stay empty).
// 60 hourly rows of signal, promo (known ahead) and y, and two rows to come with promo only; signal
// missing at row `gap`, promo at `known_gap`.
std::string write_known_future_file(const fs::path& dir, const std::string& name, int gap,
                                    int known_gap = -1) {
  std::ofstream f(dir / name);
  f << "when,signal,promo,y\n";
  for (int i = 0; i < 62; ++i) {
    const int promo = (i * 7) % 5 == 0;
    f << io::format_datetime(int64_t{1577836800} + i * int64_t{3600}, false) << ",";
    if (i < 60 && i != gap) f << std::sin(0.3 * i);
    f << ",";
    if (i != known_gap) f << promo;
    f << ",";
    if (i < 60) f << std::sin(0.3 * i) + promo;
    f << "\n";
  }
  return (dir / name).string();
}

TEST(Predict, KnownFutureKeepsFillingMissingInputs) {
  const fs::path dir = test::temp_dir("known_future_gaps");
  auto write = [&](const std::string& name, int gap, int known_gap = -1) {
    return write_known_future_file(dir, name, gap, known_gap);
  };
  std::ostringstream log;
  train(Config::parse("data: {path: " + write("d.csv", 20) +
                          ", date_column: when, features: [signal], targets: [y], lookback: 6, "
                          "horizon: 2, known_future: [promo], missing: interpolate}\n"
                          "model: {hidden: 4}\ntrain: {epochs: 1, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "k.yaml"),
        log);
  std::ostringstream whole, gap;
  const int64_t all = predict((dir / "run").string(),
                              {write("whole.csv", -1), (dir / "pw.csv").string(), false}, whole);
  EXPECT_EQ(predict((dir / "run").string(),
                    {write("gap.csv", 30), (dir / "pg.csv").string(), false}, gap),
            all);
  EXPECT_HAS(gap.str(), "1 missing cells of 'signal' filled");
  std::ostringstream known_gap;  // so is a gap in a known column, as training filled it
  EXPECT_EQ(predict((dir / "run").string(),
                    {write("known_gap.csv", -1, 40), (dir / "pk.csv").string(), false}, known_gap),
            all);
}

// With data.missing: mask, predict's note counts the cells it masks, not a series' rows to come.
TEST(Predict, KnownFutureMaskCountsTheCellsItMasks) {
  const fs::path dir = test::temp_dir("known_future_mask");
  auto write = [&](const std::string& name, int gap) {
    return write_known_future_file(dir, name, gap);
  };
  std::ostringstream log, out;
  train(Config::parse("data: {path: " + write("d.csv", 20) +
                          ", date_column: when, features: [signal], targets: [y], lookback: 6, "
                          "horizon: 2, known_future: [promo], missing: mask}\n"
                          "model: {hidden: 4}\ntrain: {epochs: 1, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "k.yaml"),
        log);
  EXPECT_GT(
      predict((dir / "run").string(), {write("gap.csv", 30), (dir / "p.csv").string(), false}, out),
      0);
  EXPECT_HAS(out.str(), "data.missing mask: 1 missing cells of 'signal' masked");
}

// data.known_future in predict: the future rows at the file's end give the known values of the
// last forecasts (and their dates); without them the windows that need them are left out, said.
TEST(Predict, KnownFutureValuesComeFromTheFutureRows) {
  const fs::path dir = test::temp_dir("known_future");
  auto hours = [](int i) {
    return io::format_datetime(int64_t{1577836800} + i * int64_t{3600}, false);
  };
  auto write = [&](const std::string& name, int rows, int future) {
    std::ofstream f(dir / name);
    f << "when,signal,promo,y\n";
    for (int i = 0; i < rows + future; ++i) {
      const int promo = (i * 7) % 5 == 0;
      f << hours(i) << ",";
      if (i < rows) f << std::sin(0.3 * i);
      f << "," << promo << ",";
      if (i < rows) f << std::sin(0.3 * i) + promo;
      f << "\n";
    }
    return (dir / name).string();
  };
  std::ostringstream log;
  train(Config::parse("data: {path: " + write("d.csv", 150, 0) +
                          ", date_column: when, features: [signal], targets: [y], lookback: 6, "
                          "horizon: 2, known_future: [promo]}\nmodel: {hidden: 8}\n"
                          "train: {epochs: 1, run_dir: " +
                          (dir / "run").string() + "}\n",
                      "k.yaml"),
        log);
  std::ostringstream out;
  EXPECT_EQ(
      predict((dir / "run").string(), {write("f.csv", 30, 2), (dir / "p.csv").string(), true}, out),
      1);
  auto p = read_csv((dir / "p.csv").string());
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1][0], hours(29));
  EXPECT_EQ(p[1][1], hours(30));
  EXPECT_EQ(p[2][1], hours(31));
  // An empty input cell before the last window changes nothing; one in it is named (the window
  // is not silently moved back for it).
  auto emptied = [&](const std::string& name, int row) {
    std::string text = io::read_file((dir / "f.csv").string());
    size_t at = 0;
    for (int line = 0; line <= row; ++line) at = text.find('\n', at) + 1;
    const size_t comma = text.find(',', at);
    text.erase(comma + 1, text.find(',', comma + 1) - comma - 1);
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  std::ostringstream early;
  EXPECT_EQ(predict((dir / "run").string(),
                    {emptied("early.csv", 5), (dir / "pe.csv").string(), true}, early),
            1);
  EXPECT_EQ(read_csv((dir / "pe.csv").string()), p);
  EXPECT_NE(error_of([&] {
              predictions((dir / "run").string(), emptied("in.csv", 27), true);
            }).find("in.csv:29: column 'signal': empty cell in the last window of the file"),
            std::string::npos);
  // Every window (no --last) of a run without data.missing: the rows to come may leave the
  // other cells empty, nothing before them.
  std::ostringstream every;
  predict((dir / "run").string(), {(dir / "f.csv").string(), (dir / "pa.csv").string(), false},
          every);
  const auto all = read_csv((dir / "pa.csv").string());
  ASSERT_GT(all.size(), 3u);
  EXPECT_EQ(all[all.size() - 2][0], hours(29));
  EXPECT_EQ(all[all.size() - 2][1], hours(30));
  EXPECT_EQ(all.back()[1], hours(31));
  EXPECT_NE(error_of([&] {
              predictions((dir / "run").string(), emptied("early.csv", 5), false);
            }).find("early.csv:7: column 'signal': a missing cell before its series' last value"),
            std::string::npos);
  std::ostringstream without;
  predict((dir / "run").string(), {write("g.csv", 30, 0), (dir / "q.csv").string(), true}, without);
  // Said per series: --last forecasts no other window, so none is "left out".
  EXPECT_EQ(without.str().find("windows are left out"), std::string::npos) << without.str();
  EXPECT_NE(without.str().find("--last: 1 series forecast from a window before their last row "
                               "(the window ends 2 rows before the last, at " +
                               hours(27) + " against " + hours(29) +
                               "): data.known_future needs its values for the steps ahead"),
            std::string::npos)
      << without.str();
  EXPECT_EQ(out.str().find("--last:"), std::string::npos) << out.str();
  p = read_csv((dir / "q.csv").string());
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1][0], hours(27));
  // Masking missing inputs never makes up a known value that is not in the file.
  train(Config::parse("data: {path: " + write("d.csv", 150, 0) +
                          ", date_column: when, features: [signal], targets: [y], lookback: 6, "
                          "horizon: 2, known_future: [promo], missing: mask}\n"
                          "model: {hidden: 8}\ntrain: {epochs: 1, run_dir: " +
                          (dir / "masked").string() + "}\n",
                      "m.yaml"),
        log);
  std::ostringstream masked;
  predict((dir / "masked").string(), {write("g.csv", 30, 0), (dir / "m.csv").string(), true},
          masked);
  EXPECT_NE(masked.str().find("--last: 1 series forecast from a window before their last row"),
            std::string::npos)
      << masked.str();
  // Nor does it forecast from a window ending in the future rows, more of them than the horizon:
  // those rows' inputs are not known yet.
  std::ostringstream ahead;
  predict((dir / "masked").string(), {write("f4.csv", 30, 4), (dir / "m4.csv").string(), true},
          ahead);
  EXPECT_EQ(ahead.str().find("--last:"), std::string::npos) << ahead.str();
  p = read_csv((dir / "m4.csv").string());
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1][0], hours(29));
  EXPECT_EQ(p[1][1], hours(30));
  EXPECT_EQ(p[2][1], hours(31));
  std::ostringstream every_masked;  // every window: none ends in the future rows either
  predict((dir / "masked").string(), {write("f4.csv", 30, 4), (dir / "ma.csv").string(), false},
          every_masked);
  EXPECT_EQ(read_csv((dir / "ma.csv").string()).back()[0], hours(29));
  // The hour of the rows forecast, a calendar feature, needs no future rows.
  train(Config::parse("data: {path: " + write("d.csv", 150, 0) +
                          ", date_column: when, features: [signal], targets: [y], lookback: 6, "
                          "horizon: 2, calendar: [hour], known_future: [hour]}\n"
                          "model: {hidden: 8}\ntrain: {epochs: 1, run_dir: " +
                          (dir / "hour").string() + "}\n",
                      "h.yaml"),
        log);
  std::ostringstream hour;
  predict((dir / "hour").string(), {write("g.csv", 30, 0), (dir / "r.csv").string(), true}, hour);
  EXPECT_EQ(hour.str().find("left out"), std::string::npos) << hour.str();
  p = read_csv((dir / "r.csv").string());
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[1][0], hours(29));
  EXPECT_EQ(p[2][1], hours(31));
}

// model.output every_step: the loss covers a forecast after every step of a window, and eval,
// predict and the errors take the last step's. Validation windows of 200 hourly rows, horizon 2:
// last rows 159..177; their MAE from predict's rows is the logged val_mae.
TEST(Runs, EveryStepOutputsForecastFromTheLastStep) {
  const fs::path dir = test::temp_dir("every_step");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  std::ostringstream log;
  train(Config::parse(yaml(data, dir / "run", "  horizon: 2\n"), "e.yaml",
                      {"model.output=every_step"}),
        log);
  const nlohmann::json m = metrics_of(dir / "run").back();
  EXPECT_EQ(evaluate((dir / "run").string(), "val").at("val_loss"), m.at("val_loss").get<double>());
  std::ostringstream out;
  predict((dir / "run").string(), {data, (dir / "p.csv").string(), false}, out);
  const auto p = read_csv((dir / "p.csv").string());
  double abs = 0;
  int values = 0;
  for (size_t i = 1; i < p.size(); ++i) {
    const int64_t last = (*io::parse_datetime(p[i][0]) - int64_t{1577836800}) / 3600;
    if (last < 159 || last > 177) continue;
    abs += std::fabs(std::stod(p[i][3]) - std::stod(p[i][4]));
    ++values;
  }
  ASSERT_EQ(values, 19 * 2);
  EXPECT_NEAR(abs / values, m.at("val_mae").get<double>(), 1e-5 * abs / values);
  // A masked autoencoder has an output at every step already.
  EXPECT_NE(error_of([&] {
              train(Config::parse(yaml(data, dir / "bad"), "e.yaml",
                                  {"model.output=every_step", "data.task=mae"}),
                    log);
            }).find("model.output every_step is for forecasters"),
            std::string::npos);
}

// model.output final_states: a bidirectional model's head reads both directions' final states
// (h_n), a model of its own that eval rebuilds from the run; a masked autoencoder has no head of
// that kind.
TEST(Runs, FinalStatesHeadIsTheRunsOwn) {
  const fs::path dir = test::temp_dir("final_states");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  std::ostringstream log;
  for (const char* output : {"last", "final_states"})
    train(Config::parse(yaml(data, dir / output), "f.yaml",
                        {std::string("model.output=") + output, "model.bidirectional=true"}),
          log);
  const nlohmann::json last = metrics_of(dir / "last").back(),
                       final_states = metrics_of(dir / "final_states").back();
  EXPECT_NE(last.at("val_loss").get<double>(), final_states.at("val_loss").get<double>());
  EXPECT_EQ(evaluate((dir / "final_states").string(), "val").at("val_loss"),
            final_states.at("val_loss").get<double>());
  const std::string layout =
      io::SafetensorsFile::read((dir / "final_states" / "model.safetensors").string())
          .metadata()
          .at("seqforge.layout");
  EXPECT_NE(layout.find("torch.cat([h_n[-2], h_n[-1]], 1)"), std::string::npos) << layout;
  EXPECT_NE(error_of([&] {
              train(Config::parse(yaml(data, dir / "bad"), "f.yaml",
                                  {"model.output=final_states", "data.task=mae"}),
                    log);
            }).find("model.output final_states is for forecasters and classifiers"),
            std::string::npos);
}

// train.loss quantile: the model forecasts each quantile of every step (here 2 steps of 3
// quantiles); predict writes them ascending in a column each, and eval's pinball loss and
// coverage on a file are those of predict's columns by their definitions.
TEST(Runs, QuantileForecastsAreScoredByTheirDefinition) {
  const fs::path dir = test::temp_dir("quantile");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  std::ostringstream log;
  train(Config::parse(yaml(data, dir / "run", "  horizon: 2\n"), "q.yaml",
                      {"train.loss=quantile", "train.quantiles=[0.1, 0.5, 0.9]"}),
        log);
  const nlohmann::json m = metrics_of(dir / "run").back();
  EXPECT_TRUE(m.contains("val_pinball") && m.contains("val_coverage") && m.contains("val_mae_h2"));
  // Quantiles without the quantile loss would forecast one value: said at start-up.
  std::ostringstream point;
  train(Config::parse(yaml(data, dir / "point"), "q.yaml",
                      {"train.quantiles=[0.2, 0.8]", "train.epochs=1"}),
        point);
  EXPECT_NE(point.str().find("train.quantiles is set but train.loss is mse"), std::string::npos)
      << point.str();
  EXPECT_EQ(log.str().find("has no 0.5"), std::string::npos) << log.str();
  // Without the median, the quantile that stands for it is named.
  std::ostringstream no_median;
  train(Config::parse(yaml(data, dir / "no_median"), "q.yaml",
                      {"train.loss=quantile", "train.quantiles=[0.1, 0.9]", "train.epochs=1"}),
        no_median);
  EXPECT_NE(no_median.str().find("note: train.quantiles has no 0.5: the errors, the skill and "
                                 "MASE score the 0.1 quantile"),
            std::string::npos)
      << no_median.str();
  const std::string fresh = write_hourly(dir / "fresh.csv", 40, true);
  std::ostringstream out;
  predict((dir / "run").string(), {fresh, (dir / "p.csv").string(), false}, out);
  const auto p = read_csv((dir / "p.csv").string());
  ASSERT_EQ(p[0], (std::vector<std::string>{"window_end", "forecast_for", "step", "y_q0.1",
                                            "y_q0.5", "y_q0.9", "y_actual"}));
  double pinball = 0, abs = 0;
  int covered = 0, values = 0;
  for (size_t i = 1; i < p.size(); ++i) {
    const double lo = std::stod(p[i][3]), mid = std::stod(p[i][4]), hi = std::stod(p[i][5]);
    EXPECT_LE(lo, mid);
    EXPECT_LE(mid, hi);
    // eval scores windows whose every step is in the file: rows come in pairs, steps 1 and 2
    const size_t step2 = p[i][2] == "1" ? i + 1 : i;
    if (p[step2][6].empty()) continue;
    const double y = std::stod(p[i][6]);
    const double level[] = {0.1, 0.5, 0.9}, f[] = {lo, mid, hi};
    for (int q = 0; q < 3; ++q)
      pinball += std::max(level[q] * (y - f[q]), (level[q] - 1) * (y - f[q])) / 3;
    abs += std::fabs(mid - y);
    covered += lo <= y && y <= hi;
    ++values;
  }
  ASSERT_EQ(values, (40 - 8 - 1) * 2);  // windows with both targets in the file
  const auto e = evaluate((dir / "run").string(), "", fresh);
  EXPECT_NEAR(e.at("data_pinball"), pinball / values, 1e-6);
  EXPECT_NEAR(e.at("data_mae"), abs / values, 1e-6);
  EXPECT_NEAR(e.at("data_coverage"), double(covered) / values, 1e-12);
  // A quantile outside (0, 1), or out of order, is named.
  const std::string bad = error_of([&] {
    train(Config::parse(yaml(data, dir / "bad"), "q.yaml",
                        {"train.loss=quantile", "train.quantiles=[0.5, 0.2]"}),
          log);
  });
  EXPECT_NE(bad.find("train.quantiles must be ascending"), std::string::npos) << bad;
  EXPECT_NE(error_of([&] {
              train(Config::parse(yaml(data, dir / "bad"), "q.yaml",
                                  {"train.loss=quantile", "train.quantiles=[1.5]"}),
                    log);
            }).find("'1.5' is not a quantile"),
            std::string::npos);
}

// train.loss: a forecaster trains on it and val_loss is it (eval reproduces the logged value);
// a classifier's loss is cross-entropy, so a regression loss there is refused by name.
TEST(Runs, RegressionLossesTrainForecastersAndAreRefusedForClassifiers) {
  const fs::path dir = test::temp_dir("losses");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  std::ostringstream log;
  std::map<std::string, double> val_loss;
  for (const char* kind : {"mse", "mae", "huber"}) {
    const fs::path run = dir / kind;
    train(Config::parse(yaml(data, run), "l.yaml",
                        {std::string("train.loss=") + kind, "train.huber_delta=0.5"}),
          log);
    val_loss[kind] = metrics_of(run).back().at("val_loss").get<double>();
    EXPECT_EQ(evaluate(run.string(), "val").at("val_loss"), val_loss[kind]) << kind;
  }
  EXPECT_NE(val_loss["mse"], val_loss["mae"]);
  EXPECT_NE(val_loss["mae"], val_loss["huber"]);
  EXPECT_EQ(error_of([&] {
              train(Config::parse(yaml(data, dir / "c"), "l.yaml",
                                  {"data.task=classify", "data.class_column=y", "data.targets=[]",
                                   "train.loss=mae"}),
                    log);
            }),
            "override 'train.loss=mae': train.loss mae is a regression loss; a classifier or "
            "language model trains on cross-entropy");
  EXPECT_EQ(error_of([&] {
              train(Config::parse(yaml(data, dir / "q"), "l.yaml", {"train.loss=l3"}), log);
            }),
            "override 'train.loss=l3': train.loss must be mse, mae, huber or quantile, got 'l3'");
}

TEST(Runs, ValidationShareZeroMeansNoValidation) {
  const fs::path dir = test::temp_dir("no_val");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  std::ostringstream log;
  const TrainSummary s = train(
      Config::parse(yaml(data, dir / "run"), "v.yaml", {"data.split.val=0", "train.save=best"}),
      log);
  EXPECT_EQ(s.monitor, "train_loss");
  EXPECT_NE(log.str().find("no validation"), std::string::npos) << log.str();
  for (const auto& line : metrics_of(dir / "run")) {
    EXPECT_TRUE(line.contains("train_loss"));
    for (const auto& [key, value] : line.items()) EXPECT_NE(key.rfind("val_", 0), 0u) << key;
  }
  // A validation share too small for one window is an error before training, with the counts:
  // shorter than a window with whole windows (strict), or no row at all (history).
  const std::string e = error_of([&] {
    train(Config::parse(yaml(data, dir / "run2"), "v.yaml",
                        {"data.split.val=0.02", "data.split.context=strict"}),
          log);
  });
  EXPECT_NE(e.find("validation 0"), std::string::npos) << e;
  EXPECT_NE(e.find("(data.split.context: strict keeps whole windows inside it; history would "
                   "not)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("data.split.val: 0"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "run2"));
  const std::string none = error_of([&] {
    train(Config::parse(yaml(data, dir / "run2"), "v.yaml", {"data.split.val=0.004"}), log);
  });
  EXPECT_NE(none.find("validation 0"), std::string::npos) << none;
  EXPECT_NE(none.find("(or the validation parts are empty)"), std::string::npos) << none;
  EXPECT_FALSE(fs::exists(dir / "run2"));
  // Watching a validation metric without validation is an error too.
  EXPECT_NE(error_of([&] {
              train(Config::parse(yaml(data, dir / "run3"), "v.yaml",
                                  {"data.split.val=0", "train.early_stopping.monitor=val_loss"}),
                    log);
            }).find("train.early_stopping.monitor"),
            std::string::npos);
}

TEST(Runs, NonFiniteLossStopsTheRunAndSavesNothingFromIt) {
  const fs::path dir = test::temp_dir("nan");
  const std::string data = write_hourly(dir / "d.csv", 200, true);
  std::ostringstream log;
  // Diverged (which a study tells from other failures), with what was kept.
  const auto diverged = [&](const std::string& run, const std::vector<std::string>& overrides) {
    try {
      train(Config::parse(yaml(data, dir / run), "n.yaml", overrides), log);
    } catch (const Diverged& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << run << ": no Diverged";
    return std::string();
  };
  const std::string e =
      diverged("run", {"optim.kind=sgd", "optim.lr=1e30", "train.epochs=5", "train.save=last"});
  EXPECT_NE(e.find("epoch 1, step"), std::string::npos) << e;
  EXPECT_NE(e.find("lower optim.lr"), std::string::npos) << e;
  EXPECT_NE(e.find("no model was saved yet"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir / "run" / "model.safetensors"));
  // After two good epochs the rate grows 1e12-fold: the best epoch's checkpoint stays.
  const std::string later =
      diverged("later", {"optim.lr=1e-3", "train.schedule=step", "train.step_epochs=2",
                         "train.gamma=1e12", "train.epochs=5", "train.save=best"});
  EXPECT_NE(later.find("epoch 3, step"), std::string::npos) << later;
  EXPECT_NE(later.find("later/model.safetensors holds the last finite model"), std::string::npos)
      << later;
  EXPECT_TRUE(fs::exists(dir / "later" / "model.safetensors"));
}

TEST(Metrics, MacroF1CountsOnlyClassesSeen) {
  // Classes 0 and 1 seen; class 2 in neither the truth nor the predictions.
  EXPECT_DOUBLE_EQ(macro_f1({3, 1, 0}, {1, 0, 0}, {0, 1, 0}), (6.0 / 7 + 2.0 / 3) / 2);
  // A class predicted but never true counts (F1 0).
  EXPECT_DOUBLE_EQ(macro_f1({2, 0}, {0, 1}, {1, 0}), (4.0 / 5 + 0) / 2);
  EXPECT_EQ(macro_f1({0, 0}, {0, 0}, {0, 0}), 0.0);
}

}  // namespace
}  // namespace seqforge::inference_test
