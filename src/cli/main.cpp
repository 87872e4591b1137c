// The seqforge command-line tool.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "observe.hpp"
#include "seqforge/bench/bench.hpp"
#include "seqforge/core/interrupt.hpp"
#include "seqforge/core/profiler.hpp"
#include "seqforge/dist/communicator.hpp"
#include "seqforge/report/report.hpp"
#include "seqforge/seqforge.hpp"
#include "seqforge/train/trainer.hpp"
#include "tune.hpp"
#include "validators.hpp"

namespace sf = seqforge;
using seqforge::cli::whole_number;

namespace {

// A command line that does not parse exits 2, as getopt-style tools do; any other error exits 1.
constexpr int kUsageError = 2;

int run_bench(const std::string& which, const sf::BenchOptions& options,
              const std::string& json_path) {
  std::vector<const sf::Workload*> selected;
  if (which == "all") {
    for (const auto& w : sf::workloads()) selected.push_back(&w);
  } else {
    selected.push_back(&sf::find_workload(which));
  }
  sf::check_bench_options(options);
  const sf::ThreadConfig threads = sf::configure_threads();
  if (!threads.warning.empty()) std::printf("warning: %s\n", threads.warning.c_str());
  std::printf("seqforge %s bench: %d threads (%s), %d timed steps after %d warm-up; %s\n",
              sf::version(), threads.threads, threads.reason.c_str(), options.steps, options.warmup,
              sf::make_run_backend(options.device)->description().c_str());
  std::printf("%-3s %-34s %-5s %10s %17s %10s %8s %10s %6s %8s\n", "id", "workload", "prec",
              "ms/step", "p10-p90 ms", "samples/s", "GFLOP/s", "GEMMs ms", "ratio", "peak MB");
  nlohmann::json out = nlohmann::json::array();
  for (const sf::Workload* w : selected) {
    const sf::BenchResult r = sf::run_benchmark(*w, options);
    if (!r.notice.empty()) std::printf("note: %s\n", r.notice.c_str());
    if (r.checkpoint_activations)
      std::printf("note: %s with activation checkpointing\n", r.id.c_str());
    if (!r.graphs_off.empty())
      std::printf("note: %s: CUDA graphs: %s\n", r.id.c_str(), r.graphs_off.c_str());
    // A step without GEMMs (attention alone) has no floor.
    const bool floor = r.gemm_floor_ms > 0;
    char floor_ms[16] = "-", floor_ratio[16] = "-";
    if (floor) {
      std::snprintf(floor_ms, sizeof floor_ms, "%.2f", r.gemm_floor_ms);
      std::snprintf(floor_ratio, sizeof floor_ratio, "%.2f", r.floor_ratio);
    }
    std::printf("%-3s %-34s %-5s %10.2f %8.2f-%-8.2f %10.0f %8.1f %10s %6s %8.0f\n", r.id.c_str(),
                r.name.c_str(), r.precision.c_str(), r.median_ms, r.p10_ms, r.p90_ms,
                r.samples_per_s, r.gflops, floor_ms, floor_ratio, r.peak_mb);
    if (options.profile) sf::profiler::print_summary(std::cout, 25);
    std::fflush(stdout);
    out.push_back({{"id", r.id},
                   {"name", r.name},
                   {"precision", r.precision},
                   {"checkpoint_activations", r.checkpoint_activations},
                   {"step_ms", r.step_ms},
                   {"median_ms", r.median_ms},
                   {"p10_ms", r.p10_ms},
                   {"p90_ms", r.p90_ms},
                   {"samples_per_s", r.samples_per_s},
                   {"gflops", r.gflops},
                   {"gflop_per_step", w->gflop()},
                   {"gemm_floor_ms", floor ? nlohmann::json(r.gemm_floor_ms) : nullptr},
                   {"floor_ratio", floor ? nlohmann::json(r.floor_ratio) : nullptr},
                   {"peak_mb", r.peak_mb},
                   {"graph_steps", r.graph_steps},
                   {"threads", threads.threads}});
  }
  std::printf(
      "ratio: step time / the same step's GEMMs replayed alone right after it (the GEMM floor), "
      "median of pairs\n");
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    if (!f) sf::fail(json_path, ": cannot write");
    f << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

static int run_command(int argc, char** argv) {
  sf::restart_with_short_omp_spin_waits(argv);
  sf::configure_threads();  // before any OpenMP region starts the pool at OMP_NUM_THREADS
  CLI::App app{"seqforge: fast training of sequence models (LSTM, GRU, transformers)"};
  app.set_version_flag("--version", std::string("seqforge ") + sf::version());
  app.require_subcommand(0, 1);

  std::string bench_which = "all", bench_json;
  sf::BenchOptions bench_options;
  CLI::App* bench = app.add_subcommand("bench", "Time training steps of the benchmark workloads");
  bench
      ->add_option("workload", bench_which,
                   "W1, W2, W3, W4, W5, W6, W1g, W4g, W1p, W4p, W9, A5, A5k or all")
      ->capture_default_str();
  bench->add_option("--precision", bench_options.precision, "fp32, bf16, fp16 (GPUs) or auto")
      ->capture_default_str();
  bench
      ->add_option("--matmul-precision", bench_options.matmul_precision,
                   "highest (f32 GEMMs in f32) or high (on a GPU, f32 GEMMs on TF32 tensor cores)")
      ->capture_default_str();
  bench->add_option("--steps", bench_options.steps, "timed steps")
      ->check(whole_number(1, 1 << 20))
      ->capture_default_str();
  bench
      ->add_option("--warmup", bench_options.warmup,
                   "untimed steps first (at least 1; at least 4 on a GPU's recurrent workloads)")
      ->check(whole_number(0, 1 << 20))
      ->capture_default_str();
  bench->add_option("--json", bench_json, "write the results as JSON to this file")
      ->check(seqforge::cli::a_path());
  bench->add_option("--device", bench_options.device, "cpu or cuda")->capture_default_str();
  bench->add_flag("--profile", bench_options.profile,
                  "print where the timed steps spent their time, per workload");
  bench->add_flag("--checkpoint-activations", bench_options.checkpoint_activations,
                  "transformers and decoders: recompute each block's activations in backward");
  bench->add_flag("!--no-cuda-graphs", bench_options.cuda_graphs,
                  "on a GPU, run every step eagerly instead of replaying a captured graph");

  std::string run_dir;
  std::vector<std::string> train_args;  // the config and key.path=value overrides, in any order
  CLI::App* train = app.add_subcommand("train", "Train a model from a YAML config");
  train->add_option("config", train_args, "CONFIG.yaml and key.path=value overrides");
  train->add_option("--resume", run_dir, "continue this run directory from its last epoch");
  bool overwrite = false;
  train->add_flag("--overwrite", overwrite,
                  "replace the run in train.run_dir (its files are removed first)");
  std::string profile_path;
  train
      ->add_option("--profile", profile_path,
                   "write a Chrome trace (default RUN_DIR/trace.json) and a time summary")
      ->expected(0, 1);

  std::string eval_run, eval_split = "test", eval_data;
  CLI::App* eval = app.add_subcommand("eval", "Evaluate a trained run on its test split");
  eval->add_option("run", eval_run, "run directory or model.safetensors")->required();
  eval->add_option("--split", eval_split, "val or test")->capture_default_str();
  eval->add_option("--data", eval_data, "evaluate on every window of this file instead")
      ->check(seqforge::cli::a_path());
  sf::InputReading eval_missing;
  eval->add_option("--missing", eval_missing.fill,
                   "fill that file's missing cells: ffill or interpolate (default: as the run "
                   "trained, data.missing)");
  eval->add_option("--missing-values", eval_missing.codes,
                   "values that mark a missing cell in that file, besides the run's "
                   "data.missing_values (several: --missing-values -99.99 -999)");
  eval->add_option("--date-order", eval_missing.date_order,
                   "dmy or mdy: that file's dates' day or month first, where none of them has a "
                   "field past 12 to tell (default: as the run trained, data.date_order)");
  bool eval_json = false;
  eval->add_flag("--json", eval_json, "print the metrics as one JSON object");

  std::string pred_run;
  sf::PredictOptions pred_options;
  CLI::App* pred = app.add_subcommand(
      "predict", "Predict every window of a file with a forecasting or classification run");
  pred->add_option("run", pred_run, "run directory or model.safetensors")->required();
  pred->add_option("--input,--data", pred_options.input,
                   "CSV or .npy of the training data's layout (target columns optional)")
      ->check(seqforge::cli::a_path())
      ->required();
  pred_options.output = "-";
  pred->add_option("--output", pred_options.output, "CSV to write; - for standard output")
      ->check(seqforge::cli::a_path())
      ->capture_default_str();
  pred->add_flag("--last", pred_options.last_only,
                 "only the forecast after the last row (of each series)");
  pred->add_option("--missing", pred_options.missing.fill,
                   "fill the input's missing cells: ffill or interpolate (default: as the run "
                   "trained, data.missing)");
  pred->add_option("--missing-values", pred_options.missing.codes,
                   "values that mark a missing cell in the input, besides the run's "
                   "data.missing_values (several: --missing-values -99.99 -999)");
  pred->add_option("--date-order", pred_options.missing.date_order,
                   "dmy or mdy: the input's dates' day or month first, where none of them has a "
                   "field past 12 to tell (default: as the run trained, data.date_order)");

  std::string merge_run, merge_output;
  CLI::App* merge = app.add_subcommand(
      "merge", "Fold a run's LoRA/DoRA adapters into its weights: a plain checkpoint");
  merge->add_option("run", merge_run, "run directory or model.safetensors")->required();
  merge
      ->add_option("--output", merge_output,
                   "the .safetensors file to write; for a decoder run, a folder name writes a "
                   "Hugging Face folder (config.json, model.safetensors, tokenizer.json)")
      ->check(seqforge::cli::a_path())
      ->required();

  std::string gen_run, gen_prompt;
  int64_t gen_length = 200, gen_top_k = 0;
  double gen_top_p = 1.0;
  double gen_temperature = 1.0;
  uint64_t gen_seed = 0;
  CLI::App* gen = app.add_subcommand("generate", "Sample text from a language model");
  gen->add_option("run", gen_run, "run directory or model.safetensors")->required();
  gen->add_option("--prompt", gen_prompt,
                  "text to start from; required for a token model (a character model's "
                  "default: a newline, not printed, or a random character when the vocabulary "
                  "has none)");
  gen->add_option("--length", gen_length, "characters (a token model: tokens) to sample")
      ->check(whole_number(0, int64_t{1} << 40))
      ->capture_default_str();
  gen->add_option("--temperature", gen_temperature,
                  "sampling temperature; 0: always the likeliest character")
      ->capture_default_str();
  gen->add_option("--top-k", gen_top_k, "sample among the k likeliest (default: all)")
      ->check(whole_number(INT64_MIN, INT64_MAX));
  gen->add_option("--top-p", gen_top_p,
                  "sample among the fewest likeliest whose probabilities reach p (nucleus)")
      ->capture_default_str();
  gen->add_option("--seed", gen_seed, "random seed, from 0 to 2^64 - 1")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            uint64_t v = 0;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
            return ec == std::errc() && end == text.data() + text.size()
                       ? ""
                       : "'" + text + "' is not a whole number from 0 to 2^64 - 1";
          },
          "UINT"))
      ->capture_default_str();

  seqforge::cli::TuneCli* tune = seqforge::cli::add_tune(app);

  CLI::App* report = seqforge::cli::add_report(app);
  CLI::App* diagnose = seqforge::cli::add_diagnose(app);
  CLI::App* tokenize = seqforge::cli::add_tokenize(app);
  CLI::App* tokenizer = seqforge::cli::add_tokenizer(app);

  CLI::App* reference =
      app.add_subcommand("config-reference", "Print the configuration reference (docs/config.md)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError& e) {
    std::string hint =
        "--help lists the options; config keys are given as key.path=value, e.g. train.epochs=3";
    for (const CLI::App* command : app.get_subcommands())  // a command that reads a run
      if (const std::string name = command->get_name(); name == "eval" || name == "predict" ||
                                                        name == "generate" || name == "merge" ||
                                                        name == "report")
        hint = name + " takes no config keys: a run keeps the config it trained with; --help " +
               "lists the options";
    std::fprintf(stderr, "seqforge: error: %s (%s)\n", sf::printable(e.what()).c_str(),
                 hint.c_str());
    return kUsageError;
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string message = e.what();
    // CLI11's words for an option given twice: "--split: At Most 1 required but received 2".
    const std::string twice = ": At Most 1 required but received ";
    if (const size_t at = message.find(twice); at != std::string::npos)
      message = message.substr(0, at) + ": given " + message.substr(at + twice.size()) +
                " times; give it once";
    std::fprintf(stderr, "seqforge: error: %s (--help lists the options)\n",
                 sf::printable(message).c_str());
    return kUsageError;
  }
  try {
    // Commands of one process: under mpirun each rank would do all of it, writing the same files.
    for (const CLI::App* single : {eval, pred, merge, gen})
      if (single->parsed() && sf::dist::launched_by_mpi() && sf::dist::world().size() > 1)
        sf::fail(single->get_name(), ": under mpirun with ", sf::dist::world().size(),
                 " processes: ", single->get_name(),
                 " runs in one process; start it without mpirun");
    if (bench->parsed()) {
      sf::check_output_file(bench_json, "bench: --json");
      return run_bench(bench_which, bench_options, bench_json);
    }
    if (train->parsed()) {
      const bool profile = train->count("--profile") > 0;
      // --profile takes an optional FILE, never the config or an override that followed it.
      if (!profile_path.empty()) {
        const std::string ext = std::filesystem::path(profile_path).extension().string();
        if (ext == ".yaml" || ext == ".yml" || profile_path.find('=') != std::string::npos)
          sf::fail("train: --profile took '", profile_path,
                   "' as its trace file; put --profile last, or give its file as "
                   "--profile=TRACE.json");
      }
      if (profile) sf::profiler::start();
      std::string train_config;
      std::vector<std::string> overrides;
      for (const std::string& a : train_args) {
        std::error_code unreadable;  // a name too long for a path is no file, not an error
        const bool exists = std::filesystem::exists(a, unreadable);
        if (a.find('=') != std::string::npos && !exists) {
          overrides.push_back(a);
        } else if (!exists && a.find('.') != std::string::npos &&
                   a.find('/') == std::string::npos && a.size() > 5 &&
                   a.substr(a.size() - 5) != ".yaml" && a.substr(a.size() - 4) != ".yml") {
          sf::fail("train: '", a, "' is not a config file, nor an override: expected ", a,
                   "=VALUE");
        } else if (!train_config.empty()) {
          sf::fail("train: one CONFIG.yaml expected, got '", train_config, "' and '", a,
                   "' (overrides are key.path=value)");
        } else {
          train_config = a;
        }
      }
      if (!profile_path.empty()) {  // never the config or the data it trains on
        const std::string config =
            run_dir.empty() ? train_config : run_dir + "/config.resolved.yaml";
        std::vector<std::pair<std::string, std::string>> reads = {{config, "the config"}};
        try {
          reads.push_back({sf::Config::load(config, overrides).str("data.path"), "the data file"});
        } catch (const sf::Error&) {  // train says what is wrong with the config
        }
        sf::check_output_file(profile_path, "train: --profile", reads);
      }
      sf::TrainSummary summary;
      if (!run_dir.empty()) {
        if (!train_config.empty())
          sf::fail("train: --resume ", run_dir, " continues that run with its own config (",
                   run_dir, "/config.resolved.yaml); drop '", train_config,
                   "', or start a new run with: seqforge train ", train_config);
        const std::string resolved = run_dir + "/config.resolved.yaml";
        if (overwrite) sf::fail("train: --overwrite starts a new run; --resume continues one");
        if (std::filesystem::is_regular_file(run_dir)) {
          const std::filesystem::path file(run_dir);
          const std::string ext = file.extension().string();
          if (ext == ".yaml" || ext == ".yml")
            sf::fail("train: --resume ", run_dir, " is a file, not a run directory; start a run ",
                     "from a config with: seqforge train ", run_dir);
          const std::string parent =
              file.has_parent_path() ? file.parent_path().string() : std::string(".");
          sf::fail("train: --resume ", run_dir, " is a file, not a run directory",
                   std::filesystem::exists(file.parent_path() / "config.resolved.yaml")
                       ? "; its run is " + parent + ": seqforge train --resume " + parent
                       : "");
        }
        if (!std::filesystem::is_directory(run_dir))
          sf::fail("train: --resume ", run_dir, ": no such run directory");
        if (!std::filesystem::exists(resolved) &&
            (std::filesystem::exists(run_dir + "/study.json") ||
             std::filesystem::exists(run_dir + "/study.db")))
          sf::fail("train: --resume ", run_dir, ": a tune study's directory, not a run: resume ",
                   "one of its trials (", run_dir, "/trial-N), or go on with the study (seqforge ",
                   "tune CONFIG.yaml, which resumes it)");
      }
      // The profile of the steps taken, also when a signal stopped the run.
      const auto write_profile = [&](const std::string& dir) {
        sf::profiler::stop();
        if (profile_path.empty()) profile_path = dir + "/trace.json";
        sf::profiler::write_trace(profile_path);
        std::cout << "profile (" << profile_path << ", opens in https://ui.perfetto.dev):\n";
        sf::profiler::print_summary(std::cout);
      };
      try {
        if (!run_dir.empty()) {
          summary = sf::train(sf::Config::load(run_dir + "/config.resolved.yaml", overrides),
                              std::cout, run_dir);
        } else {
          if (train_config.empty()) sf::fail("train: give a CONFIG.yaml, or --resume RUN_DIR");
          summary =
              sf::train(sf::Config::load(train_config, overrides), std::cout, "", {}, overwrite);
        }
      } catch (const sf::Interrupted& e) {
        if (profile && (!profile_path.empty() || !e.run_dir().empty())) write_profile(e.run_dir());
        throw;
      }
      if (profile) write_profile(summary.run_dir);
      return 0;
    }
    if (eval->parsed()) {
      if (!eval_data.empty() && eval->count("--split"))
        sf::fail("eval: --data evaluates every window of that file; --split ", eval_split,
                 " evaluates a split of the run's own data: give one of them");
      const auto metrics = sf::evaluate(eval_run, eval_split, eval_data, &std::cerr, eval_missing);
      if (eval_json) {
        std::printf("%s\n", nlohmann::json(metrics).dump().c_str());
        return 0;
      }
      std::vector<std::string> names;
      for (const auto& [k, v] : metrics) names.push_back(k);
      std::sort(names.begin(), names.end(), sf::metric_order);  // val_mae_h2 before _h10
      for (const std::string& k : names) {
        char value[32];  // the shortest text that reads back as the same double
        *std::to_chars(value, value + sizeof value - 1, metrics.at(k)).ptr = '\0';
        std::printf("%s %s\n", k.c_str(), value);
      }
      return 0;
    }
    if (pred->parsed()) {
      const int64_t windows = sf::predict(pred_run, pred_options, std::cerr);
      if (pred_options.output != "-")
        std::printf("wrote the predictions of %lld windows to %s\n",
                    static_cast<long long>(windows), pred_options.output.c_str());
      return 0;
    }
    if (merge->parsed()) {
      const int64_t n = sf::merge_adapters(merge_run, merge_output);
      std::printf("merged the adapters of %lld weights into %s\n", static_cast<long long>(n),
                  merge_output.c_str());
      return 0;
    }
    if (gen->parsed()) {
      if (gen->count("--top-k") && gen_top_k <= 0)
        sf::fail("generate: --top-k must be positive, got ", gen_top_k,
                 " (leave it out to sample among all characters)");
      if (!(gen_top_p > 0 && gen_top_p <= 1))
        sf::fail("generate: --top-p must be in (0, 1], got ", gen_top_p);
      if (!(gen_temperature >= 0) || !std::isfinite(gen_temperature))
        sf::fail(
            "generate: --temperature must be 0 (always the likeliest character) or a finite "
            "number above, got ",
            gen_temperature);
      // The text as it is made, as a chat model's is.
      sf::generate(gen_run, gen_prompt, gen_length, gen_temperature, gen_top_k, gen_seed, gen_top_p,
                   [](std::string_view piece) {
                     std::fwrite(piece.data(), 1, piece.size(), stdout);
                     std::fflush(stdout);
                   });
      std::printf("\n");
      return 0;
    }
    if (seqforge::cli::tune_parsed(tune)) return seqforge::cli::run_tune(tune);
    if (report->parsed()) return seqforge::cli::run_report();
    if (diagnose->parsed()) return seqforge::cli::run_diagnose();
    if (tokenize->parsed()) return seqforge::cli::run_tokenize();
    if (tokenizer->parsed()) return seqforge::cli::run_tokenizer();
    if (reference->parsed()) {
      std::fputs(sf::config_reference_markdown().c_str(), stdout);
      return 0;
    }
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const sf::Interrupted& e) {
    if (*e.what()) std::fprintf(stderr, "seqforge: %s\n", sf::printable(e.what()).c_str());
    return e.exit_code();
  } catch (const std::filesystem::filesystem_error& e) {  // a path the system refused
    std::string what =
        e.path1().empty() ? std::string(e.what()) : e.path1().string() + ": " + e.code().message();
    if (what.starts_with("filesystem error: ")) what.erase(0, 18);
    if (!e.path2().empty()) what += " (and " + e.path2().string() + ")";
    std::fprintf(stderr, "seqforge: error: %s\n", sf::printable(what).c_str());
    std::fflush(stderr);
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "seqforge: error: %s\n", sf::printable(e.what()).c_str());
    std::fflush(stderr);
    return 1;
  }
}

// Output that could not be written (a full disk, say) is an error, not a success.
int main(int argc, char** argv) {
  const int rc = run_command(argc, argv);
  std::cout.flush();
  errno = 0;
  if ((std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout) && rc == 0) {
    std::fprintf(stderr, "seqforge: error: cannot write to standard output%s%s\n",
                 errno ? ": " : "", errno ? std::strerror(errno) : "");
    return 1;
  }
  return rc;
}
