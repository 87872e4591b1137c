#include "seqforge/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <utility>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "seqforge/core/hash.hpp"

namespace seqforge::io {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts would need byte swapping");
static_assert(sizeof(size_t) == sizeof(uint64_t), "64-bit size_t expected");

namespace {

using json = nlohmann::json;

// Names come from untrusted files: keep error messages on one line and of bounded length.
std::string quote_name(std::string_view s) { return quoted(s, 120); }

std::string json_shape(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  std::string s(1, '[');
  s += std::to_string(begin);
  s += ", ";
  s += std::to_string(end);
  s += ']';
  return s;
}

// Byte size of a tensor, or false on overflow.
bool byte_size(const std::vector<int64_t>& shape, DType dtype, uint64_t* out) {
  uint64_t n = dtype_size(dtype);
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return false;
  }
  *out = n;
  return true;
}

// dtypes in the safetensors format that seqforge does not load.
bool is_known_unsupported_dtype(std::string_view s) {
  static constexpr std::string_view kOthers[] = {
      "BOOL",    "U8",      "I8",      "U16",     "I16",     "U32", "U64",         "C64",
      "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "F8_E4M3FNUZ", "F8_E5M2FNUZ"};
  return std::find(std::begin(kOthers), std::end(kOthers), s) != std::end(kOthers);
}

struct RawEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint64_t> offsets;
  bool has_dtype = false, has_shape = false, has_offsets = false;
};

// Streaming (SAX) validation of the header against the schema. Building no DOM keeps memory and
// nesting bounded for hostile input, and lets duplicate keys be detected (nlohmann's DOM parser
// silently keeps the last one). The first problem is recorded in `error` and stops the parse.
class SafetensorsHeaderParser final : public nlohmann::json_sax<json> {
 public:
  std::vector<RawEntry> entries;
  std::map<std::string, std::string> metadata;
  std::string error;
  bool complete = false;

  bool null() override { return scalar(Kind::other, 0, nullptr); }
  bool boolean(bool) override { return scalar(Kind::other, 0, nullptr); }
  bool number_integer(number_integer_t v) override {
    // nlohmann reports non-negative integers via number_unsigned; this one is negative.
    return scalar(v >= 0 ? Kind::uint : Kind::other, static_cast<uint64_t>(v), nullptr);
  }
  bool number_unsigned(number_unsigned_t v) override { return scalar(Kind::uint, v, nullptr); }
  bool number_float(number_float_t, const string_t&) override {
    return scalar(Kind::other, 0, nullptr);
  }
  bool string(string_t& s) override { return scalar(Kind::string, 0, &s); }
  bool binary(binary_t&) override { return scalar(Kind::other, 0, nullptr); }

  bool start_object(std::size_t) override {
    switch (ctx()) {
      case Ctx::none:
        stack_.push_back(Ctx::top);
        return true;
      case Ctx::top:
        if (name_ == "__metadata__") {
          stack_.push_back(Ctx::metadata);
        } else {
          entries.emplace_back();
          entries.back().name = name_;
          stack_.push_back(Ctx::entry);
        }
        return true;
      default:
        return scalar(Kind::other, 0, nullptr);
    }
  }

  bool start_array(std::size_t) override {
    if (ctx() == Ctx::entry && field_ == "shape") {
      stack_.push_back(Ctx::shape);
      return true;
    }
    if (ctx() == Ctx::entry && field_ == "data_offsets") {
      stack_.push_back(Ctx::offsets);
      return true;
    }
    return scalar(Kind::other, 0, nullptr);
  }

  bool key(string_t& k) override {
    switch (ctx()) {
      case Ctx::top:
        if (!names_.insert(k).second) {
          return k == "__metadata__" ? fail_with("duplicate __metadata__ entry")
                                     : fail_with("duplicate tensor name " + quote_name(k));
        }
        if (k.empty()) return fail_with("empty tensor name");
        name_ = k;
        return true;
      case Ctx::entry: {
        RawEntry& e = entries.back();
        bool* seen = k == "dtype"          ? &e.has_dtype
                     : k == "shape"        ? &e.has_shape
                     : k == "data_offsets" ? &e.has_offsets
                                           : nullptr;
        if (seen == nullptr) return fail_with(tensor() + ": unexpected field " + quote_name(k));
        if (*seen) return fail_with(tensor() + ": duplicate field " + quote_name(k));
        *seen = true;
        field_ = k;
        return true;
      }
      case Ctx::metadata:
        if (metadata.count(k)) return fail_with("__metadata__: duplicate key " + quote_name(k));
        field_ = k;
        return true;
      default:  // keys only occur inside objects, and we only enter the objects above
        return fail_with("malformed header");
    }
  }

  bool end_object() override {
    switch (ctx()) {
      case Ctx::top:
        stack_.pop_back();
        complete = true;
        return true;
      case Ctx::entry: {
        const RawEntry& e = entries.back();
        if (!e.has_dtype) return fail_with(tensor() + ": missing field 'dtype'");
        if (!e.has_shape) return fail_with(tensor() + ": missing field 'shape'");
        if (!e.has_offsets) return fail_with(tensor() + ": missing field 'data_offsets'");
        stack_.pop_back();
        return true;
      }
      case Ctx::metadata:
        stack_.pop_back();
        return true;
      default:
        return fail_with("malformed header");
    }
  }

  bool end_array() override {
    if (ctx() == Ctx::offsets && entries.back().offsets.size() != 2) return bad_offsets();
    if (ctx() != Ctx::shape && ctx() != Ctx::offsets) return fail_with("malformed header");
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& ex) override {
    return fail_with("header is not valid JSON (byte " + std::to_string(position) +
                     " of the header): " + io::json_syntax_error(ex.what(), false));
  }

 private:
  enum class Ctx { none, top, entry, metadata, shape, offsets };
  enum class Kind { uint, string, other };

  Ctx ctx() const { return stack_.empty() ? Ctx::none : stack_.back(); }
  std::string tensor() const { return "tensor " + quote_name(name_); }

  bool fail_with(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }
  bool bad_offsets() {
    return fail_with(tensor() + ": data_offsets must be an array of two non-negative integers");
  }

  // Any value other than an object/array we descend into; `kind` says what it is.
  bool scalar(Kind kind, uint64_t u, const std::string* s) {
    switch (ctx()) {
      case Ctx::none:
        return fail_with("header is not a JSON object");
      case Ctx::top:
        if (name_ == "__metadata__") {
          return fail_with("__metadata__ must be an object mapping strings to strings");
        }
        return fail_with(tensor() + ": entry is not a JSON object");
      case Ctx::entry: {
        RawEntry& e = entries.back();
        if (field_ == "dtype") {
          if (kind != Kind::string) return fail_with(tensor() + ": dtype must be a string");
          if (!dtype_from_safetensors_name(*s, &e.dtype)) {
            return fail_with(
                tensor() +
                (is_known_unsupported_dtype(*s) ? ": unsupported dtype " : ": unknown dtype ") +
                quote_name(*s));
          }
          return true;
        }
        if (field_ == "shape") {
          return fail_with(tensor() + ": shape must be an array of non-negative integers");
        }
        return bad_offsets();
      }
      case Ctx::metadata:
        if (kind != Kind::string) {
          return fail_with(
              "__metadata__ must be an object mapping strings to strings (value of key " +
              quote_name(field_) + " is not a string)");
        }
        metadata.emplace(field_, *s);
        return true;
      case Ctx::shape: {
        if (kind != Kind::uint) {
          return fail_with(tensor() + ": shape must be an array of non-negative integers");
        }
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return fail_with(tensor() + ": shape dimension " + std::to_string(u) + " is too large");
        }
        entries.back().shape.push_back(static_cast<int64_t>(u));
        return true;
      }
      case Ctx::offsets: {
        auto& offsets = entries.back().offsets;
        if (kind != Kind::uint || offsets.size() == 2) return bad_offsets();
        offsets.push_back(u);
        return true;
      }
    }
    return fail_with("malformed header");
  }

  std::vector<Ctx> stack_;
  std::set<std::string> names_;
  std::string name_;   // current top-level key
  std::string field_;  // current key inside an entry or __metadata__
};

uint64_t read_u64_le(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Escapes a string as a JSON string literal; throws seqforge::Error on invalid UTF-8.
std::string json_string(const std::string& path, const std::string& s, const char* what) {
  try {
    return json(s).dump();
  } catch (const json::exception&) {
    fail(path, ": ", what, " ", quote_name(s), " is not valid UTF-8");
  }
}

}  // namespace

namespace {
// The tensors' indices in name order: the hashes do not depend on the order a writer lays the
// tensors out in (Python's safetensors sorts them).
template <typename Tensors>
std::vector<size_t> by_name(const Tensors& tensors) {
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  return order;
}

// Each tensor's name, dtype and shape in name order, then every metadata entry but the two
// hashes, as 16 hex digits.
template <typename Tensors>
std::string header_hash_text(const Tensors& tensors,
                             const std::map<std::string, std::string>& metadata) {
  uint64_t h = 0;
  const auto add = [&](std::string_view s) {
    h = hash_bytes(s.data(), s.size(), h);
    h = hash_bytes("", 1, h);  // the terminating NUL: "ab","c" is not "a","bc"
  };
  for (const size_t i : by_name(tensors)) {
    const auto& t = tensors[i];
    add(t.name);
    add(dtype_safetensors_name(t.dtype));
    h = hash_bytes(t.shape.data(), t.shape.size() * sizeof(int64_t), h);
    add("");
  }
  for (const auto& [key, value] : metadata)
    if (key != SafetensorsFile::kDataHashKey && key != SafetensorsFile::kHeaderHashKey) {
      add(key);
      add(value);
    }
  return hash_hex(h);
}
}  // namespace

SafetensorsFile SafetensorsFile::read(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return parse(read_file(path), path);
  MappedFile m = map_file(path);
  return parse(m.data, m.size, std::move(m.mapping), path);
}

SafetensorsFile SafetensorsFile::parse(std::string bytes, const std::string& source) {
  auto owner = std::make_shared<const std::string>(std::move(bytes));
  return parse(reinterpret_cast<const std::byte*>(owner->data()), owner->size(), owner, source);
}

SafetensorsFile SafetensorsFile::parse(const std::byte* data, size_t size,
                                       std::shared_ptr<const void> owner,
                                       const std::string& source) {
  const char* bytes = reinterpret_cast<const char*>(data);
  if (size < 8) {
    fail(source, ": file too short (", size, " bytes) to hold the 8-byte header length");
  }
  const uint64_t header_len = read_u64_le(bytes);
  // torch.save's files (nanoGPT's ckpt.pt): a zip archive, or a pickle in older PyTorch; told
  // apart only where the first 8 bytes are no header length this file can hold.
  const bool torch_save =
      std::string_view(bytes, 4) == "PK\x03\x04" ||
      (static_cast<unsigned char>(bytes[0]) == 0x80 && bytes[1] >= 2 && bytes[1] <= 5);
  if (torch_save && (header_len > kMaxHeaderBytes || header_len > size - 8))
    fail(source, ": a PyTorch file (torch.save), not safetensors: save the state dict with ",
         "safetensors.torch.save_file(model.state_dict(), \"model.safetensors\") (nanoGPT's "
         "ckpt.pt: its \"model\" entry)");
  if (header_len > kMaxHeaderBytes) {
    fail(source, ": header length ", header_len, " exceeds the limit of ", kMaxHeaderBytes,
         " bytes");
  }
  if (header_len > size - 8) {
    fail(source, ": header length ", header_len, " exceeds the file size (", size, " bytes)");
  }

  const char* header_begin = bytes + 8;
  // nlohmann's lexer treats a NUL byte as the end of input, which would let "{}\0<anything>"
  // pass; raw NUL is never valid in JSON text.
  if (const void* nul = std::memchr(header_begin, '\0', header_len)) {
    fail(source, ": header is not valid JSON (byte ",
         static_cast<const char*>(nul) - header_begin + 1, " of the header): NUL byte");
  }
  SafetensorsHeaderParser parser;
  const bool ok = json::sax_parse(header_begin, header_begin + header_len, &parser,
                                  nlohmann::detail::input_format_t::json, /*strict=*/true,
                                  /*ignore_comments=*/false);
  if (!parser.error.empty()) fail(source, ": ", parser.error);
  if (!ok || !parser.complete) fail(source, ": malformed header");

  SafetensorsFile file;
  file.source_ = source;
  file.data_start_ = 8 + header_len;
  const uint64_t data_size = size - file.data_start_;

  file.entries_.reserve(parser.entries.size());
  for (RawEntry& r : parser.entries) {
    const std::string t = "tensor " + quote_name(r.name);
    const uint64_t begin = r.offsets[0], end = r.offsets[1];
    if (begin > end) {
      fail(source, ": ", t, ": data_offsets ", offsets_str(begin, end), " have begin > end");
    }
    if (end > data_size) {
      fail(source, ": ", t, ": data_offsets ", offsets_str(begin, end),
           " are out of range of the data buffer (", data_size, " bytes)");
    }
    uint64_t nbytes = 0;
    if (!byte_size(r.shape, r.dtype, &nbytes)) {
      fail(source, ": ", t, ": shape ", json_shape(r.shape), " is too large (byte size overflows)");
    }
    if (nbytes != end - begin) {
      fail(source, ": ", t, ": shape ", json_shape(r.shape), " of dtype ",
           dtype_safetensors_name(r.dtype), " needs ", nbytes, " bytes but data_offsets ",
           offsets_str(begin, end), " span ", end - begin);
    }
    file.entries_.push_back(SafetensorsEntry{std::move(r.name), r.dtype, std::move(r.shape),
                                             static_cast<size_t>(begin), static_cast<size_t>(end)});
  }

  // The ranges, sorted by begin, must tile [0, data_size) exactly.
  std::vector<const SafetensorsEntry*> sorted;
  sorted.reserve(file.entries_.size());
  for (const auto& e : file.entries_) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  size_t expected = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : sorted) {
    if (e->begin < expected) {
      fail(source, ": tensor ", quote_name(e->name), " (data_offsets ",
           offsets_str(e->begin, e->end), ") overlaps tensor ", quote_name(prev->name),
           " (data_offsets ", offsets_str(prev->begin, prev->end), ")");
    }
    if (e->begin > expected) {
      fail(source, ": hole of ", e->begin - expected,
           " unused bytes in the data buffer before tensor ", quote_name(e->name),
           " (data_offsets ", offsets_str(e->begin, e->end), ")");
    }
    expected = e->end;
    prev = e;
  }
  if (expected != data_size) {
    fail(source, ": hole of ", data_size - expected,
         " unused bytes at the end of the data buffer after the last tensor");
  }

  file.metadata_ = std::move(parser.metadata);
  if (const auto it = file.metadata_.find(kHeaderHashKey); it != file.metadata_.end()) {
    const std::string now = header_hash_text(file.entries_, file.metadata_);
    if (now != it->second)
      fail(source, ": its header (tensor names, dtypes, shapes or metadata) differs from the hash ",
           "written with it (", kHeaderHashKey, " ", it->second, ", now ", now,
           "): the file was damaged after it was written; use another copy. Changed on "
           "purpose: drop that key from the metadata");
  }
  file.data_ = data;
  file.size_ = size;
  file.owner_ = std::move(owner);
  return file;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::span<const std::byte> SafetensorsFile::bytes(const SafetensorsEntry& e) const {
  const size_t data_size = size_ - std::min(size_, data_start_);
  if (e.begin > e.end || e.end > data_size) {
    fail(source_, ": tensor ", quote_name(e.name), ": data_offsets ", offsets_str(e.begin, e.end),
         " are out of range of the data buffer (", data_size, " bytes)");
  }
  const std::byte* base = data_ + data_start_;
  return {base + e.begin, e.end - e.begin};
}

void SafetensorsFile::check_data_hash() const {
  const auto it = metadata_.find(kDataHashKey);
  if (it == metadata_.end()) return;
  // In name order (as written now), or in file order (as earlier versions wrote it).
  const auto hash_in = [&](const std::vector<size_t>& order) {
    uint64_t h = 0;
    for (const size_t i : order) {
      const std::span<const std::byte> b = bytes(entries_[i]);
      h = hash_bytes(b.data(), b.size(), h);
    }
    return h;
  };
  std::vector<size_t> file_order(entries_.size());
  std::iota(file_order.begin(), file_order.end(), size_t{0});
  const uint64_t h = hash_in(by_name(entries_));
  if (hash_hex(h) != it->second && hash_hex(hash_in(file_order)) != it->second)
    fail(source_, ": its tensors' bytes differ from the hash written with them (", kDataHashKey,
         " ", it->second, ", now ", hash_hex(h),
         "): the file was damaged after it was written (a disk or a copy); use another copy. "
         "Tensors changed on purpose: drop that key from the metadata");
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& given_metadata) {
  if (path.empty()) fail("write_safetensors: empty output path");

  // The tensors checked and sized, and their bytes hashed into the metadata.
  std::set<std::string_view> names;
  std::vector<uint64_t> sizes;
  sizes.reserve(tensors.size());
  uint64_t total = 0, hash = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor& t = tensors[i];
    if (t.name.empty()) fail(path, ": tensor #", i, " has an empty name");
    if (t.name == "__metadata__") fail(path, ": '__metadata__' is reserved, not a tensor name");
    if (!names.insert(t.name).second) fail(path, ": duplicate tensor name ", quote_name(t.name));
    for (int64_t d : t.shape) {
      if (d < 0) {
        fail(path, ": tensor ", quote_name(t.name), ": negative dimension in shape ",
             json_shape(t.shape));
      }
    }
    uint64_t nbytes = 0;
    if (!byte_size(t.shape, t.dtype, &nbytes) || __builtin_add_overflow(total, nbytes, &total)) {
      fail(path, ": tensor ", quote_name(t.name), ": shape ", json_shape(t.shape), " is too large");
    }
    if (nbytes > 0 && t.data == nullptr) fail(path, ": tensor ", quote_name(t.name), ": null data");
    sizes.push_back(nbytes);
  }
  for (const size_t i : by_name(tensors)) hash = hash_bytes(tensors[i].data, sizes[i], hash);
  std::map<std::string, std::string> metadata = given_metadata;
  metadata[SafetensorsFile::kDataHashKey] = hash_hex(hash);
  metadata[SafetensorsFile::kHeaderHashKey] = header_hash_text(tensors, metadata);

  // Header: __metadata__ first, then the tensors in the given order with contiguous offsets.
  std::string header = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : metadata) {
    if (!first) header += ',';
    first = false;
    header += json_string(path, k, "metadata key");
    header += ':';
    header += json_string(path, v, "metadata value");
  }
  header += '}';
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor& t = tensors[i];
    offset += sizes[i];
    header += ',';
    header += json_string(path, t.name, "tensor name");
    header += ":{\"dtype\":\"";
    header += dtype_safetensors_name(t.dtype);
    header += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d) header += ',';
      header += std::to_string(t.shape[d]);
    }
    header += "],\"data_offsets\":[";
    header += std::to_string(offset - sizes[i]);
    header += ',';
    header += std::to_string(offset);
    header += "]}";
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');
  if (header.size() > SafetensorsFile::kMaxHeaderBytes) {
    fail(path, ": header of ", header.size(), " bytes exceeds the limit of ",
         SafetensorsFile::kMaxHeaderBytes, " bytes");
  }

  char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  std::vector<ByteSpan> parts = {{len_bytes, 8}, {header.data(), header.size()}};
  for (size_t i = 0; i < tensors.size(); ++i) parts.push_back({tensors[i].data, sizes[i]});
  write_file_atomically(path, parts);
}

}  // namespace seqforge::io
