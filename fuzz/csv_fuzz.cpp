// libFuzzer target: CsvTable::parse must either accept the bytes or throw seqforge::Error, and so
// must numeric() on every column; UTF-16 text converted to UTF-8 (text_as_utf8) must convert back
// to the same bytes. Any other exception, a crash, a sanitizer report or a broken
// invariant below is a bug.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/io/csv.hpp"
#include "seqforge/io/dates.hpp"

namespace {

using seqforge::io::CsvTable;

[[noreturn]] void bug(const char* what) {
  std::fprintf(stderr, "csv_fuzz: invariant violated: %s\n", what);
  std::abort();
}

// Every field quoted, so any cell text (commas, quotes, line breaks, spaces) survives.
std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

void check_accepted(const CsvTable& t, std::string_view bytes) {
  const auto& cols = t.columns();
  if (cols.empty()) bug("no columns");
  if (t.rows() <= 0) bug("no rows");
  if (std::set<std::string>(cols.begin(), cols.end()).size() != cols.size()) bug("duplicates");

  // Data rows start on increasing lines after the header, within the file.
  int64_t max_line = 1;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] == '\n' || (bytes[i] == '\r' && (i + 1 == bytes.size() || bytes[i + 1] != '\n'))) {
      ++max_line;
    }
  }
  int64_t prev = 1;
  for (int64_t r = 0; r < t.rows(); ++r) {
    const int64_t line = t.line_of_row(r);
    if (line <= prev || line > max_line) bug("line_of_row out of order or range");
    prev = line;
  }

  unsigned sink = 0;
  for (const std::string& c : cols) {
    if (c.empty()) bug("empty column name");
    if (!t.has_column(c)) bug("has_column");
    const auto& text = t.text(c);
    if (static_cast<int64_t>(text.size()) != t.rows()) bug("column length");
    for (const std::string_view cell : text) {
      using seqforge::io::DateLayout;
      for (DateLayout layout :
           {DateLayout::iso, DateLayout::day_first, DateLayout::month_first, DateLayout::compact})
        if (const auto s = seqforge::io::parse_date(cell, layout)) {
          // Every date lies in the years 0000 to 9999 (a UTC offset of up to a day aside).
          if (*s < -62167219200 - 86400 || *s > 253402300799 + 86400) bug("date out of range");
          sink += static_cast<unsigned>(*s);
        }
      if (const auto f = seqforge::io::day_month_fields(cell)) sink += f->first + f->second;
      const int64_t micros = seqforge::io::microseconds_of(cell);  // a fraction of a second
      if (micros < 0 || micros > 999999) bug("microseconds out of range");
      sink += static_cast<unsigned>(micros);
    }
    try {
      const std::vector<double> v = t.numeric(c);
      if (static_cast<int64_t>(v.size()) != t.rows()) bug("numeric length");
      for (double x : v) {
        if (!std::isfinite(x)) bug("numeric returned a non-finite value");
      }
    } catch (const seqforge::Error&) {
    }
  }
  static volatile unsigned keep;
  keep = sink;

  // An unknown column is an error, not a crash.
  const std::string unknown = "\x01unknown";
  if (!t.has_column(unknown)) {
    try {
      t.text(unknown);
      bug("text() of an unknown column did not throw");
    } catch (const seqforge::Error&) {
    }
  }

  // Writing the table back with every field quoted and parsing it gives the same table.
  std::string out;
  for (size_t c = 0; c < cols.size(); ++c) out += (c ? "," : "") + quoted(cols[c]);
  out += "\r\n";
  for (int64_t r = 0; r < t.rows(); ++r) {
    for (size_t c = 0; c < cols.size(); ++c) {
      out += (c ? "," : "") + quoted(t.text(cols[c])[static_cast<size_t>(r)]);
    }
    out += '\n';
  }
  CsvTable back = [&] {
    try {
      return CsvTable::parse(out, "round-trip");
    } catch (const seqforge::Error& e) {
      std::fprintf(stderr, "csv_fuzz: re-reading the written table failed: %s\n", e.what());
      std::abort();
    }
  }();
  if (back.columns() != cols || back.rows() != t.rows()) bug("round trip: shape");
  for (const std::string& c : cols) {
    if (back.text(c) != t.text(c)) bug("round trip: cells");
  }
}

}  // namespace

// UTF-8 back to UTF-16 in the byte order of `bom`, after it; bug() on bytes that are not UTF-8.
std::string utf16_of(std::string_view utf8, std::string_view bom) {
  std::string out(bom);
  const bool little = bom == "\xff\xfe";
  const auto put = [&](uint32_t u) {
    out += little ? char(u & 0xff) : char(u >> 8);
    out += little ? char(u >> 8) : char(u & 0xff);
  };
  const auto* b = reinterpret_cast<const unsigned char*>(utf8.data());
  for (size_t i = 0; i < utf8.size();) {
    const int more = b[i] < 0x80 ? 0 : b[i] >= 0xf0 ? 3 : b[i] >= 0xe0 ? 2 : 1;
    if (b[i] >= 0x80 && b[i] < 0xc0) bug("UTF-16 converted to a continuation byte first");
    if (more > 0 && i + more >= utf8.size()) bug("UTF-16 converted to a cut UTF-8 character");
    uint32_t cp = more == 0 ? b[i] : b[i] & (0x3f >> more);
    for (int k = 1; k <= more; ++k) cp = (cp << 6) | (b[i + k] & 0x3f);
    if (cp >= 0xd800 && cp <= 0xdfff) bug("UTF-16 converted to an encoded surrogate");
    if (cp >= 0x10000) {
      put(0xd800 + ((cp - 0x10000) >> 10));
      put(0xdc00 + ((cp - 0x10000) & 0x3ff));
    } else {
      put(cp);
    }
    i += 1 + more;
  }
  return out;
}

void check_utf16(std::string_view bytes) {
  if (!bytes.starts_with("\xff\xfe") && !bytes.starts_with("\xfe\xff")) return;
  std::string utf8;
  try {
    utf8 = seqforge::io::text_as_utf8(std::string(bytes), "fuzz-input");
  } catch (const seqforge::Error&) {
    return;
  }
  if (utf16_of(utf8, bytes.substr(0, 2)) != bytes) bug("UTF-16 does not convert back");
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  static volatile bool parsed_date;
  for (auto layout : {seqforge::io::DateLayout::iso, seqforge::io::DateLayout::day_first,
                      seqforge::io::DateLayout::month_first, seqforge::io::DateLayout::compact,
                      seqforge::io::DateLayout::named_month})
    parsed_date = seqforge::io::parse_date(bytes.substr(0, 64), layout).has_value();
  check_utf16(bytes);
  std::optional<CsvTable> table;
  try {
    table.emplace(CsvTable::parse(bytes, "fuzz-input"));
  } catch (const seqforge::Error&) {
    return 0;  // rejected input: the expected outcome for most mutations
  }
  check_accepted(*table, bytes);
  return 0;
}
