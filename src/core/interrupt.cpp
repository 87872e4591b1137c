#include "seqforge/core/interrupt.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace seqforge {

namespace {

std::atomic<int> requested{0};
std::atomic<bool> second_quits{true};
int depth = 0;  // scopes alive; only the outermost installs and restores
struct sigaction previous_int, previous_term;

void on_signal(int sig) {
  int none = 0;
  const bool quits = second_quits.load();
  if (requested.compare_exchange_strong(none, sig)) {
    // Only what is async-signal-safe: a fixed text per case, written whole.
    static const char ctrl_c[] =
        "\nseqforge: stopping after the current step (press Ctrl-C again to quit at once)\n";
    static const char term[] =
        "\nseqforge: SIGTERM: stopping after the current step (a second signal quits at once)\n";
    static const char note_only[] = "\nseqforge: stopping after the current step\n";
    const char* note = !quits ? note_only : sig == SIGTERM ? term : ctrl_c;
    const size_t size = !quits ? sizeof note_only : sig == SIGTERM ? sizeof term : sizeof ctrl_c;
    [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, note, size - 1);
    return;
  }
  if (quits) _exit(128 + sig);
}

}  // namespace

InterruptScope::InterruptScope() : outermost_(depth == 0) {
  if (depth++ > 0) return;
  requested = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, &previous_int);
  sigaction(SIGTERM, &action, &previous_term);
}

InterruptScope::~InterruptScope() {
  if (--depth > 0) return;
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
  requested = 0;
}

int interrupt_requested() { return requested.load(std::memory_order_relaxed); }

void set_second_signal_quits(bool quits) { second_quits = quits; }

}  // namespace seqforge
