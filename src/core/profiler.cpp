#include "seqforge/core/profiler.hpp"

#include <omp.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "io/file_util.hpp"

namespace seqforge::profiler {

namespace detail {
std::atomic<bool> enabled{false};
}

namespace {

int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Event {
  const char* name;
  int64_t ts_ns;   // since the session's start
  int64_t dur_ns;  // complete events
  double value;    // counters
  int16_t layer, direction;
  bool is_counter;
};

// Single producer (the owning thread), single consumer (the writer): an event becomes visible
// when `count` is published, a chunk when `next` is, so neither side ever locks.
struct Chunk {
  static constexpr size_t kEvents = 2048;
  Event events[kEvents];
  std::atomic<size_t> count{0};
  std::atomic<Chunk*> next{nullptr};
};

struct ThreadBuffer {
  uint64_t session = 0;
  int64_t tid = 0;
  std::string name;  // guarded by Registry::mutex
  Chunk* head = new Chunk;
  Chunk* tail = head;  // the owner's only
  ~ThreadBuffer() {
    for (Chunk* c = head; c;) delete std::exchange(c, c->next.load());
  }
  void push(const Event& e) {
    size_t n = tail->count.load(std::memory_order_relaxed);
    if (n == Chunk::kEvents) {
      Chunk* fresh = new Chunk;
      tail->next.store(fresh, std::memory_order_release);
      tail = fresh;
      n = 0;
    }
    tail->events[n] = e;
    tail->count.store(n + 1, std::memory_order_release);
  }
  template <typename Fn>
  void for_each(Fn&& fn) const {
    for (const Chunk* c = head; c; c = c->next.load(std::memory_order_acquire)) {
      const size_t n = c->count.load(std::memory_order_acquire);
      for (size_t i = 0; i < n; ++i) fn(c->events[i]);
    }
  }
};

struct Registry {
  std::mutex mutex;
  // Buffers of every session, kept until exit: a thread may still end a scope it began in an
  // earlier session, and never needs a lock to find its buffer.
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  std::atomic<uint64_t> session{0};
  std::atomic<int64_t> origin_ns{0};
  int64_t stop_ns = 0;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may outlive static destruction
  return *r;
}

thread_local ThreadBuffer* tl_buffer = nullptr;
thread_local std::string tl_name;

ThreadBuffer& buffer() {
  Registry& r = registry();
  const uint64_t session = r.session.load(std::memory_order_acquire);
  if (tl_buffer && tl_buffer->session == session) [[likely]]
    return *tl_buffer;
  auto b = std::make_unique<ThreadBuffer>();
  b->session = session;
  b->tid = static_cast<int64_t>(syscall(SYS_gettid));
  b->name = tl_name;
  if (b->name.empty() && omp_in_parallel())
    b->name = "omp worker " + std::to_string(omp_get_thread_num());
  if (b->name.empty()) {  // the name the thread gave the OS (pthread_setname_np), if any
    char os_name[32] = "";
    pthread_getname_np(pthread_self(), os_name, sizeof os_name);
    b->name = os_name[0] && b->tid != getpid() ? os_name : "thread " + std::to_string(b->tid);
  }
  std::lock_guard lock(r.mutex);
  tl_buffer = b.get();
  r.buffers.push_back(std::move(b));
  return *tl_buffer;
}

std::string render_name(const Event& e) {
  std::string name = e.name;
  if (e.layer >= 0) name += " L" + std::to_string(e.layer);
  if (e.direction > 0) name += " reverse";
  return name;
}

// Snapshot of the last session's buffers (the buffers themselves live on).
std::vector<const ThreadBuffer*> session_buffers() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<const ThreadBuffer*> out;
  const uint64_t session = r.session.load();
  for (const auto& b : r.buffers)
    if (b->session == session) out.push_back(b.get());
  return out;
}

}  // namespace

void start() {
  Registry& r = registry();
  detail::enabled.store(false);
  {
    std::lock_guard lock(r.mutex);
    // A thread moves to a fresh buffer on its first event of the new session.
    r.origin_ns.store(clock_ns());
    r.session.fetch_add(1, std::memory_order_acq_rel);
    r.stop_ns = 0;
  }
  if (tl_name.empty()) set_thread_name("main");
  detail::enabled.store(true);
}

void stop() {
  detail::enabled.store(false);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.stop_ns = clock_ns() - r.origin_ns.load();
}

void set_thread_name(const std::string& name) {
  tl_name = name;
  if (tl_buffer) {
    std::lock_guard lock(registry().mutex);
    tl_buffer->name = name;
  }
}

void counter(const char* name, double value) {
  if (!enabled()) return;
  buffer().push({name, clock_ns() - registry().origin_ns.load(std::memory_order_relaxed), 0, value,
                 -1, -1, true});
}

void Scope::begin(const char* name, int layer, int direction) noexcept {
  name_ = name;
  layer_ = static_cast<int16_t>(layer);
  direction_ = static_cast<int16_t>(direction);
  start_ns_ = clock_ns();
}

void Scope::end() noexcept {
  const int64_t end_ns = clock_ns();
  const int64_t origin = registry().origin_ns.load(std::memory_order_relaxed);
  if (start_ns_ < origin) return;  // begun in an earlier session
  try {
    buffer().push({name_, start_ns_ - origin, end_ns - start_ns_, 0, layer_, direction_, false});
  } catch (...) {  // out of memory: the event is lost, the run goes on
  }
}

void write_trace(const std::string& path) {
  const auto buffers = session_buffers();
  const int64_t pid = getpid();
  std::string s;
  s.reserve(1 << 20);
  s += "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  char line[512];
  std::snprintf(line, sizeof line,
                "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%lld,\"tid\":0,"
                "\"args\":{\"name\":\"seqforge\"}}",
                static_cast<long long>(pid));
  s += line;
  std::vector<std::pair<int64_t, std::string>> names;
  {
    std::lock_guard lock(registry().mutex);
    for (const ThreadBuffer* b : buffers) names.emplace_back(b->tid, b->name);
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& [tid, name] = names[i];
    // "main" first, then the others in order of their first event.
    const int sort = name == "main" ? -1 : static_cast<int>(i);
    std::snprintf(line, sizeof line,
                  ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%lld,\"tid\":%lld,"
                  "\"args\":{\"name\":%s}}"
                  ",\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%lld,\"tid\":%lld,"
                  "\"args\":{\"sort_index\":%d}}",
                  static_cast<long long>(pid), static_cast<long long>(tid),
                  nlohmann::json(name).dump().c_str(), static_cast<long long>(pid),
                  static_cast<long long>(tid), sort);
    s += line;
  }
  for (const ThreadBuffer* b : buffers) {
    b->for_each([&](const Event& e) {
      if (e.is_counter) {
        std::snprintf(line, sizeof line,
                      ",\n{\"ph\":\"C\",\"name\":%s,\"pid\":%lld,\"ts\":%.3f,"
                      "\"args\":{\"value\":%.6g}}",
                      nlohmann::json(e.name).dump().c_str(), static_cast<long long>(pid),
                      e.ts_ns / 1e3, e.value);
      } else {
        char args[64] = "";
        if (e.layer >= 0)
          std::snprintf(args, sizeof args, ",\"args\":{\"layer\":%d,\"direction\":%d}", e.layer,
                        std::max<int>(0, e.direction));
        std::snprintf(line, sizeof line,
                      ",\n{\"ph\":\"X\",\"name\":%s,\"cat\":\"seqforge\",\"pid\":%lld,"
                      "\"tid\":%lld,\"ts\":%.3f,\"dur\":%.3f%s}",
                      nlohmann::json(render_name(e)).dump().c_str(), static_cast<long long>(pid),
                      static_cast<long long>(b->tid), e.ts_ns / 1e3, e.dur_ns / 1e3, args);
      }
      s += line;
    });
  }
  s += "\n]}\n";
  io::write_file_atomically(path, {{s.data(), s.size()}});
}

std::vector<SummaryRow> summary() {
  std::map<std::string, SummaryRow> rows;
  std::map<std::string, std::vector<double>> durations;
  for (const ThreadBuffer* b : session_buffers())
    b->for_each([&](const Event& e) {
      if (e.is_counter) return;
      const std::string name = render_name(e);
      SummaryRow& r = rows[name];
      ++r.calls;
      r.total_ms += e.dur_ns / 1e6;
      r.max_ms = std::max(r.max_ms, e.dur_ns / 1e6);
      durations[name].push_back(e.dur_ns / 1e6);
    });
  Registry& reg = registry();
  int64_t wall_ns;
  {
    std::lock_guard lock(reg.mutex);
    wall_ns = reg.stop_ns > 0 ? reg.stop_ns : clock_ns() - reg.origin_ns.load();
  }
  std::vector<SummaryRow> out;
  for (auto& [name, r] : rows) {
    r.name = name;
    r.mean_ms = r.total_ms / r.calls;
    std::vector<double>& d = durations[name];
    std::nth_element(d.begin(), d.begin() + d.size() / 2, d.end());
    r.median_ms = d[d.size() / 2];
    r.share = wall_ns > 0 ? r.total_ms / (wall_ns / 1e6) : 0;
    out.push_back(r);
  }
  std::sort(out.begin(), out.end(),
            [](const SummaryRow& a, const SummaryRow& b) { return a.total_ms > b.total_ms; });
  return out;
}

void print_summary(std::ostream& out, size_t max_rows) {
  const auto rows = summary();
  char line[200];
  std::snprintf(line, sizeof line, "%-32s %9s %12s %10s %10s %8s\n", "scope", "calls", "total ms",
                "mean ms", "max ms", "% wall");
  out << line;
  for (size_t i = 0; i < rows.size() && i < max_rows; ++i) {
    const SummaryRow& r = rows[i];
    std::snprintf(line, sizeof line, "%-32s %9lld %12.1f %10.3f %10.3f %7.1f%%\n", r.name.c_str(),
                  static_cast<long long>(r.calls), r.total_ms, r.mean_ms, r.max_ms,
                  100.0 * r.share);
    out << line;
  }
  if (rows.size() > max_rows) out << "(" << rows.size() - max_rows << " more)\n";
}

}  // namespace seqforge::profiler
