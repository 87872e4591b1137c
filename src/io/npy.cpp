#include "seqforge/io/npy.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "io/file_util.hpp"
#include "seqforge/core/cpu.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::io {

static_assert(std::endian::native == std::endian::little,
              "npy data is read as little-endian; big-endian hosts would need byte swapping");

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

// Text from untrusted headers: keep messages on one line and of bounded length.
std::string quote_header_text(std::string_view s) {
  constexpr size_t kMaxShown = 60;
  std::string out = "'";
  const size_t shown = std::min(s.size(), kMaxShown);
  for (size_t i = 0; i < shown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\' || c == '\'') {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (shown < s.size()) out += "...";
  return out + "'";
}

// Python tuple notation, as numpy prints shapes: (), (5,), (3, 4).
std::string numpy_shape(const std::vector<int64_t>& shape) {
  constexpr size_t kMaxShown = 16;
  std::string s = "(";
  for (size_t i = 0; i < shape.size() && i < kMaxShown; ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  if (shape.size() > kMaxShown) s += ", ...";
  if (shape.size() == 1) s += ",";
  return s + ")";
}

struct DescrInfo {
  std::string_view code;  // without the byte-order character
  DType dtype;
};
constexpr DescrInfo kDescrs[] = {{"f2", DType::f16},
                                 {"f4", DType::f32},
                                 {"f8", DType::f64},
                                 {"i4", DType::i32},
                                 {"i8", DType::i64}};

// A parsed Python literal, reduced to what the header check needs.
struct PyValue {
  enum class Kind { string, boolean, none, integer, tuple, list, dict, other };
  Kind kind = Kind::other;
  std::string text;                  // string: the value; integer: the digits as written
  bool flag = false;                 // boolean
  bool negative = false;             // integer
  std::optional<int64_t> int_value;  // integer, if it fits in int64
  std::vector<PyValue> items;        // tuple, list
};

// Recursive-descent parser for the Python literal subset numpy writes (and a little more, to
// give precise errors): dicts, tuples, lists, quoted strings, True/False/None and numbers.
class NpyHeaderParser {
 public:
  NpyHeaderParser(std::string_view text, const std::string& source) : s_(text), source_(source) {}

  // Parses the top-level dict; keys must be strings and unique.
  std::map<std::string, PyValue> parse_dict() {
    skip_space();
    if (!eat('{')) {
      fail(source_, ": header is not a Python dict literal (it starts with ",
           i_ < s_.size() ? quote_header_text(s_.substr(i_, 1)) : std::string("nothing"), ")");
    }
    std::map<std::string, PyValue> out;
    skip_space();
    while (!eat('}')) {
      const size_t key_pos = i_;
      PyValue key = value(1);
      if (key.kind != PyValue::Kind::string) syntax(key_pos, "dict keys must be strings");
      skip_space();
      if (!eat(':')) syntax(i_, "expected ':' after key " + quote_header_text(key.text));
      PyValue v = value(1);
      if (out.count(key.text)) {
        fail(source_, ": header has a duplicate key ", quote_header_text(key.text));
      }
      out.emplace(std::move(key.text), std::move(v));
      skip_space();
      if (eat(',')) {
        skip_space();
      } else if (!(i_ < s_.size() && s_[i_] == '}')) {
        syntax(i_, "expected ',' or '}'");
      }
    }
    skip_space();
    if (i_ != s_.size()) syntax(i_, "unexpected text after the dict");
    return out;
  }

 private:
  static constexpr int kMaxDepth = 32;

  [[noreturn]] void syntax(size_t pos, const std::string& what) const {
    fail(source_, ": header is not a valid Python dict literal: ", what, " at byte ", pos + 1,
         " of the header");
  }

  void skip_space() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r' ||
                              s_[i_] == '\f' || s_[i_] == '\v')) {
      ++i_;
    }
  }

  bool eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }

  static bool is_word_char(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           c == '.';
  }

  PyValue value(int depth) {
    if (depth > kMaxDepth) syntax(i_, "nesting deeper than " + std::to_string(kMaxDepth));
    skip_space();
    if (i_ >= s_.size()) syntax(i_, "unexpected end of the header");
    const char c = s_[i_];
    if (c == '\'' || c == '"') return string();
    if (c == '(') return sequence(')', PyValue::Kind::tuple, depth);
    if (c == '[') return sequence(']', PyValue::Kind::list, depth);
    if (c == '{') return dict(depth);
    if (c == '-' || c == '+' || is_word_char(c)) return word();
    syntax(i_, "unexpected " + quote_header_text(s_.substr(i_, 1)));
  }

  PyValue string() {
    const char q = s_[i_++];
    PyValue v;
    v.kind = PyValue::Kind::string;
    for (;;) {
      if (i_ >= s_.size() || s_[i_] == '\n') syntax(i_, "unterminated string");
      const char c = s_[i_++];
      if (c == q) break;
      if (c == '\\' && i_ < s_.size()) {
        const char e = s_[i_++];
        if (e == '\\' || e == '\'' || e == '"') {
          v.text += e;
        } else {  // other escapes never occur in a valid header; keep them verbatim
          v.text += '\\';
          v.text += e;
        }
        continue;
      }
      v.text += c;
    }
    return v;
  }

  // Python semantics: (x) is x; (x,) and (x, y) are tuples; () is the empty tuple.
  PyValue sequence(char close, PyValue::Kind kind, int depth) {
    ++i_;
    PyValue v;
    v.kind = kind;
    bool saw_comma = false;
    skip_space();
    while (!eat(close)) {
      v.items.push_back(value(depth + 1));
      skip_space();
      if (eat(',')) {
        saw_comma = true;
        skip_space();
      } else if (!(i_ < s_.size() && s_[i_] == close)) {
        syntax(i_, std::string("expected ',' or '") + close + "'");
      }
    }
    if (kind == PyValue::Kind::tuple && v.items.size() == 1 && !saw_comma) {
      return std::move(v.items[0]);
    }
    return v;
  }

  PyValue dict(int depth) {
    ++i_;
    PyValue v;
    v.kind = PyValue::Kind::dict;
    skip_space();
    while (!eat('}')) {
      value(depth + 1);
      skip_space();
      if (!eat(':')) syntax(i_, "expected ':'");
      value(depth + 1);
      skip_space();
      if (eat(',')) {
        skip_space();
      } else if (!(i_ < s_.size() && s_[i_] == '}')) {
        syntax(i_, "expected ',' or '}'");
      }
    }
    return v;
  }

  // Names and numbers: True, False, None, integers (with Python 2's 'L' suffix), anything else.
  PyValue word() {
    PyValue v;
    const size_t sign_pos = i_;
    bool negative = false;
    if (s_[i_] == '-' || s_[i_] == '+') {
      negative = s_[i_] == '-';
      ++i_;
      skip_space();
    }
    const size_t start = i_;
    while (i_ < s_.size() && is_word_char(s_[i_])) ++i_;
    std::string_view w = s_.substr(start, i_ - start);
    if (w.empty()) syntax(start, "expected a number after the sign");
    v.text = std::string(s_.substr(sign_pos, i_ - sign_pos));
    if (w.size() > 1 && (w.back() == 'L' || w.back() == 'l')) w.remove_suffix(1);
    if (std::all_of(w.begin(), w.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      v.kind = PyValue::Kind::integer;
      v.negative = negative;
      int64_t n = 0;
      bool overflow = false;
      for (char c : w) {
        overflow = overflow || __builtin_mul_overflow(n, int64_t{10}, &n) ||
                   __builtin_add_overflow(n, int64_t{c - '0'}, &n);
      }
      if (!overflow) v.int_value = negative ? -n : n;
    } else if (sign_pos == start && (w == "True" || w == "False")) {
      v.kind = PyValue::Kind::boolean;
      v.flag = w == "True";
    } else if (sign_pos == start && w == "None") {
      v.kind = PyValue::Kind::none;
    }
    return v;
  }

  std::string_view s_;
  const std::string& source_;
  size_t i_ = 0;
};

// Element count times item size, or nullopt on overflow.
std::optional<uint64_t> byte_size(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

DType parse_descr(const PyValue& v, const std::string& source) {
  if (v.kind == PyValue::Kind::list) {
    fail(source, ": structured arrays (descr is a list of fields) are not supported");
  }
  if (v.kind != PyValue::Kind::string) {
    fail(source, ": header 'descr' must be a string such as '<f4'");
  }
  std::string_view code = v.text;
  char order = '=';
  if (!code.empty() && std::string_view("<>=|").find(code[0]) != std::string_view::npos) {
    order = code[0];
    code.remove_prefix(1);
  }
  for (const DescrInfo& d : kDescrs) {
    if (d.code != code) continue;
    if (order == '>') {
      fail(source, ": descr ", quote_header_text(v.text),
           " is big-endian, which is not supported; save arr.astype('<", d.code, "')");
    }
    if (order == '<' || order == '=') return d.dtype;
  }
  if (order == '>') {
    fail(source, ": descr ", quote_header_text(v.text),
         " is big-endian and not supported; seqforge reads '<f2', '<f4', '<f8', '<i4' and '<i8'");
  }
  fail(source, ": unsupported descr ", quote_header_text(v.text),
       "; seqforge reads '<f2', '<f4', '<f8', '<i4' and '<i8'");
}

std::vector<int64_t> parse_shape(const PyValue& v, const std::string& source) {
  const std::string expected = ": header 'shape' must be a tuple of non-negative integers";
  if (v.kind != PyValue::Kind::tuple) fail(source, expected);
  std::vector<int64_t> shape;
  shape.reserve(v.items.size());
  for (const PyValue& d : v.items) {
    if (d.kind != PyValue::Kind::integer)
      fail(source, expected, ", got ", quote_header_text(d.text));
    if (d.negative && d.int_value != 0) {  // -0 is 0
      std::string written = "(";
      for (size_t i = 0; i < v.items.size() && i < 16; ++i) {
        written += (i ? ", " : "") + v.items[i].text;
      }
      written += v.items.size() > 16 ? ", ...)" : v.items.size() == 1 ? ",)" : ")";
      fail(source, ": header 'shape' ", quote_header_text(written), " has a negative dimension");
    }
    if (!d.int_value)
      fail(source, ": header 'shape' dimension ", quote_header_text(d.text), " is too large");
    shape.push_back(*d.int_value);
  }
  return shape;
}

uint32_t read_le(std::string_view b, size_t pos, size_t n) {
  uint32_t v = 0;
  for (size_t i = n; i-- > 0;) v = (v << 8) | static_cast<unsigned char>(b[pos + i]);
  return v;
}

// Validates `bytes`; returns the array with its data offset in `*data_offset` and no data copied.
// `*fortran_order`: whether its data is in Fortran order (first index fastest) and differs from C
// order.
NpyArray parse_header(std::string_view bytes, const std::string& source, size_t* data_offset,
                      bool* fortran_order) {
  if (bytes.substr(0, kMagic.size()) != kMagic.substr(0, std::min(bytes.size(), kMagic.size()))) {
    fail(source, ": not a .npy file (it does not start with \\x93NUMPY)");
  }
  if (bytes.size() < 8) fail(source, ": file too short (", bytes.size(), " bytes) for a .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  const int minor = static_cast<unsigned char>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0) {
    fail(source, ": unsupported .npy format version ", major, ".", minor,
         " (seqforge reads 1.0, 2.0 and 3.0)");
  }
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_bytes) {
    fail(source, ": truncated header: file too short (", bytes.size(),
         " bytes) for the header length of format ", major, ".0");
  }
  const size_t header_len = read_le(bytes, 8, len_bytes);
  const size_t header_start = 8 + len_bytes;
  if (header_len > bytes.size() - header_start) {
    fail(source, ": truncated header: header length ", header_len, " exceeds the ",
         bytes.size() - header_start, " bytes after the preamble");
  }

  NpyHeaderParser parser(bytes.substr(header_start, header_len), source);
  std::map<std::string, PyValue> dict = parser.parse_dict();
  for (const auto& [key, value] : dict) {
    if (key != "descr" && key != "fortran_order" && key != "shape") {
      fail(source, ": header has an unexpected key ", quote_header_text(key),
           " (expected 'descr', 'fortran_order', 'shape')");
    }
  }
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (!dict.count(key)) fail(source, ": header has no '", key, "' key");
  }

  NpyArray a;
  a.dtype = parse_descr(dict["descr"], source);
  const PyValue& fortran = dict["fortran_order"];
  if (fortran.kind != PyValue::Kind::boolean) {
    fail(source, ": header 'fortran_order' must be True or False");
  }
  a.shape = parse_shape(dict["shape"], source);
  const std::optional<uint64_t> nbytes = byte_size(a.shape, a.dtype);
  if (!nbytes)
    fail(source, ": shape ", numpy_shape(a.shape), " is too large (byte size overflows)");
  // With at most one dimension above 1 (or no elements), Fortran and C order are the same bytes.
  const auto big_dims =
      std::count_if(a.shape.begin(), a.shape.end(), [](int64_t d) { return d > 1; });
  *fortran_order = fortran.flag && big_dims > 1 && *nbytes > 0;

  *data_offset = header_start + header_len;
  const uint64_t have = bytes.size() - *data_offset;
  if (have < *nbytes) {
    fail(source, ": truncated data: shape ", numpy_shape(a.shape), " of ",
         quote_header_text(dict["descr"].text), " needs ", *nbytes, " bytes, the file has ", have);
  }
  if (have > *nbytes) {
    fail(source, ": ", have - *nbytes, " trailing bytes after the data (shape ",
         numpy_shape(a.shape), " of ", quote_header_text(dict["descr"].text), " needs ", *nbytes,
         " bytes)");
  }
  return a;
}

std::string errno_str(int e) { return std::strerror(e); }

// The elements of a Fortran-order array (np.save of a transposed view, or of a pandas frame's
// .values) in C order, in memory: one too large for it is an error naming `source`.
std::vector<std::byte> c_order_of(const std::byte* src, const std::vector<int64_t>& shape,
                                  DType dtype, const std::string& source) {
  const size_t size = dtype_size(dtype), dims = shape.size();
  std::vector<int64_t> stride(dims), index(dims, 0);  // in elements of the Fortran-order source
  int64_t n = 1;
  for (size_t k = 0; k < dims; ++k) stride[k] = n, n *= shape[k];
  if (const int64_t need = n * int64_t(size), available = available_memory_bytes();
      need > available / 2)
    fail(source, ": a Fortran-order array is reordered in memory, and its ", need >> 20,
         " MB are more than half the ", available >> 20,
         " MB available; save it with numpy.ascontiguousarray to have it read in place");
  std::vector<std::byte> dst(static_cast<size_t>(n) * size);
  int64_t from = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst.data() + static_cast<size_t>(i) * size, src + static_cast<size_t>(from) * size,
                size);
    for (size_t k = dims; k-- > 0;) {  // the next C-order index: the last one fastest
      if (++index[k] < shape[k]) {
        from += stride[k];
        break;
      }
      from -= stride[k] * (shape[k] - 1);
      index[k] = 0;
    }
  }
  return dst;
}

}  // namespace

NpyArray parse_npy(std::string_view bytes, const std::string& source) {
  size_t offset = 0;
  bool fortran = false;
  NpyArray a = parse_header(bytes, source, &offset, &fortran);
  const auto* begin = reinterpret_cast<const std::byte*>(bytes.data()) + offset;
  if (fortran)
    a.data = c_order_of(begin, a.shape, a.dtype, source);
  else
    a.data.assign(begin, begin + (bytes.size() - offset));
  return a;
}

namespace {

// The arrays MemoryNpy registered, by path.
std::mutex memory_arrays_mutex;
std::map<std::string, MappedNpy>& memory_arrays() {
  static std::map<std::string, MappedNpy> arrays;
  return arrays;
}

}  // namespace

MemoryNpy::MemoryNpy(const std::string& name, MappedNpy array) {
  std::lock_guard<std::mutex> lock(memory_arrays_mutex);
  static int64_t registered = 0;
  path_ = "<" + name + " " + std::to_string(++registered) + ">.npy";
  memory_arrays()[path_] = std::move(array);
}

MemoryNpy::~MemoryNpy() {
  std::lock_guard<std::mutex> lock(memory_arrays_mutex);
  memory_arrays().erase(path_);
}

bool MemoryNpy::is_registered(const std::string& path) {
  std::lock_guard<std::mutex> lock(memory_arrays_mutex);
  return memory_arrays().count(path) > 0;
}

MappedNpy map_npy(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(memory_arrays_mutex);
    if (auto it = memory_arrays().find(path); it != memory_arrays().end()) return it->second;
  }
  MappedFile file = map_file(path);
  size_t offset = 0;
  bool fortran = false;
  NpyArray header =
      parse_header(std::string_view(reinterpret_cast<const char*>(file.data), file.size), path,
                   &offset, &fortran);
  MappedNpy m;
  m.dtype = header.dtype;
  m.shape = std::move(header.shape);
  if (fortran) {  // reordered into memory: C order is what every reader indexes
    auto ordered = std::make_shared<const std::vector<std::byte>>(
        c_order_of(file.data + offset, m.shape, m.dtype, path));
    m.data = ordered->data();
    m.mapping = std::move(ordered);
    return m;
  }
  m.data = file.data + offset;
  m.mapping = std::move(file.mapping);
  return m;
}

NpyArray read_npy(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, ": cannot open: ", errno_str(errno));
  std::vector<std::byte> buf;
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  buf.resize(regular ? static_cast<size_t>(st.st_size) + 1 : size_t{1} << 16);
  size_t size = 0;
  for (;;) {
    if (size == buf.size()) buf.resize(buf.size() * 2);
    const ssize_t r = ::read(fd, buf.data() + size, buf.size() - size);
    if (r == 0) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      fail(path, ": cannot read: ", errno_str(e));
    }
    size += static_cast<size_t>(r);
  }
  ::close(fd);
  buf.resize(size);

  // Validate in place, then slide the data to the front: no second copy of a large array.
  size_t offset = 0;
  bool fortran = false;
  NpyArray a = parse_header(std::string_view(reinterpret_cast<const char*>(buf.data()), buf.size()),
                            path, &offset, &fortran);
  if (fortran) {
    a.data = c_order_of(buf.data() + offset, a.shape, a.dtype, path);
    return a;
  }
  std::memmove(buf.data(), buf.data() + offset, size - offset);
  buf.resize(size - offset);
  a.data = std::move(buf);
  return a;
}

void write_npy(const std::string& path, DType dtype, const std::vector<int64_t>& shape,
               const void* data) {
  if (path.empty()) fail("write_npy: empty output path");
  const DescrInfo* info = nullptr;
  for (const DescrInfo& d : kDescrs) {
    if (d.dtype == dtype) info = &d;
  }
  if (info == nullptr) {
    fail(path, ": cannot write dtype ", dtype_name(dtype),
         " as .npy (supported: f32, f64, i32, i64)");
  }
  for (int64_t d : shape) {
    if (d < 0) fail(path, ": negative dimension in shape ", numpy_shape(shape));
  }
  const std::optional<uint64_t> nbytes = byte_size(shape, dtype);
  if (!nbytes) fail(path, ": shape ", numpy_shape(shape), " is too large");
  if (*nbytes > 0 && data == nullptr) fail(path, ": null data for shape ", numpy_shape(shape));

  std::string header = "{'descr': '<";
  header += info->code;
  header += "', 'fortran_order': False, 'shape': ";
  header += "(";
  for (size_t i = 0; i < shape.size(); ++i) header += (i ? ", " : "") + std::to_string(shape[i]);
  header += shape.size() == 1 ? ",), }" : "), }";
  // Pad with spaces so the data starts at a multiple of 64 bytes, as numpy does.
  const bool v2 = 10 + header.size() + 1 > 65535;
  const size_t preamble = v2 ? 12 : 10;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string pre(kMagic);
  pre += static_cast<char>(v2 ? 2 : 1);
  pre += '\0';
  for (size_t i = 0; i < preamble - 8; ++i)
    pre += static_cast<char>((header.size() >> (8 * i)) & 0xff);

  write_file_atomically(
      path, {{pre.data(), pre.size()}, {header.data(), header.size()}, {data, *nbytes}});
}

}  // namespace seqforge::io
