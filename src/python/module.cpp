// seqforge._native: the library's entry points for the Python package (python/seqforge). The
// package turns arrays and data frames into files and configs; this module trains, evaluates,
// predicts and generates with the GIL released, and hands predictions back as numpy arrays over
// the library's own buffers.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>
#include <sstream>
#include <streambuf>

#include "seqforge/core/error.hpp"
#include "seqforge/core/interrupt.hpp"
#include "seqforge/core/threads.hpp"
#include "seqforge/io/npy.hpp"
#include "seqforge/seqforge.hpp"
#include "seqforge/train/config.hpp"
#include "seqforge/train/trainer.hpp"

namespace py = pybind11;
namespace sf = seqforge;

namespace {

// Denormal handling set to `flush` for a scope, then back to what it was. A call keeps the
// caller's (the backend flushes denormals to zero on its threads for speed, which must not change
// the numbers numpy and scikit-learn compute afterwards), and Python code a callback runs during
// the call computes with the caller's too.
class DenormalsScope {
 public:
  explicit DenormalsScope(bool flush = sf::flushes_denormals()) : before_(sf::flushes_denormals()) {
    if (before_ != flush) sf::set_flush_denormals(flush);
  }
  ~DenormalsScope() {
    if (sf::flushes_denormals() != before_) sf::set_flush_denormals(before_);
  }
  DenormalsScope(const DenormalsScope&) = delete;
  DenormalsScope& operator=(const DenormalsScope&) = delete;
  bool before() const { return before_; }

 private:
  bool before_;
};

// Text written by the library, handed to a Python callable a line at a time (GIL taken for it).
class LineSink : public std::streambuf {
 public:
  LineSink(py::object log, bool callers_denormals, const sf::CNumbers& numbers)
      : log_(std::move(log)), callers_denormals_(callers_denormals), numbers_(numbers) {}
  ~LineSink() override { flush_line(); }

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return 0;
    line_ += static_cast<char>(c);
    if (c == '\n') flush_line();
    return c;
  }
  int sync() override { return 0; }

 private:
  void flush_line() {
    if (line_.empty() || log_.is_none()) return line_.clear();
    py::gil_scoped_acquire gil;
    const DenormalsScope callers(callers_denormals_);
    const sf::CallersNumbers callers_numbers(numbers_);
    try {
      log_(line_);
    } catch (py::error_already_set& e) {
      // A failing log callable must not end a run: its text is dropped, said once as a warning.
      if (!warned_) {
        warned_ = true;
        const std::string what = "seqforge: the log function raised " + std::string(e.what()) +
                                 "; the run goes on without its lines";
        if (PyErr_WarnEx(PyExc_RuntimeWarning, what.c_str(), 1) != 0) PyErr_Clear();
      }
    }
    line_.clear();
  }
  py::object log_;
  bool callers_denormals_;
  const sf::CNumbers& numbers_;
  std::string line_;
  bool warned_ = false;
};

// The first Python exception a callback raised during a call, raised again once the call is over.
struct CallbackError {
  std::unique_ptr<py::error_already_set> error;
  void rethrow() {
    if (error) throw std::move(*error);
  }
};

py::dict summary_dict(const sf::TrainSummary& s) {
  py::dict d;
  d["run_dir"] = s.run_dir;
  d["checkpoint"] = s.checkpoint;
  d["epochs"] = s.epochs;
  d["monitor"] = s.monitor;
  d["best"] = s.best;
  d["last"] = s.last;
  d["test"] = s.test;
  d["stopped"] = s.stopped;
  return d;
}

// The config of a file (`yaml` None) or of YAML text named `source`, with overrides.
sf::Config config_of(const py::object& yaml, const std::string& source,
                     const std::vector<std::string>& overrides) {
  if (yaml.is_none()) return sf::Config::load(source, overrides);
  return sf::Config::parse(yaml.cast<std::string>(), source, overrides);
}

// Trains from a config (see config_of); on_epoch(epoch, metrics) -> bool may stop the run;
// on_step(epoch, batches done, batches per epoch) shows progress.
py::dict train(const py::object& yaml, const std::string& source,
               const std::vector<std::string>& overrides, const std::string& resume, bool overwrite,
               py::object log, py::object on_epoch, py::object on_step) {
  const DenormalsScope keep;
  const sf::CNumbers numbers;  // the native side's text in C's notation, whatever the locale
  const sf::KeepCallersThreads threads;
  CallbackError callback_error;
  sf::TrainHooks hooks;
  if (!on_epoch.is_none())
    hooks.on_epoch = [&](int64_t epoch, const std::map<std::string, double>& metrics) {
      py::gil_scoped_acquire gil;
      const DenormalsScope callers(keep.before());
      const sf::CallersNumbers callers_numbers(numbers);
      try {
        const py::object verdict = on_epoch(epoch, metrics);
        const bool numpy_bool =
            py::hasattr(verdict, "dtype") && py::hasattr(verdict, "ndim") &&
            verdict.attr("ndim").cast<int>() == 0 &&
            py::str(verdict.attr("dtype").attr("kind")).cast<std::string>() == "b";
        if (verdict.is_none()) return true;
        if (py::isinstance<py::bool_>(verdict) || numpy_bool)
          return PyObject_IsTrue(verdict.ptr()) == 1;
        if (!callback_error.error) {
          PyErr_SetString(PyExc_TypeError,
                          ("on_epoch must return True, False or None, not " +
                           std::string(py::str(py::type::of(verdict).attr("__name__"))))
                              .c_str());
          callback_error.error.reset(new py::error_already_set());
        }
        return false;
      } catch (py::error_already_set& e) {
        // Optuna's pruning (seqforge.optuna's callback raises TrialPruned): the run is pruned.
        if (py::str(e.type().attr("__name__")).cast<std::string>() == "TrialPruned")
          hooks.on_epoch_stop = "pruned";
        if (!callback_error.error) callback_error.error.reset(new py::error_already_set(e));
        return false;
      }
    };
  // Progress at most ten times a second, and at each epoch's end: a step can take microseconds.
  auto last_step_call = std::chrono::steady_clock::now();
  if (!on_step.is_none())
    hooks.on_step = [&](int64_t epoch, int64_t done, int64_t per_epoch) {
      const auto now = std::chrono::steady_clock::now();
      if (done < per_epoch && now - last_step_call < std::chrono::milliseconds(100)) return;
      last_step_call = now;
      py::gil_scoped_acquire gil;
      const DenormalsScope callers(keep.before());
      const sf::CallersNumbers callers_numbers(numbers);
      try {
        on_step(epoch, done, per_epoch);
      } catch (py::error_already_set&) {
        PyErr_Clear();  // a failing progress display must not end a run
      }
    };
  sf::TrainSummary summary;
  {
    const sf::Config config = resume.empty()
                                  ? config_of(yaml, source, overrides)
                                  : sf::Config::load(resume + "/config.resolved.yaml", overrides);
    LineSink sink(log, keep.before(), numbers);
    std::ostream out(&sink);
    py::gil_scoped_release released;
    summary = sf::train(config, out, resume, hooks, overwrite);
  }
  callback_error.rethrow();
  return summary_dict(summary);
}

// A 2-D numpy array as an .npy source while it lives: float32 and float64 arrays in C order are
// read where they are, others are converted once (the converted copy kept here).
class ArraySource {
 public:
  explicit ArraySource(const py::array& array) {
    const bool c_order = array.flags() & py::array::c_style;
    if (c_order &&
        (py::dtype::of<float>().is(array.dtype()) || py::dtype::of<double>().is(array.dtype()))) {
      array_ = array;
    } else {
      if (array.dtype().kind() != 'f' && array.dtype().kind() != 'i' && array.dtype().kind() != 'u')
        throw sf::Error("the array holds " + std::string(py::str(array.dtype())) + ", not numbers");
      array_ = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(array);
    }
    if (array_.ndim() != 2)
      throw sf::Error("expected a 2-D array (rows, columns), got " + std::to_string(array_.ndim()) +
                      (array_.ndim() == 1 ? " dimension" : " dimensions"));
    sf::io::MappedNpy m;
    m.dtype = py::dtype::of<float>().is(array_.dtype()) ? sf::DType::f32 : sf::DType::f64;
    m.shape = {array_.shape(0), array_.shape(1)};
    m.data = static_cast<const std::byte*>(array_.data());
    memory_.emplace("numpy array", std::move(m));
  }
  const std::string& path() const { return memory_->path(); }

 private:
  py::array array_;
  std::optional<sf::io::MemoryNpy> memory_;
};

// eval's metrics and its notes (the lines the command prints after "note: "), for the package to
// say in its own words.
py::tuple evaluate(const std::string& run, const std::string& split, const std::string& data,
                   const std::string& missing, const std::vector<std::string>& missing_values,
                   const std::string& date_order) {
  const DenormalsScope keep;
  const sf::CNumbers numbers;  // the native side's text in C's notation, whatever the locale
  const sf::KeepCallersThreads threads;
  std::ostringstream said;
  std::map<std::string, double> metrics;
  try {
    py::gil_scoped_release released;
    metrics = sf::evaluate(run, split, data, &said,
                           sf::InputReading{missing, missing_values, date_order});
  } catch (const sf::Error& e) {  // the notes said before it often say why (eval prints them)
    std::string before;
    std::istringstream lines(said.str());
    for (std::string line; std::getline(lines, line);)
      before += (before.empty() ? "" : "; ") + (line.starts_with("note: ") ? line.substr(6) : line);
    if (before.empty()) throw;
    throw sf::Error(std::string(e.what()) + " (noted before: " + before + ")");
  }
  py::list notes;
  std::istringstream lines(said.str());
  for (std::string line; std::getline(lines, line);)
    notes.append(line.starts_with("note: ") ? line.substr(6) : line);
  return py::make_tuple(metrics, notes);
}

// A vector handed to numpy without a copy: the array's base owns it.
py::array owned_array(std::vector<double>&& values) {
  auto* owner = new std::vector<double>(std::move(values));
  py::capsule base(owner, [](void* p) { delete static_cast<std::vector<double>*>(p); });
  return py::array_t<double>({static_cast<py::ssize_t>(owner->size())}, owner->data(), base);
}

// predict's table: {"columns": [(name, kind, values)], "notes": [...], "summary": "..."}, numeric
// columns as float64 arrays (NaN where the file has an empty cell), text columns as lists.
py::dict predictions(const std::string& run, const std::string& input, bool last_only,
                     const std::string& missing, const std::vector<std::string>& missing_values,
                     const std::string& date_order) {
  const DenormalsScope keep;
  const sf::CNumbers numbers;  // the native side's text in C's notation, whatever the locale
  const sf::KeepCallersThreads threads;
  sf::Predictions p;
  {
    py::gil_scoped_release released;
    p = sf::predictions(run, input, last_only,
                        sf::InputReading{missing, missing_values, date_order});
  }
  static const char* const kinds[] = {"text", "integer", "f32", "f64"};
  py::list columns;
  for (sf::PredictionColumn& c : p.columns) {
    const char* kind = kinds[static_cast<int>(c.kind)];
    if (c.kind == sf::PredictionColumn::Kind::text)
      columns.append(py::make_tuple(c.name, kind, py::cast(c.text)));
    else
      columns.append(py::make_tuple(c.name, kind, owned_array(std::move(c.values))));
  }
  py::dict d;
  d["columns"] = columns;
  d["notes"] = p.notes;
  d["summary"] = p.summary;
  d["windows"] = p.windows;
  return d;
}

py::dict predictions_of_array(const std::string& run, const py::array& array, bool last_only,
                              const std::string& missing,
                              const std::vector<std::string>& missing_values) {
  const ArraySource source(array);
  return predictions(run, source.path(), last_only, missing, missing_values, "");
}

// Samples from a language model; stream(text), where given, sees the text as it is made (an
// exception it raises ends the sampling and reaches the caller). Ctrl-C ends it as
// KeyboardInterrupt, polled as each piece is made.
std::string generate(const std::string& run, const std::string& prompt, int64_t length,
                     double temperature, int64_t top_k, uint64_t seed, double top_p,
                     py::object stream) {
  const DenormalsScope keep;
  const sf::CNumbers numbers;  // the native side's text in C's notation, whatever the locale
  const sf::KeepCallersThreads threads;
  CallbackError callback_error;
  std::function<void(std::string_view)> pass_on;
  if (!stream.is_none())
    pass_on = [&](std::string_view piece) {
      py::gil_scoped_acquire gil;
      const DenormalsScope callers(keep.before());
      const sf::CallersNumbers callers_numbers(numbers);
      try {
        stream(py::str(piece.data(), piece.size()));
      } catch (py::error_already_set& e) {
        callback_error.error.reset(new py::error_already_set(e));
        throw sf::Error("generate: stopped by the stream callback");
      }
    };
  else
    pass_on = [&](std::string_view) {
      py::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        callback_error.error.reset(new py::error_already_set());
        throw sf::Error("generate: interrupted");
      }
    };
  std::string text;
  try {
    py::gil_scoped_release released;
    text = sf::generate(run, prompt, length, temperature, top_k, seed, top_p, pass_on);
  } catch (const sf::Error&) {
    callback_error.rethrow();
    throw;
  }
  return text;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "seqforge's native core; use the seqforge package";
  // A second Ctrl-C must not end the interpreter (a notebook's kernel): the step ends, then
  // KeyboardInterrupt.
  sf::set_second_signal_quits(false);
  static py::exception<sf::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<sf::Diverged> diverged(m, "Diverged", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sf::Interrupted& e) {
      // The run's state is saved: Ctrl-C in Python is KeyboardInterrupt, its message the hint,
      // given in Python's words.
      std::string message = e.what();
      const std::string command = "seqforge train --resume ";
      if (const size_t at = message.find(command); at != std::string::npos)
        message = message.substr(0, at) + "seqforge.train(resume='" +
                  message.substr(at + command.size()) + "')";
      PyErr_SetString(PyExc_KeyboardInterrupt, message.c_str());
    } catch (const sf::Diverged& e) {
      diverged(e.what());
    } catch (const sf::Error& e) {
      error(e.what());
    }
  });
  m.def("version", [] { return std::string(sf::version()); });
  m.def("train", &train, py::arg("yaml"), py::arg("source"), py::arg("overrides"),
        py::arg("resume") = "", py::arg("overwrite") = false, py::arg("log") = py::none(),
        py::arg("on_epoch") = py::none(), py::arg("on_step") = py::none());
  m.def(
      "resolved_config",
      [](const py::object& yaml, const std::string& source,
         const std::vector<std::string>& overrides) {
        const sf::CNumbers numbers;
        return config_of(yaml, source, overrides).resolved_yaml();
      },
      py::arg("yaml"), py::arg("source"), py::arg("overrides"));
  const std::vector<std::string> no_codes;
  m.def("evaluate", &evaluate, py::arg("run"), py::arg("split") = "test", py::arg("data") = "",
        py::arg("missing") = "", py::arg("missing_values") = no_codes, py::arg("date_order") = "");
  m.def("predictions", &predictions, py::arg("run"), py::arg("input"), py::arg("last_only") = false,
        py::arg("missing") = "", py::arg("missing_values") = no_codes, py::arg("date_order") = "");
  m.def("predictions_of_array", &predictions_of_array, py::arg("run"), py::arg("array"),
        py::arg("last_only") = false, py::arg("missing") = "",
        py::arg("missing_values") = no_codes);
  m.def(
      "evaluate_array",
      [](const std::string& run, const py::array& array, const std::string& missing,
         const std::vector<std::string>& missing_values) {
        const ArraySource source(array);
        return evaluate(run, "test", source.path(), missing, missing_values, "");
      },
      py::arg("run"), py::arg("array"), py::arg("missing") = "",
      py::arg("missing_values") = no_codes);
  m.def("generate", &generate, py::arg("run"), py::arg("prompt"), py::arg("length"),
        py::arg("temperature"), py::arg("top_k"), py::arg("seed"), py::arg("top_p"),
        py::arg("stream") = py::none());
  m.def(
      "merge",
      [](const std::string& run, const std::string& output) {
        const DenormalsScope keep;
        const sf::CNumbers numbers;
        const sf::KeepCallersThreads threads;
        py::gil_scoped_release released;
        return sf::merge_adapters(run, output);
      },
      py::arg("run"), py::arg("output"));
  m.def("config_keys", [] {
    py::list keys;
    for (const sf::ConfigKey& k : sf::config_keys()) keys.append(k.path);
    return keys;
  });
}
