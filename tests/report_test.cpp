// The run report: curves from metrics.jsonl, predictions and confusion matrices, escaping, and the
// report the trainer writes at the end of a run.
#include "seqforge/report/report.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "io/file_util.hpp"
#include "report/chart.hpp"
#include "report/metrics_log.hpp"
#include "seqforge/io/safetensors.hpp"
#include "seqforge/train/trainer.hpp"
#include "test_util.hpp"

namespace seqforge::report_test {
namespace {

namespace fs = std::filesystem;

fs::path run_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("seqforge_report_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(Report, DrawsCurvesAndForecastPredictions) {
  const fs::path dir = run_dir("forecast");
  write(dir / "metrics.jsonl",
        "{\"epoch\":1,\"train_loss\":0.9,\"val_loss\":0.8,\"val_rmse\":2.0,\"lr\":0.001,"
        "\"samples_per_second\":1000,\"epoch_seconds\":1.5,\"train_seconds\":1.2,"
        "\"cpu_percent\":180,\"rss_mb\":30,\"peak_rss_mb\":31}\n"
        "{\"epoch\":2,\"train_loss\":0.5,\"val_loss\":null,\"val_rmse\":1.5,\"lr\":0.0005,"
        "\"samples_per_second\":1100,\"epoch_seconds\":1.4,\"train_seconds\":1.1}\n"
        "{\"epoch\":3,\"train_loss\":0.3,\"val_loss\":0.4,\"val_rmse\":1.2,\"lr\":0.0001,"
        "\"samples_per_second\":1050,\"epoch_seconds\":1.4,\"train_seconds\":1.1}\n");
  write(dir / "config.resolved.yaml",
        "data:\n  task: forecast\n  targets: [temperature]\ntrain:\n  epochs: 3\n");
  write(dir / "val_predictions.csv", "row,actual,predicted\n10,1.5,1.4\n11,2.5,2.0\n12,3.0,3.5\n");
  const std::string html = render_run_report(dir.string());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("data-series=\"train\""), std::string::npos);
  EXPECT_NE(html.find("data-series=\"validation\""), std::string::npos);
  EXPECT_NE(html.find(">val_rmse<"), std::string::npos);
  EXPECT_NE(html.find("Throughput"), std::string::npos);
  EXPECT_NE(html.find("Learning rate"), std::string::npos);
  EXPECT_NE(html.find("CPU use"), std::string::npos);
  EXPECT_NE(html.find("temperature: predicted vs actual"), std::string::npos);
  EXPECT_NE(html.find("MAE 0.3667"), std::string::npos) << "mean |actual - predicted|";
  EXPECT_NE(html.find(" one step ahead, predicted by the saved model"), std::string::npos);
  // Loss, val_rmse, samples/s, lr, epoch time (2), cpu, memory (2), predictions (2).
  EXPECT_EQ(count(html, "<polyline"), 12u);
  // The null validation loss of epoch 2 is left out, not drawn as zero: 2 points.
  const size_t at = html.find("data-series=\"validation\"");
  const std::string points = html.substr(at, html.find("/>", at) - at);
  EXPECT_EQ(count(points, ","), 2u) << points;
  // Self-contained: no scripts, no external resources.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(count(html, "http"), count(html, "http://www.w3.org/2000/svg"));
}

TEST(Report, ConfusionMatrixForClassificationWithEscapedNames) {
  const fs::path dir = run_dir("classify");
  write(dir / "metrics.jsonl", "{\"epoch\":1,\"train_loss\":1.0,\"val_loss\":0.9}\n");
  write(dir / "config.resolved.yaml", "data:\n  task: classify\n");
  write(dir / "val_predictions.csv",
        "row,actual,predicted\n1,rain,rain\n2,rain,sun\n3,sun,sun\n4,<b>snow,sun\n5,sun,sun\n");
  const std::string html = render_run_report(dir.string());
  EXPECT_NE(html.find("Confusion matrix"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;snow"), std::string::npos);
  EXPECT_EQ(html.find("<b>snow"), std::string::npos);
  EXPECT_NE(html.find("Accuracy 60.0%"), std::string::npos);
  EXPECT_NE(html.find(">50.0%</td>"), std::string::npos) << "recall of rain";
  EXPECT_NE(html.find(">100.0%</td>"), std::string::npos) << "recall of sun";
}

// A right-to-left override in a name would show the numbers after it backwards (3.994 as
// 499.3): bidirectional controls are written as their codes.
TEST(Report, BidirectionalControlsInNamesAreShownAsCodes) {
  using report::escape;
  EXPECT_EQ(escape("A\u202E 3.994"), "A\\u202e 3.994");
  EXPECT_EQ(escape("\u2066x\u2069\u200F\u061C"), "\\u2066x\\u2069\\u200f\\u061c");
  EXPECT_EQ(escape("\u2014 <\u00e9>"), "\u2014 &lt;\u00e9&gt;");  // other characters kept
}

TEST(Report, MarksTheSavedEpochShowsTheTestSplitAndDates) {
  const fs::path dir = run_dir("saved");
  write(dir / "metrics.jsonl",
        "{\"epoch\":1,\"train_loss\":100,\"val_loss\":50,\"checkpoint\":true}\n"
        "{\"epoch\":2,\"train_loss\":1,\"val_loss\":0.5,\"checkpoint\":true}\n"
        "{\"epoch\":3,\"train_loss\":0.01,\"val_loss\":0.7,\"checkpoint\":false}\n"
        "{\"split\":\"test\",\"model_epoch\":2,\"test_loss\":0.61,\"test_rmse\":1.25}\n");
  write(dir / "config.resolved.yaml",
        "data:\n  task: forecast\n  targets: [t]\ntrain:\n  early_stopping:\n    monitor: "
        "val_loss\n");
  write(dir / "val_predictions.csv",
        "row,time,series,actual,predicted\n5,2020-01-01,\"a, b\",1,2\n6,2020-01-02,\"a, b\",2,2\n"
        "7,2020-01-03,\"a, b\",3,2\n5,2020-01-01,other,9,9\n");
  const std::string html = render_run_report(dir.string());
  EXPECT_NE(html.find("saved model: epoch 2 (val_loss 0.5)"), std::string::npos);
  EXPECT_NE(html.find("class=\"mark\""), std::string::npos);
  EXPECT_NE(html.find("Loss (log scale)"), std::string::npos) << "the loss spans 4 decades";
  EXPECT_NE(html.find("<h2>Test split</h2>"), std::string::npos);
  EXPECT_NE(html.find("(epoch 2)"), std::string::npos);
  EXPECT_NE(html.find("<th>test_rmse</th>"), std::string::npos);
  EXPECT_NE(html.find(">1.25</td>"), std::string::npos);
  // Dates on the x axis, one series (the first, its name unquoted), MAE over all windows.
  EXPECT_NE(html.find(">2020-01-02<"), std::string::npos) << html;
  EXPECT_NE(html.find("t: predicted vs actual (a, b)"), std::string::npos);
  EXPECT_NE(html.find("; MAE over every series 0.5"), std::string::npos) << html;
  // A kill between epoch 2's line and its checkpoint's write: the model says which it is.
  const float w = 1;
  io::write_safetensors((dir / "model.safetensors").string(), {{"w", DType::f32, {1}, &w}},
                        {{"seqforge.epoch", "1"}});
  EXPECT_NE(render_run_report(dir.string()).find("saved model: epoch 1 (val_loss 50)"),
            std::string::npos);
  // The run's own report after epoch 2, whose checkpoint may still be being written: the lines'.
  EXPECT_NE(render_run_report(dir.string(), /*while_training=*/true)
                .find("saved model: epoch 2 (val_loss 0.5)"),
            std::string::npos);
  // A model that records no whole epoch is not believed.
  io::write_safetensors((dir / "model.safetensors").string(), {{"w", DType::f32, {1}, &w}},
                        {{"seqforge.epoch", "nan"}});
  EXPECT_NE(render_run_report(dir.string()).find("saved model: epoch 2 (val_loss 0.5)"),
            std::string::npos);
}

// A sensor's windows 250 ms apart: each at its own x (in order, none merged to its second), the
// axis labelled in seconds.
TEST(Report, DatesAFractionOfASecondApartKeepTheirOrder) {
  const fs::path dir = run_dir("subsecond");
  write(dir / "metrics.jsonl",
        "{\"epoch\":1,\"train_loss\":1,\"val_loss\":1,\"checkpoint\":true}\n");
  write(dir / "config.resolved.yaml", "data:\n  task: forecast\n  targets: [t]\n");
  std::string csv = "row,time,actual,predicted\n";
  for (int k = 0; k < 80; ++k)
    csv += std::to_string(k + 1) + ",2024-03-01 10:00:" + (k < 40 ? "0" : "") +
           std::to_string(k / 4) + "." + std::to_string(k % 4 * 25) + (k % 4 ? "0" : "00") + "," +
           std::to_string(k % 4) + "," + std::to_string(k % 4) + "\n";
  write(dir / "val_predictions.csv", csv);
  const std::string html = render_run_report(dir.string());
  EXPECT_NE(html.find(">10:00:10<"), std::string::npos) << html;
  const size_t line = html.find("<polyline", html.find("t: predicted vs actual"));
  ASSERT_NE(line, std::string::npos);
  const size_t from = html.find("points=\"", line) + 8;
  std::istringstream points(html.substr(from, html.find('"', from) - from));
  std::vector<double> xs;
  for (std::string point; points >> point;)
    xs.push_back(std::stod(point.substr(0, point.find(','))));
  ASSERT_EQ(xs.size(), 80u);
  for (size_t i = 1; i < xs.size(); ++i) EXPECT_GT(xs[i], xs[i - 1]) << i;
}

TEST(Report, ConfusionMatrixHasEveryClassWithPrecisionRecallF1) {
  const fs::path dir = run_dir("confusion");
  write(dir / "metrics.jsonl", "{\"epoch\":1,\"train_loss\":1.0,\"val_loss\":0.9}\n");
  write(dir / "config.resolved.yaml", "data:\n  task: classify\n");
  // rain: 2 actual, 1 right; sun: 2 actual, 2 right, predicted 3 times.
  write(dir / "val_predictions.csv",
        "row,actual,predicted\n1,rain,rain\n2,rain,sun\n3,sun,sun\n4,sun,sun\n");
  const std::string html = render_run_report(dir.string());
  // rain: precision 1/1, recall 1/2, F1 2/3; sun: precision 2/3, recall 2/2, F1 0.8.
  EXPECT_NE(html.find("<td>2</td><td>100.0%</td><td>50.0%</td><td>0.667</td>"), std::string::npos)
      << html;
  EXPECT_NE(html.find("<td>2</td><td>66.7%</td><td>100.0%</td><td>0.800</td>"), std::string::npos);
}

// Thousands of classes: no matrix (its cells grow as their square), the classes present with their
// scores and the pairs most often confused; the report stays small.
TEST(Report, ManyClassesListThePresentOnesAndTheMostConfusedPairs) {
  const fs::path dir = run_dir("many_classes");
  write(dir / "metrics.jsonl", "{\"epoch\":1,\"train_loss\":1.0,\"val_loss\":0.9}\n");
  write(dir / "config.resolved.yaml", "data:\n  task: classify\n");
  std::string rows = "row,actual,predicted\n";
  for (int i = 0; i < 2000; ++i)  // c<i> mostly taken for c<i+1>; c0 always right
    rows += std::to_string(i + 1) + ",c" + std::to_string(i) + ",c" +
            std::to_string(i == 0 ? 0 : i + 1) + "\n";
  rows += "2001,c7,c8\n2002,c0,c0\n";
  write(dir / "val_predictions.csv", rows);
  const std::string html = render_run_report(dir.string());
  EXPECT_EQ(html.find("Confusion matrix"), std::string::npos);
  EXPECT_NE(html.find("2001 classes, too many for a confusion matrix"), std::string::npos);
  EXPECT_LT(html.size(), 400000u);
  // The most confused pair first, then c0 (2 windows, always right) leads the classes.
  EXPECT_NE(html.find("<tr><td class=\"text\">c7</td><td class=\"text\">c8</td><td>2</td></tr>"),
            std::string::npos);
  EXPECT_NE(html.find("<tr><td class=\"text\">c0</td><td>2</td><td>100.0%</td><td>100.0%</td>"
                      "<td>1.000</td></tr>"),
            std::string::npos);
  EXPECT_NE(html.find("Accuracy 0.1% of 2002 windows"), std::string::npos);
}

TEST(Report, MaeRunsShowReconstructedWindows) {
  const fs::path dir = run_dir("mae");
  write(dir / "metrics.jsonl", "{\"epoch\":1,\"train_loss\":1.0,\"val_loss\":0.9}\n");
  write(dir / "config.resolved.yaml", "data:\n  task: mae\n");
  std::string csv = "window,step,feature,original,reconstructed,masked\n";
  for (int w = 1; w <= 2; ++w)
    for (int u = 1; u <= 5; ++u)
      csv += std::to_string(w) + "," + std::to_string(u) + ",close," + std::to_string(u * 0.1) +
             "," + std::to_string(u * 0.11) + "," + (u == 3 ? "1" : "0") + "\n";
  write(dir / "val_reconstructions.csv", csv);
  const std::string html = render_run_report(dir.string());
  EXPECT_NE(html.find("Reconstructions (validation split)"), std::string::npos);
  EXPECT_EQ(count(html, "aria-label=\"window "), 2u);
  EXPECT_NE(html.find("data-series=\"reconstructed\""), std::string::npos);
}

TEST(Report, WritesReportHtmlAndNeedsMetrics) {
  const fs::path dir = run_dir("write");
  EXPECT_NE(test::error_of([&] { write_run_report(dir.string()); }).find("metrics.jsonl"),
            std::string::npos);
  write(dir / "metrics.jsonl", "{\"epoch\":1,\"train_loss\":1.0}\n");
  EXPECT_EQ(write_run_report(dir.string()), (dir / "report.html").string());
  EXPECT_NE(io::read_file((dir / "report.html").string()).find("</html>"), std::string::npos);
}

// `name` in `dir` written as `text`: the report is refused with one line naming the file and
// `message`.
void expect_refused(const fs::path& dir, const std::string& name, const std::string& text,
                    const std::string& message) {
  write(dir / name, text);
  const std::string e = test::error_of([&] { render_run_report(dir.string()); });
  EXPECT_NE(e.find((dir / name).string() + message), std::string::npos) << text << " -> " << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

// Every line of metrics.jsonl is read as the trainer writes it: a damaged one is one error naming
// the file and line, never a curve with a point left out; a last line without its newline (being
// written, or cut by a kill) is left out.
TEST(Report, DamagedMetricsLinesAreErrorsNamingTheLine) {
  const fs::path dir = run_dir("damaged");
  const std::string good =
      "{\"checkpoint\":true,\"epoch\":1,\"train_loss\":1.0,\"val_loss\":null}\n"
      "{\"checkpoint\":false,\"epoch\":2,\"train_loss\":0.5,\"val_loss\":0.4}\n";
  write(dir / "metrics.jsonl", good + "{\"checkpoint\":false,\"epoch\":3,\"train_lo");
  const std::string html = render_run_report(dir.string());
  EXPECT_NE(html.find(" 2 epochs"), std::string::npos);
  EXPECT_EQ(read_metrics_log((dir / "metrics.jsonl").string()).cut_short, 3);
  write(dir / "metrics.jsonl", good);
  EXPECT_EQ(read_metrics_log((dir / "metrics.jsonl").string()).cut_short, 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{not json\n", ":3: not a JSON object"},
      {"[1, 2]\n", ":3: not a JSON object"},
      {"{\"epoch\":3,\"val_loss\":NaN}\n", ":3: not a JSON object"},
      {"{\"epoch\":\"3\"}\n", ":3: \"epoch\" is \"3\", not a whole number of 1 or more"},
      {"{\"epoch\":2.5}\n", ":3: \"epoch\" is 2.5, not a whole number"},
      {"{\"epoch\":-1e308}\n", ":3: \"epoch\" is -1e+308, not a whole number"},
      {"{\"epoch\":2}\n", ":3: epoch 2 follows epoch 2: a line out of order, or two runs'"},
      {"{\"train_loss\":1}\n", ":3: neither an epoch's line"},
      {"{\"epoch\":3,\"checkpoint\":1}\n", ":3: \"checkpoint\" is 1, not true or false"},
      {"{\"epoch\":3,\"epoch_seconds\":\"fast\"}\n",
       ":3: \"epoch_seconds\" is \"fast\", not a number"},
      {"\n{\"split\":5}\n", ":4: \"split\" is 5, not \"test\""},
      {"{\"split\":\"test\",\"model_epoch\":{\"a\":1}}\n",
       ":3: \"model_epoch\" is {\"a\":1}, not a number"},
      // A last line without its newline is left out only if it begins as the trainer's do.
      {"\x7f\x45LF\x02\x01", ":3: not a JSON object"},
      {"{\"epoch\":3,\"stop\":7}\n", ":3: \"stop\" is 7, not a text"},
      {"{\"split\":\"test\",\"stop\":\"epochs\"}\n", ":3: \"stop\" is \"epochs\", not a text"},
  };
  for (const auto& [tail, message] : cases)
    expect_refused(dir, "metrics.jsonl", good + tail, message);
}

// The page says how the run ended, from its last epoch's "stop": a run killed or still training
// is not shown as a finished one.
TEST(Report, SaysHowTheRunEnded) {
  const fs::path dir = run_dir("ended");
  write(dir / "config.resolved.yaml", "data:\n  task: forecast\ntrain:\n  epochs: 50\n");
  const std::string two = "{\"epoch\":1,\"train_loss\":1}\n{\"epoch\":2,\"train_loss\":0.5";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {two + "}\n",
       "2 epochs of 50 &middot; not finished after epoch 2: still training, or stopped by a "
       "signal, a kill or an error"},
      {two + ",\"stop\":\"epochs\"}\n", "2 epochs of 50 &middot; finished"},
      {two + ",\"stop\":\"early_stopping\"}\n",
       "stopped early after epoch 2 (train.early_stopping)"},
      {two + ",\"stop\":\"pruned\"}\n", "pruned by the study after epoch 2"},
      {two + "}\n{\"split\":\"test\",\"test_loss\":1}\n", "&middot; finished"},
  };
  for (const auto& [metrics, said] : cases) {
    write(dir / "metrics.jsonl", metrics);
    EXPECT_NE(render_run_report(dir.string()).find(said), std::string::npos) << metrics;
  }
}

// A run that ends by its epochs, its patience or a caller says so in its last epoch's line.
TEST(Report, TheLastEpochsLineSaysWhyTheRunEnded) {
  const fs::path dir = run_dir("why_ended");
  write(dir / "s.csv", [] {
    std::string text = "t,v\n";
    for (int i = 0; i < 120; ++i) text += std::to_string(i) + "," + std::to_string(i % 7) + "\n";
    return text;
  }());
  auto run = [&](const std::string& name, const std::vector<std::string>& more,
                 TrainHooks hooks = {}) {
    std::vector<std::string> o = {"train.run_dir=" + (dir / name).string()};
    o.insert(o.end(), more.begin(), more.end());
    std::ostringstream log;
    train(Config::parse("data: {path: " + (dir / "s.csv").string() +
                            ", targets: [v], lookback: 4}\nmodel: {hidden: 4}\n"
                            "train: {epochs: 3, batch_size: 16}\n",
                        "e.yaml", o),
          log, "", hooks);
    const MetricsLog m = read_metrics_log((dir / name / "metrics.jsonl").string());
    for (size_t i = 0; i + 1 < m.epochs.size(); ++i) EXPECT_FALSE(m.epochs[i].contains("stop"));
    return std::pair{m.epochs.back().value("stop", ""), log.str()};
  };
  EXPECT_EQ(run("all", {}).first, "epochs");
  // A rate of 0 never improves on the first epoch: patience 1 ends the run after the second.
  EXPECT_EQ(run("patience", {"train.early_stopping.patience=1", "optim.lr=0"}).first,
            "early_stopping");
  TrainHooks hooks;
  hooks.on_epoch = [](int64_t epoch, const std::map<std::string, double>&) { return epoch < 2; };
  hooks.on_epoch_stop = "pruned";
  const auto [stop, log] = run("pruned", {}, hooks);
  EXPECT_EQ(stop, "pruned");
  EXPECT_NE(log.find("pruned by the study after epoch 2"), std::string::npos) << log;
}

// val_predictions.csv is read as the trainer writes it (class names quoted where they hold a
// comma, a quote or a line break); a damaged row is one error naming the file and line.
TEST(Report, PredictionsAreReadWholeOrRefusedNamingTheLine) {
  const fs::path dir = run_dir("predictions");
  write(dir / "metrics.jsonl", "{\"epoch\":1,\"train_loss\":1.0}\n");
  write(dir / "config.resolved.yaml", "data:\n  task: classify\n");
  write(dir / "val_predictions.csv",
        "row,actual,predicted\n1,\"two\nlines\",\"a, \"\"b\"\"\"\n2,\"a, \"\"b\"\"\",\"a, "
        "\"\"b\"\"\"\n3,sun,sun\n");
  const std::string html = render_run_report(dir.string());
  EXPECT_NE(html.find("Accuracy 66.7% of 3 windows"), std::string::npos) << html;
  EXPECT_NE(html.find("two\nlines"), std::string::npos);
  EXPECT_NE(html.find("a, &quot;b&quot;"), std::string::npos);
  write(dir / "config.resolved.yaml", "data:\n  task: forecast\n  targets: [t]\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"row,actual,predicted\n1,2,3\n2,3\n", ":3: 2 fields, the header has 3"},
      {"row,actual,predicted\n1,2,3\n2,3,4,5\n", ":3: 4 fields, the header has 3"},
      {"row,actual,predicted\n1,2,abc\n", ":2: column 'predicted' holds 'abc', not a number"},
      {"row,actual,predicted\n1,2,3\n\"2,3,4\n5,6,7\n", ":3: unterminated quoted field"},
  };
  for (const auto& [text, message] : cases)
    expect_refused(dir, "val_predictions.csv", text, message);
  write(dir / "val_predictions.csv", "row,actual,predicted\n1,nan,3\n2,inf,4\n3,,5\n");
  EXPECT_NE(render_run_report(dir.string()).find("3 windows"), std::string::npos);
}

TEST(Report, TrainerWritesPredictionsAndReport) {
  const fs::path dir = run_dir("trainer");
  {
    std::ofstream f(dir / "series.csv");
    f << "t,signal\n";
    for (int i = 0; i < 240; ++i) f << i << "," << std::sin(i * 0.3) << "\n";
  }
  const std::string yaml = "data:\n  path: " + (dir / "series.csv").string() +
                           "\n  features: [signal]\n  targets: [signal]\n"
                           "  lookback: 8\nmodel: {hidden: 8}\n"
                           "train: {epochs: 2, batch_size: 32, run_dir: " +
                           (dir / "run").string() + "}\n";
  std::ostringstream log;
  train(Config::parse(yaml, "r.yaml"), log);
  EXPECT_NE(log.str().find("report: "), std::string::npos) << log.str();
  std::ifstream predictions(dir / "run" / "val_predictions.csv");
  std::string header, line;
  std::getline(predictions, header);
  EXPECT_EQ(header, "row,actual,predicted");
  int rows = 0;
  while (std::getline(predictions, line)) ++rows;
  EXPECT_EQ(rows, static_cast<int>(evaluate((dir / "run").string(), "val").at("samples")));
  const std::string html = io::read_file((dir / "run" / "report.html").string());
  EXPECT_NE(html.find("signal: predicted vs actual"), std::string::npos);
  EXPECT_NE(html.find("CPU use"), std::string::npos);
  EXPECT_NE(html.find("<h2>Test split</h2>"), std::string::npos);
  // A masked autoencoder: a few validation windows, original against reconstructed.
  const std::string mae = "data:\n  path: " + (dir / "series.csv").string() +
                          "\n  task: mae\n  features: [signal]\n  lookback: 8\n"
                          "model: {hidden: 8, bidirectional: true}\n"
                          "train: {epochs: 1, batch_size: 32, run_dir: " +
                          (dir / "mae").string() + "}\n";
  train(Config::parse(mae, "m.yaml"), log);
  std::ifstream rec(dir / "mae" / "val_reconstructions.csv");
  std::getline(rec, header);
  EXPECT_EQ(header, "window,step,feature,original,reconstructed,masked");
  int masked = 0, rec_rows = 0;
  while (std::getline(rec, line)) ++rec_rows, masked += line.back() == '1';
  EXPECT_EQ(rec_rows, 4 * 8);  // four windows of 8 steps, one feature
  EXPECT_GE(masked, 4);        // at least one masked step per window
  EXPECT_NE(io::read_file((dir / "mae" / "report.html").string()).find("Reconstructions"),
            std::string::npos);
}

}  // namespace
}  // namespace seqforge::report_test

namespace seqforge::report_test {
namespace {

// Charts of hostile series: equal values, values an ulp apart, one point, missing (NaN) values,
// 1e-30 to 1e30, negative, huge. Every page is finite and small, with a bounded number of ticks.
TEST(Report, ChartsOfHostileSeriesStayFiniteAndSmall) {
  const fs::path dir = run_dir("hostile");
  write(dir / "config.resolved.yaml", "data:\n  task: forecast\n  targets: [t]\n");
  const double one = 0.43499;
  const std::vector<std::vector<double>> cases = {
      {one, one, one},
      {one, std::nextafter(one, 1.0), std::nextafter(std::nextafter(one, 1.0), 1.0)},
      {one},
      {1e-30, 1e30, 1.0},
      {-5.0, -5.0 + 1e-13, -4.999999999999},
      {1e300, 1.7e308, -1.7e308},
      {-1e-310, 1e-310, 0.0},
      {NAN, one, NAN},
      {NAN},
      {DBL_MAX, -DBL_MAX, 0.0, 1.0},
      {1e-30, 1e30, 1e-30, 1e30, 1e-20, 1e10},
      {5e-324, 1e-300, 1.0},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    std::string metrics;
    for (size_t e = 0; e < cases[c].size(); ++e) {
      char line[256];
      const double v = cases[c][e];
      const double other = std::isnan(v) ? v : std::nextafter(v, INFINITY);
      auto json = [](double x) {
        char buf[40];
        std::snprintf(buf, sizeof buf, "%.17g", x);
        return std::isfinite(x) ? std::string(buf) : std::string("null");  // as the trainer
      };
      std::snprintf(line, sizeof line,
                    "{\"epoch\":%zu,\"train_loss\":%s,\"val_loss\":%s,\"val_rmse\":%s,\"lr\":%s}\n",
                    e + 1, json(v).c_str(), json(other).c_str(), json(v).c_str(), json(v).c_str());
      metrics += line;
    }
    write(dir / "metrics.jsonl", metrics);
    std::string predictions = "row,actual,predicted\n";
    for (size_t i = 0; i < cases[c].size(); ++i)
      predictions += std::to_string(i + 1) + "," + std::to_string(cases[c][i]) + "," +
                     std::to_string(cases[c][i]) + "\n";
    write(dir / "val_predictions.csv", predictions);
    const std::string html = render_run_report(dir.string());
    EXPECT_LT(html.size(), 400000u) << "case " << c;
    EXPECT_LT(count(html, "<line"), 400u) << "case " << c;
    for (const char* bad : {"=\"nan", "=\"-nan", "=\"inf", "=\"-inf"})
      EXPECT_EQ(html.find(bad), std::string::npos) << "case " << c << ": " << bad;
  }
}

// The y coordinates of a chart's horizontal grid lines.
std::vector<double> grid_ys(const std::string& svg) {
  std::vector<double> ys;
  for (size_t at = svg.find("class=\"grid\""); at != std::string::npos;
       at = svg.find("class=\"grid\"", at + 1)) {
    const size_t line = svg.rfind("<line", at);
    const std::string tag = svg.substr(line, at - line);
    const size_t y1 = tag.find("y1=\""), y2 = tag.find("y2=\"");
    const double a = std::stod(tag.substr(y1 + 4)), b = std::stod(tag.substr(y2 + 4));
    if (a == b) ys.push_back(a);
  }
  return ys;
}

// The pages say charset utf-8: other bytes (a file name, a damaged config) become U+FFFD.
TEST(Report, EscapedTextIsUtf8) {
  EXPECT_EQ(report::escape("caf\xe9 <b>\xc3"), "caf\xef\xbf\xbd &lt;b&gt;\xef\xbf\xbd");
  EXPECT_EQ(report::escape("caf\xc3\xa9 & \xf0\x9f\x98\x80"), "caf\xc3\xa9 &amp; \xf0\x9f\x98\x80");
}

// The y axis's tick labels, top to bottom.
std::vector<std::string> y_labels(const std::string& svg) {
  std::vector<std::string> labels;
  const std::string mark = "text-anchor=\"end\" class=\"axis\">";
  for (size_t at = svg.find(mark); at != std::string::npos; at = svg.find(mark, at + 1)) {
    const size_t begin = at + mark.size();
    labels.push_back(svg.substr(begin, svg.find('<', begin) - begin));
  }
  return labels;
}

// Large values a small share apart (a raw volume's errors) get labels as distinct as their ticks.
TEST(Report, TickLabelsOfLargeCloseValuesDiffer) {
  for (const std::vector<double>& values :
       {std::vector<double>{412905680, 412851543, 412796802, 412757793},
        std::vector<double>{2.00e9, 2.01e9, 2.03e9}, std::vector<double>{1.2341e-6, 1.2349e-6}}) {
    report::Chart chart;
    chart.y_scale = report::Scale::linear;
    report::Series s("values");
    for (size_t i = 0; i < values.size(); ++i) s.x.push_back(double(i)), s.y.push_back(values[i]);
    chart.series.push_back(s);
    const std::vector<std::string> labels = y_labels(report::render(chart));
    ASSERT_GE(labels.size(), 2u);
    EXPECT_EQ(std::set<std::string>(labels.begin(), labels.end()).size(), labels.size())
        << ::testing::PrintToString(labels);
  }
}

// The tick property over hostile ranges, on both scales: a finite chart, at most a dozen y
// ticks, and (two or more of them) spread over at least half of the plot's height.
TEST(Report, ChartTicksAreFewFiniteAndSpanTheValues) {
  const std::vector<std::vector<double>> cases = {{0.5, 0.5},
                                                  {1, std::nextafter(1.0, 2.0)},
                                                  {1e-30, 1e30},
                                                  {5e-324, 1},
                                                  {1e-300, 1e300},
                                                  {-DBL_MAX, DBL_MAX},
                                                  {DBL_MAX, DBL_MAX / 2},
                                                  {0, 1},
                                                  {-3, 7},
                                                  {2, 2000},
                                                  {1e-5, 3e-5},
                                                  {1e6, 1e6 + 1},
                                                  {-1e-310, 1e-310}};
  for (report::Scale scale : {report::Scale::linear, report::Scale::automatic}) {
    for (const std::vector<double>& values : cases) {
      report::Chart chart;
      chart.y_scale = scale;
      report::Series s("values");
      for (size_t i = 0; i < values.size(); ++i) s.x.push_back(double(i)), s.y.push_back(values[i]);
      chart.series.push_back(s);
      const std::string svg = report::render(chart);
      const std::string what = std::to_string(values[0]) + ".." + std::to_string(values[1]);
      for (const char* bad : {"nan", "inf"}) EXPECT_EQ(svg.find(bad), std::string::npos) << what;
      const std::vector<double> ys = grid_ys(svg);
      ASSERT_GE(ys.size(), 1u) << what;
      EXPECT_LE(ys.size(), 12u) << what;
      const auto [lo, hi] = std::minmax_element(ys.begin(), ys.end());
      for (double y : ys) EXPECT_TRUE(y >= 34 - 0.5 && y <= 260 - 42 + 0.5) << what << ": " << y;
      if (ys.size() >= 2) {
        EXPECT_GE(*hi - *lo, (260 - 34 - 42) / 2.0) << what;
      }
    }
  }
}

}  // namespace
}  // namespace seqforge::report_test
