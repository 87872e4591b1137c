#pragma once
// SIGINT and SIGTERM as requests to stop: while an InterruptScope is alive the first such signal
// is only recorded, for a loop to poll at a safe point (a training step's end); a second SIGINT
// or SIGTERM ends the process at once with 128 + the signal's number, unless a host that must
// outlive the work (an interpreter) said otherwise with set_second_signal_quits(false).
#include "seqforge/core/error.hpp"

namespace seqforge {

class InterruptScope {
 public:
  InterruptScope();   // installs the handlers (nested scopes share the outermost's)
  ~InterruptScope();  // restores the previous handlers and forgets a request
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
  // No scope encloses this one: a request is this scope's owner's to answer when its work ends.
  bool outermost() const { return outermost_; }

 private:
  bool outermost_;
};

// The signal received since the outermost scope began (SIGINT or SIGTERM), or 0.
int interrupt_requested();

// Whether a second signal ends the process (the default) or is one more request to stop.
void set_second_signal_quits(bool quits);

// Thrown by a loop that stopped on request, after it saved what it needed; the CLI exits with
// exit_code().
class Interrupted : public Error {
 public:
  Interrupted(int signal, const std::string& message) : Error(message), signal_(signal) {}
  int signal() const { return signal_; }
  int exit_code() const { return 128 + signal_; }
  // The run directory of an interrupted training run ("" where none was made yet).
  const std::string& run_dir() const { return run_dir_; }
  void set_run_dir(const std::string& dir) { run_dir_ = dir; }

 private:
  int signal_;
  std::string run_dir_;
};

}  // namespace seqforge
