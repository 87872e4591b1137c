#include "io/file_util.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/hash.hpp"

namespace seqforge::io {

namespace {

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

// A user's file opened for reading: O_NONBLOCK, so that a named pipe without a writer is refused
// (not a regular file) instead of waiting forever in open(); reads of regular files ignore it.
int open_for_reading(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  return fd;
}

MappedFile map_file(const std::string& path) {
  const int fd = open_for_reading(path);
  if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file (a directory, device or pipe); give a file");
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* base = size > 0 ? ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
  const int e = errno;
  ::close(fd);
  if (base == MAP_FAILED) fail(path, ": cannot map: ", std::strerror(e));
  MappedFile m;
  m.data = static_cast<const std::byte*>(base);
  m.size = size;
  m.mapping = std::shared_ptr<const void>(base, [size](const void* p) {
    if (p) ::munmap(const_cast<void*>(p), size);
  });
  return m;
}

FileStamp stamp_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, ": ", std::strerror(errno));
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
          static_cast<uint64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

void write_file_atomically(const std::string& path_in, const std::vector<ByteSpan>& parts) {
  std::string path = path_in;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    // A device, pipe or socket (/dev/null, /dev/stdout) is written to, never replaced.
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
      // Non-blocking open: a named pipe that nothing reads within 10 s (a reader started beside
      // this process has time to open it) is an error, not a wait for ever.
      int fd = -1;
      for (int waited_ms = 0; fd < 0; waited_ms += 10) {
        fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
        if (fd >= 0 || errno != ENXIO) break;
        if (waited_ms >= 10000)
          fail(path, ": a named pipe that nothing reads; give a file, or read the pipe");
        ::usleep(10000);
      }
      if (fd < 0) fail(path, ": cannot open: ", std::strerror(errno));
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      bool ok = true;
      for (const ByteSpan& part : parts)
        ok = ok && (part.size == 0 || write_all(fd, part.data, part.size));
      const int e = errno;
      ::close(fd);
      if (!ok) fail(path, ": cannot write: ", std::strerror(e));
      return;
    }
    struct stat link {};
    if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode))
      path = std::filesystem::canonical(path).string();  // the file it names is replaced
  }
  // The temporary file, removed on every failure path.
  struct TempFile {
    std::string path;
    int fd = -1;
    bool keep = false;
    ~TempFile() {
      if (fd >= 0) ::close(fd);
      if (!keep && !path.empty()) ::unlink(path.c_str());
    }
  } tmp;
  static std::atomic<unsigned> counter{0};
  for (int attempt = 0; tmp.fd < 0; ++attempt) {
    std::string candidate = path;
    candidate += ".tmp.";
    candidate += std::to_string(::getpid());
    candidate += '.';
    candidate += std::to_string(counter.fetch_add(1));
    const int fd = ::open(candidate.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      tmp.fd = fd;
      tmp.path = std::move(candidate);
    } else if (errno != EEXIST || attempt >= 100) {
      fail(path, ": cannot create temporary file ", candidate, ": ", std::strerror(errno));
    }
  }
  auto io_fail = [&](const char* what) {
    const int e = errno;
    fail(path, ": ", what, " ", tmp.path, ": ", std::strerror(e));
  };
  for (const ByteSpan& part : parts)
    if (part.size > 0 && !write_all(tmp.fd, part.data, part.size)) io_fail("cannot write");
  if (::fsync(tmp.fd) != 0) io_fail("cannot fsync");
  if (::close(std::exchange(tmp.fd, -1)) != 0) io_fail("cannot close");
  if (::rename(tmp.path.c_str(), path.c_str()) != 0) {
    const int e = errno;
    fail(path, ": cannot rename ", tmp.path, " to it: ", std::strerror(e));
  }
  tmp.keep = true;

  // Make the rename durable.
  const std::string parent = std::filesystem::path(path).parent_path().string();
  const std::string dir = parent.empty() ? std::string(1, '.') : parent;
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail(path, ": cannot open directory ", dir, " to fsync it: ", std::strerror(errno));
  if (::fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP) {
    const int e = errno;
    ::close(dfd);
    fail(path, ": cannot fsync directory ", dir, ": ", std::strerror(e));
  }
  ::close(dfd);
  // What an earlier writer of this file left when it was killed mid-write.
  remove_stale_temporaries(dir, {std::filesystem::path(path).filename().string()}, 3600);
}

int remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& names,
                             double min_age_seconds) {
  namespace fs = std::filesystem;
  int removed = 0;
  std::error_code ec;
  const auto old = fs::file_time_type::clock::now() -
                   std::chrono::duration_cast<fs::file_time_type::duration>(
                       std::chrono::duration<double>(std::clamp(min_age_seconds, 0.0, 1e9)));
  for (fs::directory_iterator it(dir, ec), done; !ec && it != done; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string file = entry.path().filename().string();
    for (const std::string& name : names) {
      const std::string prefix = name + ".tmp.";  // write_file_atomically's: name.tmp.PID.N
      if (file.rfind(prefix, 0) != 0) continue;
      char* end = nullptr;
      const long pid = std::strtol(file.c_str() + prefix.size(), &end, 10);
      std::error_code age;
      if (pid > 0 && *end == '.' && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH &&
          (min_age_seconds <= 0 || fs::last_write_time(entry.path(), age) <= old) && !age &&
          fs::remove(entry.path(), age))
        ++removed;
    }
  }
  return removed;
}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
    created_ = std::exchange(o.created_, false);
    dir_ = std::move(o.dir_);
  }
  return *this;
}

bool DirLock::try_lock(const std::string& dir, long* holder) {
  namespace fs = std::filesystem;
  release();
  *holder = 0;
  const std::string path = (fs::path(dir) / ".lock").string();
  for (int attempt = 0;; ++attempt) {
    std::error_code ec;
    const bool existed = fs::is_directory(dir, ec);
    if (!existed && !fs::create_directories(dir, ec) && ec)
      fail(dir, ": cannot create the run directory: ", ec.message());
    // Never through a link (the pid would overwrite the file it names), nor on a pipe.
    const int fd =
        ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0 && errno == ELOOP)
      fail(path, ": a symbolic link, not the run directory's lock file: remove it");
    if (fd < 0) fail(path, ": cannot open the run directory's lock: ", std::strerror(errno));
    if (struct stat st{}; ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(path, ": not a regular file, as the run directory's lock is: remove it");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) {
        ::close(fd);
        fail(path, ": cannot lock the run directory: ", std::strerror(err));
      }
      char text[32] = {};
      const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
      ::close(fd);
      if (n > 0) *holder = std::strtol(text, nullptr, 10);
      return false;
    }
    // A holder that created the directory removes the file on release: the lock counts only on
    // the file still at `path`.
    struct stat locked {
    }, now{};
    if (::fstat(fd, &locked) == 0 && ::stat(path.c_str(), &now) == 0 &&
        locked.st_dev == now.st_dev && locked.st_ino == now.st_ino) {
      fd_ = fd;
      created_ = !existed;
      dir_ = fs::absolute(dir, ec).string();  // release() finds it after a change of directory
      break;
    }
    ::close(fd);
    if (attempt == 100) fail(path, ": the run directory's lock keeps being replaced");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  // Without the pid the lock holds all the same; the one refused is told none.
  [[maybe_unused]] const bool written =
      ::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) > 0;
  return true;
}

bool DirLock::still_held() const {
  const std::string path = (std::filesystem::path(dir_) / ".lock").string();
  struct stat locked {
  }, now{};
  return ::fstat(fd_, &locked) == 0 && ::lstat(path.c_str(), &now) == 0 &&
         locked.st_dev == now.st_dev && locked.st_ino == now.st_ino;
}

void DirLock::check_still_held() const {
  if (fd_ < 0 || still_held()) return;
  const std::string path = (std::filesystem::path(dir_) / ".lock").string();
  fail(dir_, ": the run directory was removed or replaced while this run trained in it (", path,
       " is no longer the lock this run holds); stopping without writing more, so that no "
       "other run's files are mixed with this one's");
}

void DirLock::release() {
  if (fd_ < 0) return;
  // A run that failed before writing anything leaves no directory behind: its own, where the
  // lock it holds still is (not a directory made in its place since).
  if (created_ && still_held()) {
    namespace fs = std::filesystem;
    std::error_code ec;
    bool only_lock = true;
    for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec))
      only_lock = only_lock && it->path().filename() == ".lock";
    if (!ec && only_lock) {
      fs::remove(fs::path(dir_) / ".lock", ec);
      fs::remove(dir_, ec);
    }
  }
  ::close(fd_);
  fd_ = -1;
  created_ = false;
  dir_.clear();
}

FileLock::FileLock(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) fail(path, ": cannot open the lock file: ", std::strerror(errno));
  while (::flock(fd_, LOCK_EX) != 0)
    if (errno != EINTR) {
      const int err = errno;
      ::close(fd_);
      fail(path, ": cannot lock: ", std::strerror(err));
    }
}

FileLock::~FileLock() { ::close(fd_); }

std::string current_directory() {
  std::error_code ec;
  const std::filesystem::path here = std::filesystem::current_path(ec);
  if (ec)
    fail("the current directory cannot be read (", ec.message(),
         "; removed while this shell stood in it?): cd into a directory that exists");
  return here.string();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::optional<double> parse_double(std::string_view text) {
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return v;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xc0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xe0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (c & 0x3f));
  }
}

size_t first_non_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = 0;
    char32_t min = 0, cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2, min = 0x80, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, min = 0x800, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, min = 0x10000, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::string text_as_utf8(std::string bytes, const std::string& source) {
  if (bytes.starts_with("\xef\xbb\xbf")) return bytes.substr(3);
  const bool little = bytes.starts_with("\xff\xfe"), big = bytes.starts_with("\xfe\xff");
  if (!little && !big) {
    // Binary files users reach for first, named rather than read as broken text.
    if (bytes.starts_with("PK\x03\x04"))
      fail(source,
           ": a zip archive (a .npz of numpy arrays, an .xlsx workbook?), not text: save one "
           "array with numpy.save as .npy, or the sheet as CSV");
    if (bytes.starts_with("\x93NUMPY"))
      fail(source, ": a .npy array by its bytes: give it the .npy extension");
    if (bytes.starts_with("\x1f\x8b")) fail(source, ": gzip-compressed: decompress it first");
    if (bytes.starts_with("PAR1"))
      fail(source, ": a Parquet file, not text: save it as CSV (pandas: to_csv) or .npy");
    // UTF-16 without its mark reads as UTF-8 with a NUL beside every ASCII character: text a model
    // would silently learn (or a table that would not parse) rather than what the file says.
    const std::string_view head = std::string_view(bytes).substr(0, 4096);
    if (head.size() >= 2 && std::count(head.begin(), head.end(), '\0') * 4 >= int64_t(head.size()))
      fail(source,
           ": NUL bytes between its characters: UTF-16 text without a byte-order mark? "
           "Save it as UTF-8 (or as UTF-16 with its mark)");
    return bytes;
  }
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  if (n % 2 != 0) fail(source, ": UTF-16 text (by its byte-order mark) of an odd number of bytes");
  const auto unit = [&](size_t i) -> char32_t {
    return little ? char32_t(b[i] | (b[i + 1] << 8)) : char32_t((b[i] << 8) | b[i + 1]);
  };
  std::string out;
  out.reserve(n / 2);
  for (size_t i = 2; i < n; i += 2) {
    char32_t cp = unit(i);
    if (cp >= 0xdc00 && cp <= 0xdfff)
      fail(source, ": byte ", i, ": not UTF-16 text (a low surrogate without its high one)");
    if (cp >= 0xd800 && cp <= 0xdbff) {
      const char32_t low = i + 2 < n ? unit(i + 2) : 0;
      if (low < 0xdc00 || low > 0xdfff)
        fail(source, ": byte ", i, ": not UTF-16 text (a high surrogate without its low one)");
      cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
      i += 2;
    }
    append_utf8(out, cp);
  }
  return out;
}

std::string read_text_file(const std::string& path) { return text_as_utf8(read_file(path), path); }

std::string read_file(const std::string& path) {
  const int fd = open_for_reading(path);
  std::string bytes;
  struct stat st {};
  // A device or pipe may never end (/dev/zero): only files are read whole.
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, ": not a regular file (a directory, device or pipe); give a file");
  }
  // Read whole, a file must fit the memory there is: a clear line rather than the kernel's kill.
  if (const int64_t available = available_memory_bytes(); st.st_size > available) {
    ::close(fd);
    fail(path, ": ", st.st_size >> 20, " MB, more than the ", available >> 20,
         " MB of memory available to read it into");
  }
  if (st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
  char chunk[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, chunk, sizeof chunk);
    if (r == 0) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      fail(path, ": cannot read: ", std::strerror(e));
    }
    bytes.append(chunk, static_cast<size_t>(r));
  }
  ::close(fd);
  return bytes;
}

namespace {
// The bytes of an invisible or space-like character at s[i] (U+00A0, U+2000-U+200F,
// U+2028-U+202F, U+205F, U+2060, U+3000, U+FEFF), and its code point; 0 where none starts there.
size_t space_like(std::string_view s, size_t i, unsigned* code) {
  const auto byte = [&](size_t k) { return i + k < s.size() ? unsigned(uint8_t(s[i + k])) : 0u; };
  if (byte(0) == 0xc2 && byte(1) == 0xa0) return *code = 0xa0, 2;
  if (byte(0) < 0xe0 || byte(0) > 0xef || (byte(1) & 0xc0) != 0x80 || (byte(2) & 0xc0) != 0x80)
    return 0;
  *code = (byte(0) & 0x0f) << 12 | (byte(1) & 0x3f) << 6 | (byte(2) & 0x3f);
  const unsigned c = *code;
  const bool space = (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) || c == 0x205f ||
                     c == 0x2060 || c == 0x3000 || c == 0xfeff;
  return space ? 3 : 0;
}
}  // namespace

std::string json_syntax_error(std::string_view what, bool place) {
  // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error while
  // parsing value - invalid literal; last read: 'tru'"
  std::string where;
  if (const size_t at = what.find(" at line "); place && at != std::string_view::npos)
    where = std::string(what.substr(at + 1, what.find(':', at) - at - 1)) + ": ";
  std::string_view reason = what;
  if (const size_t dash = what.find(" - "); dash != std::string_view::npos)
    reason = what.substr(dash + 3);
  else if (const size_t tag = what.find("] "); tag != std::string_view::npos)
    reason = what.substr(tag + 2);
  reason = reason.substr(0, reason.find(';'));
  return where + printable(reason, 120, '\0');
}

std::string space_like_as_space(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned code = 0;
    const size_t n = space_like(s, i, &code);
    out += n > 0 ? ' ' : s[i];
    i += n > 0 ? n - 1 : 0;
  }
  return out;
}

std::string without_space_like(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned code = 0;
    if (const size_t n = space_like(s, i, &code); n > 0)
      i += n - 1;
    else
      out += s[i];
  }
  return out;
}

std::string printable(std::string_view s, size_t max_shown, char quote) {
  std::string out;
  size_t shown = std::min(s.size(), max_shown);
  while (shown < s.size() && shown > 0 && (static_cast<unsigned char>(s[shown]) & 0xc0) == 0x80)
    --shown;
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    unsigned code = 0;
    if (size_t n = space_like(s, i, &code);
        (n > 0 || (n = bidi_control(s, i, &code)) > 0) && i + n <= shown) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", code);
      out += escaped;
      i += n - 1;
    } else if (c < 0x20 || c == 0x7f || c == '\\' || c == static_cast<unsigned char>(quote)) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (shown < s.size()) out += "...";
  return out;
}

std::string quoted(std::string_view s, size_t max_shown) {
  const char quote =
      s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos ? '"' : '\'';
  std::string out(1, quote);
  out += printable(s, max_shown, quote);
  out += quote;
  return out;
}

namespace {
// A name without spaces (no-break and invisible ones too), in lower case.
std::string folded(std::string_view s) {
  std::string f;
  for (const char c : without_space_like(s))
    if (c != ' ' && c != '\t') f += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return f;
}

// A name folded (folded()), or the number it writes ("#7" for "007", "7" and "7.0").
std::string alike_key(std::string_view name) {
  std::string key = folded(name);
  const std::string_view digits = key.starts_with('+') ? std::string_view(key).substr(1) : key;
  const std::optional<double> number = parse_double(digits);
  if (number && std::isfinite(*number)) {
    char text[32] = "#";
    *std::to_chars(text + 1, text + sizeof text - 1, *number, std::chars_format::general, 17).ptr =
        '\0';
    key = text;
  }
  return key;
}
}  // namespace

std::string known_otherwise(std::string_view name, const std::vector<std::string>& known) {
  const std::string key = alike_key(name);
  for (const std::string& k : known)
    if (alike_key(k) == key) return " (the model knows " + io::quoted(k) + ")";
  return "";
}

std::string names_alike(const std::vector<std::string>& names) {
  std::map<std::string, std::vector<const std::string*>> groups;  // folded name or number -> names
  std::vector<std::string> order;                                 // keys in order of first name
  for (const std::string& name : names) {
    const std::string key = alike_key(name);
    auto& group = groups[key];
    if (group.empty()) order.push_back(key);
    group.push_back(&name);
  }
  constexpr size_t kShown = 4;
  std::string out;
  size_t alike = 0;
  for (const std::string& key : order) {
    const auto& group = groups[key];
    if (group.size() < 2 || alike++ >= kShown) continue;
    if (!out.empty()) out += "; ";
    for (size_t i = 0; i < group.size(); ++i)
      out += (i == 0 ? "" : i + 1 == group.size() ? " and " : ", ") + io::quoted(*group[i]);
  }
  if (alike > kShown) out += "; and " + std::to_string(alike - kShown) + " more such groups";
  return out;
}

std::vector<std::string> ordered_class_names(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  std::vector<std::pair<double, size_t>> numbered;  // value, index into names
  for (size_t i = 0; i < names.size(); ++i) {
    std::string_view s = names[i];
    if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.remove_prefix(1);
    double value = 0;
    const auto r = std::from_chars(s.data(), s.data() + s.size(), value);
    if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || !std::isfinite(value))
      return names;
    numbered.emplace_back(value, i);
  }
  std::sort(numbered.begin(), numbered.end());  // "1" and "1.0": by bytes among equal values
  std::vector<std::string> ordered;
  for (const auto& [value, i] : numbered) ordered.push_back(std::move(names[i]));
  return ordered;
}

namespace {

// The size and a hash of the bytes: every byte, read 4 MB at a time, or (`sampled`, as earlier
// checkpoints recorded a file over 4 MB) 256 blocks of 4 KB spread over it.
std::string fingerprint(const std::string& path, bool sampled) {
  constexpr size_t kChunk = size_t{4} << 20, kBlocks = 256, kBlock = 4096;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO: no wait
  if (fd < 0) return "";
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return "";
  }
  const size_t size = static_cast<size_t>(st.st_size);
  std::vector<char> buffer(std::min(size, kChunk));
  uint64_t h = hash_bytes(&size, sizeof size);
  bool ok = true;
  auto hash_at = [&](size_t offset, size_t bytes) {
    size_t done = 0;
    while (ok && done < bytes) {
      const ssize_t n = ::pread(fd, buffer.data() + done, bytes - done, off_t(offset + done));
      if (n <= 0)
        ok = false;
      else
        done += size_t(n);
    }
    if (ok) h = hash_bytes(buffer.data(), bytes, h);
  };
  if (size <= kChunk) {
    hash_at(0, size);
  } else if (sampled) {
    for (size_t b = 0; b < kBlocks && ok; ++b) hash_at((size - kBlock) / (kBlocks - 1) * b, kBlock);
  } else {
    for (size_t offset = 0; offset < size && ok; offset += kChunk)
      hash_at(offset, std::min(kChunk, size - offset));
  }
  ::close(fd);
  if (!ok) return "";
  char text[64];
  std::snprintf(text, sizeof text, "%zu bytes, hash %016llx", size,
                static_cast<unsigned long long>(h));
  return text;
}

}  // namespace

std::string file_fingerprint(const std::string& path) { return fingerprint(path, false); }

std::string sampled_file_fingerprint(const std::string& path) { return fingerprint(path, true); }

bool same_fingerprint(const std::string& path, const std::string& recorded,
                      const std::string& now) {
  return recorded == now || (!now.empty() && recorded == sampled_file_fingerprint(path));
}

}  // namespace seqforge::io
