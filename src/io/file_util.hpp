#pragma once
// File helpers shared by the readers and writers of src/io.
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "seqforge/io/file_stamp.hpp"

namespace seqforge::io {

struct ByteSpan {
  const void* data;
  size_t size;
};

// Writes `parts` one after another to `path` atomically: a temporary file in the same directory,
// fsync, rename over `path`, fsync of the directory. On any failure the temporary file is removed
// and a seqforge::Error names `path`, the step and the system's reason. Then removes what an
// earlier writer of `path` killed mid-write left an hour ago or more (remove_stale_temporaries:
// a writer in another PID namespace, a container or a host sharing the directory, is not seen,
// and none takes an hour to write).
void write_file_atomically(const std::string& path, const std::vector<ByteSpan>& parts);

// Removes from `dir` the temporary files write_file_atomically left of `names` when its process
// was killed while writing (a process that no longer runs), those last written `min_age_seconds`
// ago or more; returns how many.
int remove_stale_temporaries(const std::string& dir, const std::vector<std::string>& names,
                             double min_age_seconds = 0);

// A file mapped read-only; unmapped when the last copy of `mapping` goes.
struct MappedFile {
  const std::byte* data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> mapping;
};
MappedFile map_file(const std::string& path);

// The whole file; errors name `path` and the system's reason.
std::string read_file(const std::string& path);
// The current directory, or a failure saying it is gone (removed while a shell stood in it).
std::string current_directory();

// A text file's whole text as UTF-8: a UTF-8 byte-order mark dropped, UTF-16 with one (Excel's
// "Unicode Text", PowerShell's files) converted; other bytes as they are, for the reader to judge.
std::string read_text_file(const std::string& path);
// The same for bytes already read from `source`.
std::string text_as_utf8(std::string bytes, const std::string& source);
// `s` without the spaces and tabs around it.
std::string_view trim(std::string_view s);
// The whole of `text` as a number in C's notation whatever the locale (std::from_chars: no
// spaces, no leading '+'); nullopt where it is none.
std::optional<double> parse_double(std::string_view text);

// Code point `c` (at most U+10FFFF) appended to `out` as UTF-8.
void append_utf8(std::string& out, char32_t c);
// The offset of the first character of `s` that is not UTF-8 (a byte that starts none, one cut
// short, an overlong, surrogate or out-of-range code), or npos where all of it is.
size_t first_non_utf8(std::string_view s);

// An advisory lock (flock) on DIR/.lock, held while the object lives: one process at a time
// owns a run directory. The kernel drops it when the process dies, so a killed process's lock
// never blocks; the file holds the holder's pid for the message of the one refused. The file
// is opened close-on-exec, so child processes never inherit the lock.
class DirLock {
 public:
  DirLock() = default;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  DirLock(DirLock&& o) noexcept { *this = std::move(o); }
  DirLock& operator=(DirLock&& o) noexcept;
  ~DirLock() { release(); }

  // Locks `dir`, creating it when missing. False when another process (or another DirLock of
  // this one) holds it; then *holder is its pid, 0 when it has not written it yet.
  bool try_lock(const std::string& dir, long* holder);
  bool held() const { return fd_ >= 0; }
  // Fails unless the lock file in the directory is still the one held: a directory removed and
  // made again (another run may have locked the new one) is no longer this one's to write in.
  void check_still_held() const;
  // Unlocks; a directory that try_lock created and that holds nothing but the lock goes too.
  void release();

 private:
  bool still_held() const;  // the directory's .lock is still the file held

  int fd_ = -1;
  bool created_ = false;
  std::string dir_;
};

// An exclusive advisory lock (flock) on the file `path`, created if missing, waited for and held
// while the object lives: a short section two processes must not run at once.
class FileLock {
 public:
  explicit FileLock(const std::string& path);
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

 private:
  int fd_ = -1;
};

// Text from an untrusted file, fit for a one-line error message: control bytes, the quote `quote`
// and backslashes escaped as \xNN, spaces that look like a plain one or like none (no-break,
// zero-width, a byte-order mark) and bidirectional controls (bidi_control) as \uNNNN, at most
// `max_shown` bytes (never half a UTF-8 sequence), then "...".
std::string printable(std::string_view s, size_t max_shown = 80, char quote = '\'');
// `s` without the space-like characters printable() shows as \uNNNN (no-break, zero-width,
// a byte-order mark).
std::string without_space_like(std::string_view s);
// A JSON parser's error (nlohmann's e.what()) as one short phrase for a message: "at line 3,
// column 7: unexpected end of input", without the library's tags, its grammar's words or the
// text it last read; `place` false: the reason alone.
std::string json_syntax_error(std::string_view what, bool place = true);
// `s` with each of those characters a plain space.
std::string space_like_as_space(std::string_view s);
// printable(s) in single quotes, or in double quotes where s holds a single quote and no double
// one ("'7", a spreadsheet's text number).
std::string quoted(std::string_view s, size_t max_shown = 80);

// What a file holds, in a line that changes when it does: its size and a hash of all its bytes;
// "" when it is not a regular file that can be read.
std::string file_fingerprint(const std::string& path);
// Whether `recorded`, a fingerprint of `path` a checkpoint holds, is `now`, its file_fingerprint:
// equal, or (a checkpoint of an earlier version, which hashed 256 blocks of a file over 4 MB)
// the sampled hash of the same bytes.
bool same_fingerprint(const std::string& path, const std::string& recorded, const std::string& now);
// The fingerprint earlier checkpoints hold: of a file over 4 MB, 256 blocks of 4 KB spread over it.
std::string sampled_file_fingerprint(const std::string& path);

// For a name a model does not know: " (the model knows 'rain')" where one of `known` differs from
// it only in case, spaces or how a number is written ("Rain", " rain"; "1" for "1.0"); else "".
std::string known_otherwise(std::string_view name, const std::vector<std::string>& known);

// The groups of `names` that differ only in case, spaces or how a number is written ("rain" and
// "Rain ", "1" and "1.0"), each quoted and joined by "and", the groups by "; " (the first four,
// then how many more); "" when there are none.
std::string names_alike(const std::vector<std::string>& names);

// Class names in the order a model numbers them, each once: by value where every name is a
// number ("2" before "10", as a label encoder orders an integer column), else by bytes.
std::vector<std::string> ordered_class_names(std::vector<std::string> names);

}  // namespace seqforge::io
