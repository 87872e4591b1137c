#include "seqforge/io/safetensors.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "io/file_util.hpp"
#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"
#include "test_util.hpp"

namespace seqforge::io::safetensors_test {
namespace {

namespace fs = std::filesystem;

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file from its parts; `header_len` overrides the length prefix.
std::string raw_file(std::string_view header, std::string_view data, int64_t header_len = -1) {
  return u64_le(header_len < 0 ? header.size() : static_cast<uint64_t>(header_len)) +
         std::string(header) + std::string(data);
}

template <typename T>
std::vector<std::byte> as_bytes(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<std::byte> to_vector(std::span<const std::byte> s) { return {s.begin(), s.end()}; }

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("seqforge_safetensors_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_raw(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good());
    return p;
  }

  std::string read_raw(const std::string& p) const {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  // Asserts that `f` throws seqforge::Error whose one-line message names `where` and `phrase`.
  template <typename F>
  void expect_error(F&& f, const std::string& where, const std::string& phrase) const {
    try {
      f();
      ADD_FAILURE() << "no error thrown; expected one containing \"" << phrase << "\"";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(where), std::string::npos)
          << "message does not name " << where << ": " << msg;
      EXPECT_NE(msg.find(phrase), std::string::npos)
          << "message lacks \"" << phrase << "\": " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "message is not one line: " << msg;
    }
  }

  // Writes a file made of `header` and `data`, then expects reading it to fail with `phrase`.
  void expect_rejected(std::string_view header, std::string_view data, const std::string& phrase,
                       int64_t header_len = -1) const {
    const std::string p = write_raw("bad.safetensors", raw_file(header, data, header_len));
    expect_error([&] { SafetensorsFile::read(p); }, p, phrase);
  }

  fs::path dir_;
};

// ---------------------------------------------------------------------------------------------
// Round trips

TEST_F(SafetensorsTest, RoundTripEveryDtypeWithMetadataScalarAndEmptyTensors) {
  const std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, 1e-30f, -7.0f};
  const std::vector<double> f64 = {3.141592653589793, -1e300};
  const std::vector<uint16_t> bf16v = {to_bf16(1.0f).bits, to_bf16(-0.5f).bits, to_bf16(3.0f).bits};
  const std::vector<uint16_t> f16v = {to_f16(1.0f), to_f16(65504.0f), to_f16(-0.25f), to_f16(2.0f)};
  const std::vector<int32_t> i32 = {-1, 0, 2147483647, -2147483647 - 1};
  const std::vector<int64_t> i64 = {std::numeric_limits<int64_t>::min(), 42};
  const double scalar = 2.5;
  const std::vector<SafetensorsTensor> tensors = {
      {"weight_ih_l0", DType::f32, {2, 3}, f32.data()},
      {"double", DType::f64, {2}, f64.data()},
      {"bf", DType::bf16, {3, 1}, bf16v.data()},
      {"half", DType::f16, {2, 1, 2}, f16v.data()},
      {"ints", DType::i32, {4}, i32.data()},
      {"longs", DType::i64, {1, 2}, i64.data()},
      {"scalar", DType::f64, {}, &scalar},
      {"empty", DType::f32, {0, 5}, nullptr},
      {"empty_i64", DType::i64, {3, 0}, nullptr},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note", "quote \" backslash \\ é"}};
  const std::string p = path("model.safetensors");
  write_safetensors(p, tensors, metadata);

  const std::string raw = read_raw(p);
  ASSERT_GE(raw.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(raw[i]);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_NE(raw.find("__metadata__"), std::string::npos);

  const SafetensorsFile file = SafetensorsFile::read(p);
  EXPECT_EQ(file.source(), p);
  std::map<std::string, std::string> read_metadata = file.metadata();
  EXPECT_EQ(read_metadata.erase(SafetensorsFile::kDataHashKey), 1u);
  EXPECT_EQ(read_metadata.erase(SafetensorsFile::kHeaderHashKey), 1u);
  EXPECT_EQ(read_metadata, metadata);
  EXPECT_NO_THROW(file.check_data_hash());
  ASSERT_EQ(file.entries().size(), tensors.size());
  const std::vector<std::vector<std::byte>> expected = {as_bytes(f32),
                                                        as_bytes(f64),
                                                        as_bytes(bf16v),
                                                        as_bytes(f16v),
                                                        as_bytes(i32),
                                                        as_bytes(i64),
                                                        as_bytes(std::vector<double>{scalar}),
                                                        {},
                                                        {}};
  size_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsEntry& e = file.entries()[i];
    SCOPED_TRACE(e.name);
    EXPECT_EQ(e.name, tensors[i].name);
    EXPECT_EQ(e.dtype, tensors[i].dtype);
    EXPECT_EQ(e.shape, tensors[i].shape);
    EXPECT_EQ(e.begin, offset);  // contiguous, in the given order
    EXPECT_EQ(e.end, offset + expected[i].size());
    EXPECT_EQ(to_vector(file.bytes(e)), expected[i]);
    EXPECT_EQ(file.find(e.name), &e);
    offset = e.end;
  }
  EXPECT_EQ(raw.size(), 8 + header_len + offset);
  EXPECT_EQ(file.find("missing"), nullptr);
  EXPECT_EQ(file.entries()[6].shape.size(), 0u);
}

TEST_F(SafetensorsTest, RoundTripWithoutMetadataHoldsTheHashesAlone) {
  const std::vector<int64_t> ids = {1, 2, 3};
  const std::string p = path("ids.safetensors");
  write_safetensors(p, {{"ids", DType::i64, {3}, ids.data()}});
  const SafetensorsFile file = SafetensorsFile::read(p);
  ASSERT_EQ(file.metadata().size(), 2u);
  EXPECT_EQ(file.metadata().at(SafetensorsFile::kDataHashKey).size(), 16u);
  EXPECT_EQ(file.metadata().at(SafetensorsFile::kHeaderHashKey).size(), 16u);
  ASSERT_EQ(file.entries().size(), 1u);
  EXPECT_EQ(to_vector(file.bytes(file.entries()[0])), as_bytes(ids));
}

// A byte of a tensor changed after writing is found by the hash written with the file (a
// flipped byte of a weight otherwise loads as another finite number); a file without the hash
// (PyTorch's, Hugging Face's) passes, and a hash given in the metadata is replaced by the true one.
TEST_F(SafetensorsTest, DamagedTensorBytesAreFoundByTheDataHash) {
  const std::vector<float> w = {0.25f, -1.5f, 3.0f, 4.0f};
  const std::string p = path("w.safetensors");
  write_safetensors(p, {{"w", DType::f32, {2, 2}, w.data()}},
                    {{"format", "pt"}, {SafetensorsFile::kDataHashKey, "0000000000000000"}});
  EXPECT_NO_THROW(SafetensorsFile::read(p).check_data_hash());
  std::string raw = read_raw(p);
  raw[raw.size() - 3] ^= 0x01;  // the last float's mantissa: still finite
  std::ofstream(p, std::ios::binary | std::ios::trunc) << raw;
  const SafetensorsFile damaged = SafetensorsFile::read(p);
  try {
    damaged.check_data_hash();
    ADD_FAILURE() << "damaged bytes passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p + ": its tensors' bytes differ from the hash written "
                                             "with them (seqforge.data_hash "),
              std::string::npos)
        << e.what();
  }
  // The same bytes with the metadata as PyTorch writes it (no hash): nothing to check against.
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\","
      "\"shape\":[2,2],\"data_offsets\":[0,16]}}";
  std::string plain(8, '\0');
  for (int i = 0; i < 8; ++i) plain[i] = char((header.size() >> (8 * i)) & 0xff);
  plain += header + raw.substr(raw.size() - 16);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << plain;
  EXPECT_NO_THROW(SafetensorsFile::read(p).check_data_hash());
}

// A changed byte of the header (a normaliser's shift, a stored config's lookback, a shape) is
// found by the header's hash when the file is read: it would otherwise load as other predictions.
TEST_F(SafetensorsTest, AChangedHeaderIsFoundByTheHeaderHash) {
  const std::vector<float> w = {0.25f, -1.5f, 3.0f, 4.0f};
  const std::string p = path("h.safetensors");
  write_safetensors(p, {{"w", DType::f32, {2, 2}, w.data()}, {"v", DType::f32, {4}, w.data()}},
                    {{"seqforge.target_norm", "{\"shift\":[12.07]}"}});
  EXPECT_NO_THROW(SafetensorsFile::read(p).check_data_hash());
  const std::string raw = read_raw(p);
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"12.07", "13.07"}, {"[2,2]", "[4,1]"}, {"\"w\"", "\"x\""}, {"F32", "I32"}}) {
    std::string changed = raw;
    const size_t at = changed.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    changed.replace(at, from.size(), to);
    std::ofstream(p, std::ios::binary | std::ios::trunc) << changed;
    try {
      SafetensorsFile::read(p);
      ADD_FAILURE() << from << " -> " << to << " passed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(p + ": its header (tensor names, dtypes, shapes or "
                                               "metadata) differs from the hash written with it "
                                               "(seqforge.header_hash "),
                std::string::npos)
          << e.what();
    }
  }
}

// The same tensors laid out in another order (as Python's safetensors writes them, sorted), with
// the metadata kept, are the same file to both hashes.
TEST_F(SafetensorsTest, TheHashesDoNotDependOnTheTensorsOrder) {
  const std::vector<float> a = {1, 2, 3}, b = {4, 5};
  const std::string p = path("order.safetensors");
  write_safetensors(p, {{"z", DType::f32, {3}, a.data()}, {"a", DType::f32, {2}, b.data()}},
                    {{"k", "v"}});
  const SafetensorsFile file = SafetensorsFile::read(p);
  nlohmann::json header = {{"__metadata__", file.metadata()}};
  header["a"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}};
  header["z"] = {{"dtype", "F32"}, {"shape", {3}}, {"data_offsets", {8, 20}}};
  const std::string text = header.dump();
  std::string raw(8, '\0');
  for (int i = 0; i < 8; ++i) raw[i] = char((text.size() >> (8 * i)) & 0xff);
  raw += text;
  raw.append(reinterpret_cast<const char*>(b.data()), 8);
  raw.append(reinterpret_cast<const char*>(a.data()), 12);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << raw;
  const SafetensorsFile sorted = SafetensorsFile::read(p);
  EXPECT_EQ(sorted.entries()[0].name, "a");
  EXPECT_NO_THROW(sorted.check_data_hash());
}

TEST_F(SafetensorsTest, RoundTripNoTensors) {
  const std::string p = path("none.safetensors");
  write_safetensors(p, {}, {{"k", "v"}});
  const SafetensorsFile file = SafetensorsFile::read(p);
  EXPECT_TRUE(file.entries().empty());
  EXPECT_EQ(file.metadata().at("k"), "v");
  write_safetensors(p, {});
  EXPECT_TRUE(SafetensorsFile::read(p).entries().empty());
}

TEST_F(SafetensorsTest, RoundTripUnusualNames) {
  const float x = 1.0f, y = 2.0f, z = 3.0f;
  const std::vector<SafetensorsTensor> tensors = {{"a \"quoted\" \\ name", DType::f32, {}, &x},
                                                  {"ünïcödé.权重", DType::f32, {1}, &y},
                                                  {"tab\there\nnewline", DType::f32, {1, 1}, &z}};
  const std::string p = path("names.safetensors");
  write_safetensors(p, tensors);
  const SafetensorsFile file = SafetensorsFile::read(p);
  ASSERT_EQ(file.entries().size(), 3u);
  for (size_t i = 0; i < tensors.size(); ++i) EXPECT_EQ(file.entries()[i].name, tensors[i].name);
}

TEST_F(SafetensorsTest, OverwriteIsAtomicAndLeavesNoTemporaryFiles) {
  const std::string p = path("w.safetensors");
  const std::vector<float> a = {1, 2}, b = {3, 4, 5};
  write_safetensors(p, {{"w", DType::f32, {2}, a.data()}});
  write_safetensors(p, {{"w", DType::f32, {3}, b.data()}});
  const SafetensorsFile file = SafetensorsFile::read(p);
  EXPECT_EQ(to_vector(file.bytes(*file.find("w"))), as_bytes(b));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"w.safetensors"});
}

TEST_F(SafetensorsTest, ParseFromMemoryNamesTheSource) {
  const std::string header = R"({"x":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
  const SafetensorsFile ok = SafetensorsFile::parse(raw_file(header, "abcd"), "in-memory");
  EXPECT_EQ(ok.source(), "in-memory");
  ASSERT_NE(ok.find("x"), nullptr);
  EXPECT_EQ(ok.bytes(*ok.find("x")).size(), 4u);
  expect_error([] { SafetensorsFile::parse("abc", "blob-name"); }, "blob-name", "too short");
  // torch.save's zip (PyTorch 1.6 and later) and pickle files, nanoGPT's ckpt.pt among them.
  const std::string zip{'P', 'K', '\x03', '\x04', '\x14', '\0', '\0', '\0', 'r', 'e', 's', 't'};
  const std::string pickle{'\x80', '\x02', '\x8a', '\x0a', 'l', 'z', '\xfc', '\x9c', 'F', 'j'};
  expect_error([&] { SafetensorsFile::parse(zip, "ckpt.pt"); }, "ckpt.pt",
               "a PyTorch file (torch.save), not safetensors");
  expect_error([&] { SafetensorsFile::parse(pickle, "old.pt"); }, "old.pt",
               "a PyTorch file (torch.save), not safetensors");
  // A header of 640 bytes starts with the bytes of a pickle's protocol 2: still a header.
  const std::string long_header =
      R"({"x":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})" + std::string(640 - 54, ' ');
  ASSERT_EQ(long_header.size(), 640u);
  EXPECT_NE(SafetensorsFile::parse(raw_file(long_header, "abcd"), "m").find("x"), nullptr);
}

TEST_F(SafetensorsTest, AcceptsPaddingWhitespaceFileOrderAndEmptyTensorsAnywhere) {
  // Entries listed in a different order than their data; empty tensors at offsets 0, 4 and 8;
  // whitespace before and after the JSON object (the spec pads with spaces).
  const std::string header =
      " {\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
      "\"e0\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]},"
      "\"e8\":{\"shape\":[2,0],\"data_offsets\":[8,8],\"dtype\":\"I64\"},"
      "\"a\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]},"
      "\"e4\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[4,4]},"
      "\"__metadata__\":{}}     ";
  const std::string p = write_raw("ok.safetensors", raw_file(header, "AAAABBBB"));
  const SafetensorsFile file = SafetensorsFile::read(p);
  ASSERT_EQ(file.entries().size(), 5u);
  EXPECT_EQ(file.entries()[0].name, "b");  // file order
  EXPECT_EQ(file.entries()[3].name, "a");
  const auto* b = file.find("b");
  ASSERT_NE(b, nullptr);
  const auto bytes = file.bytes(*b);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "BBBB");
  EXPECT_EQ(file.find("e8")->dtype, DType::i64);
  EXPECT_EQ(file.find("e8")->shape, (std::vector<int64_t>{2, 0}));
  EXPECT_TRUE(file.metadata().empty());
}

TEST_F(SafetensorsTest, EmptyHeaderObjectWithNoData) {
  const std::string p = write_raw("empty.safetensors", raw_file("{}      ", ""));
  EXPECT_TRUE(SafetensorsFile::read(p).entries().empty());
}

// ---------------------------------------------------------------------------------------------
// Hostile input: every case throws seqforge::Error naming the file and the problem.

constexpr const char* kGood = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";

TEST_F(SafetensorsTest, RejectsMissingFile) {
  const std::string p = path("does_not_exist.safetensors");
  expect_error([&] { SafetensorsFile::read(p); }, p, "cannot open");
}

TEST_F(SafetensorsTest, RejectsDirectory) {
  const std::string p = path("subdir");
  fs::create_directory(p);
  expect_error([&] { SafetensorsFile::read(p); }, p, "not a regular file");
  expect_error([] { SafetensorsFile::read("/dev/zero"); }, "/dev/zero", "not a regular file");
}

TEST_F(SafetensorsTest, RejectsFileShorterThanEightBytes) {
  for (const std::string& bytes : {std::string(), std::string("\x02\0\0\0\0\0\0", 7)}) {
    const std::string p = write_raw("short.safetensors", bytes);
    expect_error([&] { SafetensorsFile::read(p); }, p, "too short");
  }
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  expect_rejected("{}", "", "exceeds the file size", 3);
  expect_rejected("{}", "", "exceeds the file size", 1000);
}

TEST_F(SafetensorsTest, RejectsHeaderLengthAboveLimit) {
  expect_rejected("{}", "", "exceeds the limit of 100000000",
                  static_cast<int64_t>(SafetensorsFile::kMaxHeaderBytes) + 1);
  const std::string p = write_raw("huge.safetensors", u64_le(~uint64_t{0}) + "{}");
  expect_error([&] { SafetensorsFile::read(p); }, p, "exceeds the limit");
}

TEST_F(SafetensorsTest, RejectsInvalidJson) {
  expect_rejected(R"({"a":{"dtype":"F32",)", "", "not valid JSON");
  expect_rejected("", "", "not valid JSON");
  expect_rejected(R"({"a":{)" + std::string(kGood) + "}} trailing", "12345678", "not valid JSON");
  expect_rejected(std::string("{\"a\xff\":{}}"), "", "not valid JSON");  // invalid UTF-8
  expect_rejected("{} // comment", "", "not valid JSON");
  expect_rejected(R"({"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,4]}})", "1234",
                  "not valid JSON (byte 34 of the header): number overflow parsing '1e999'");
  expect_rejected(R"({"w":{"dtype":"F32",})", "",
                  "not valid JSON (byte 21 of the header): unexpected '}'");
  expect_rejected(std::string("{}\0\0\0\0\0\0", 8), "", "not valid JSON");  // NUL padding
  expect_rejected(std::string("{}\0garbage", 10), "", "NUL byte");
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotAnObject) {
  expect_rejected("[]", "", "not a JSON object");
  expect_rejected("42", "", "not a JSON object");
  expect_rejected(R"("text")", "", "not a JSON object");
  expect_rejected("null", "", "not a JSON object");
}

TEST_F(SafetensorsTest, RejectsEntryThatIsNotAnObject) {
  expect_rejected(R"({"w":[1,2]})", "", "tensor 'w': entry is not a JSON object");
  expect_rejected(R"({"w":"F32"})", "", "tensor 'w': entry is not a JSON object");
}

TEST_F(SafetensorsTest, RejectsMissingFields) {
  expect_rejected(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", "12345678",
                  "tensor 'w': missing field 'dtype'");
  expect_rejected(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", "12345678",
                  "tensor 'w': missing field 'shape'");
  expect_rejected(R"({"w":{"dtype":"F32","shape":[2]}})", "12345678",
                  "tensor 'w': missing field 'data_offsets'");
}

TEST_F(SafetensorsTest, RejectsExtraField) {
  expect_rejected(R"({"w":{)" + std::string(kGood) + R"(,"stride":[1]}})", "12345678",
                  "tensor 'w': unexpected field 'stride'");
}

TEST_F(SafetensorsTest, RejectsDuplicateField) {
  expect_rejected(R"({"w":{"dtype":"I64",)" + std::string(kGood) + "}}", "12345678",
                  "tensor 'w': duplicate field 'dtype'");
}

TEST_F(SafetensorsTest, RejectsDtypeThatIsNotAString) {
  expect_rejected(R"({"w":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", "12345678",
                  "tensor 'w': dtype must be a string");
  expect_rejected(R"({"w":{"dtype":["F32"],"shape":[2],"data_offsets":[0,8]}})", "12345678",
                  "tensor 'w': dtype must be a string");
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  expect_rejected(R"({"w":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}})", "12345678",
                  "tensor 'w': unknown dtype 'F128'");
  expect_rejected(R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", "12345678",
                  "unknown dtype 'f32'");
}

TEST_F(SafetensorsTest, RejectsUnsupportedDtype) {
  expect_rejected(R"({"m":{"dtype":"BOOL","shape":[8],"data_offsets":[0,8]}})", "12345678",
                  "tensor 'm': unsupported dtype 'BOOL'");
  expect_rejected(R"({"m":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", "12345678",
                  "unsupported dtype 'U8'");
}

TEST_F(SafetensorsTest, RejectsMalformedShape) {
  const std::string phrase = "tensor 'w': shape must be an array of non-negative integers";
  for (const char* shape : {"2", "\"2\"", "null", "{}", "[-2]", "[2.0]", "[1e3]", "[[2]]", "[true]",
                            "[\"2\"]", "[99999999999999999999999]"}) {
    SCOPED_TRACE(shape);
    expect_rejected(
        std::string(R"({"w":{"dtype":"F32","shape":)") + shape + R"(,"data_offsets":[0,8]}})",
        "12345678", phrase);
  }
  expect_rejected(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})",
                  "12345678", "tensor 'w': shape dimension 9223372036854775808 is too large");
}

TEST_F(SafetensorsTest, RejectsMalformedDataOffsets) {
  const std::string phrase = "tensor 'w': data_offsets must be an array of two non-negative";
  for (const char* offsets : {"8", "null", "{}", "[]", "[8]", "[0,4,8]", "[-1,8]", "[0,8.0]",
                              "[0,\"8\"]", "[[0],8]", "[0,18446744073709551616]"}) {
    SCOPED_TRACE(offsets);
    expect_rejected(
        std::string(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":)") + offsets + "}}",
        "12345678", phrase);
  }
}

TEST_F(SafetensorsTest, RejectsBeginAfterEnd) {
  expect_rejected(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", "12345678",
                  "tensor 'w': data_offsets [8, 0] have begin > end");
}

TEST_F(SafetensorsTest, RejectsByteSizeOverflow) {
  expect_rejected(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                  "12345678",
                  "tensor 'w': shape [4294967296, 4294967296] is too large (byte size overflows)");
  expect_rejected(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,8]}})",
                  "12345678", "byte size overflows");
}

TEST_F(SafetensorsTest, RejectsSizeMismatch) {
  expect_rejected(
      R"({"w":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", "12345678",
      "tensor 'w': shape [2] of dtype F64 needs 16 bytes but data_offsets [0, 8] span 8");
  expect_rejected(R"({"w":{"dtype":"F32","shape":[],"data_offsets":[0,8]}})", "12345678",
                  "needs 4 bytes");
}

TEST_F(SafetensorsTest, RejectsOffsetsOutOfRange) {
  expect_rejected(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "12345678",
                  "tensor 'w': data_offsets [0, 16] are out of range of the data buffer (8 bytes)");
  expect_rejected(
      R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}})",
      "", "out of range");
}

TEST_F(SafetensorsTest, RejectsOverlappingRanges) {
  expect_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  "123456789012", "tensor 'b' (data_offsets [4, 12]) overlaps tensor 'a'");
  // Identical ranges overlap too.
  expect_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                  "12345678", "overlaps tensor");
  // An empty tensor placed strictly inside another one's range.
  expect_rejected(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                  "12345678", "tensor 'e' (data_offsets [4, 4]) overlaps tensor 'a'");
}

TEST_F(SafetensorsTest, RejectsHoleBetweenRanges) {
  expect_rejected(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                  "123456789012", "hole of 4 unused bytes in the data buffer before tensor 'b'");
  expect_rejected(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "12345678",
                  "hole of 4 unused bytes in the data buffer before tensor 'b'");
}

TEST_F(SafetensorsTest, RejectsDataAfterLastTensor) {
  expect_rejected(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "12345678",
                  "hole of 4 unused bytes at the end of the data buffer");
  expect_rejected("{}", "x", "hole of 1 unused bytes at the end");
}

TEST_F(SafetensorsTest, RejectsDuplicateNames) {
  // nlohmann's DOM parser would silently keep the second entry.
  expect_rejected(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                  R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  "12345678", "duplicate tensor name 'w'");
  expect_rejected(R"({"__metadata__":{},"__metadata__":{}})", "", "duplicate __metadata__");
}

TEST_F(SafetensorsTest, RejectsEmptyName) {
  expect_rejected(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "1234",
                  "empty tensor name");
}

TEST_F(SafetensorsTest, RejectsMalformedMetadata) {
  const std::string phrase = "__metadata__ must be an object mapping strings to strings";
  expect_rejected(R"({"__metadata__":"pt"})", "", phrase);
  expect_rejected(R"({"__metadata__":["a","b"]})", "", phrase);
  expect_rejected(R"({"__metadata__":{"format":"pt","epoch":3}})", "",
                  phrase + " (value of key 'epoch' is not a string)");
  expect_rejected(R"({"__metadata__":{"nested":{"a":"b"}}})", "", phrase);
  expect_rejected(R"({"__metadata__":{"k":null}})", "", phrase);
  expect_rejected(R"({"__metadata__":{"k":"a","k":"b"}})", "", "__metadata__: duplicate key 'k'");
}

TEST_F(SafetensorsTest, RejectsTensorNamedMetadata) {
  expect_rejected(R"({"__metadata__":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "1234",
                  "__metadata__ must be an object mapping strings to strings");
}

TEST_F(SafetensorsTest, RejectsDeepNestingWithoutRecursion) {
  const std::string deep = "{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_rejected(deep, "", "tensor 'w': entry is not a JSON object");
  expect_rejected(std::string(1000000, '['), "", "not a JSON object");
}

TEST_F(SafetensorsTest, ErrorMessagesStayOnOneLineForHostileNames) {
  expect_rejected(
      "{\"line1\\nline2\\u0000'\":{\"dtype\":\"X\",\"shape\":[1],\"data_offsets\":[0,4]}}", "1234",
      "tensor \"line1\\x0aline2\\x00'\": unknown dtype 'X'");
  const std::string long_name(10000, 'n');
  expect_rejected("{\"" + long_name + "\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,4]}}",
                  "1234", "...': unknown dtype");
}

// ---------------------------------------------------------------------------------------------
// Writer failures

TEST_F(SafetensorsTest, WriterRejectsDuplicateNames) {
  const float x = 1;
  const std::string p = path("dup.safetensors");
  expect_error(
      [&] {
        write_safetensors(p, {{"w", DType::f32, {}, &x}, {"w", DType::f32, {}, &x}});
      },
      p, "duplicate tensor name 'w'");
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(SafetensorsTest, WriterRejectsEmptyAndReservedNames) {
  const float x = 1;
  const std::string p = path("bad.safetensors");
  expect_error([&] { write_safetensors(p, {{"", DType::f32, {}, &x}}); }, p, "empty name");
  expect_error(
      [&] {
        write_safetensors(p, {{"__metadata__", DType::f32, {}, &x}});
      },
      p, "reserved");
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(SafetensorsTest, WriterRejectsBadShapesDataAndUtf8) {
  const float x = 1;
  const std::string p = path("bad.safetensors");
  expect_error(
      [&] {
        write_safetensors(p, {{"w", DType::f32, {2, -1}, &x}});
      },
      p, "tensor 'w': negative dimension in shape [2, -1]");
  expect_error(
      [&] {
        write_safetensors(p, {{"w", DType::f32, {1}, nullptr}});
      },
      p, "tensor 'w': null data");
  expect_error(
      [&] {
        write_safetensors(p, {{"w", DType::f64, {int64_t{1} << 62, 4}, &x}});
      },
      p, "is too large");
  expect_error(
      [&] {
        write_safetensors(p, {{"bad\xff", DType::f32, {}, &x}});
      },
      p, "is not valid UTF-8");
  expect_error([&] { write_safetensors(p, {}, {{"k", "\xc3"}}); }, p, "is not valid UTF-8");
  EXPECT_FALSE(fs::exists(p));
}

TEST_F(SafetensorsTest, WriterReportsMissingDirectory) {
  const float x = 1;
  const std::string p = path("no/such/dir/out.safetensors");
  expect_error(
      [&] {
        write_safetensors(p, {{"w", DType::f32, {}, &x}});
      },
      p, "No such file or directory");
}

TEST_F(SafetensorsTest, WriterFailureRemovesTemporaryFile) {
  // The target is a non-empty directory, so the final rename fails after the data was written.
  const float x = 1;
  const std::string p = path("target");
  fs::create_directories(fs::path(p) / "child");
  expect_error([&] { write_safetensors(p, {{"w", DType::f32, {}, &x}}); }, p, "cannot rename");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"target"});
}

TEST_F(SafetensorsTest, BytesRejectsForeignEntry) {
  const float x = 1;
  const std::string p = path("one.safetensors");
  write_safetensors(p, {{"w", DType::f32, {}, &x}});
  const SafetensorsFile file = SafetensorsFile::read(p);
  const SafetensorsEntry foreign{"other", DType::f32, {4}, 0, 16};
  expect_error([&] { file.bytes(foreign); }, p, "out of range");
}

}  // namespace
// Atomic writes replace a regular file, and the file a symlink names (the link stays); a device
// or pipe (an --output of /dev/null or /dev/stdout) is written to and never replaced by a file;
// a directory is not replaced.
TEST(WriteFileAtomically, ReplacesFilesButWritesIntoPipesAndThroughLinks) {
  const fs::path dir = fs::temp_directory_path() / "seqforge_atomic_write_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string text = "written\n";
  const io::ByteSpan bytes{text.data(), text.size()};
  std::ofstream(dir / "target") << "old";
  fs::create_symlink(dir / "target", dir / "link");
  io::write_file_atomically((dir / "link").string(), {bytes});
  EXPECT_TRUE(fs::is_symlink(dir / "link"));
  std::ifstream target(dir / "target");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(target), {}), text);

  const std::string fifo = (dir / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string read_back;
  std::thread reader([&] {
    std::ifstream in(fifo);
    read_back.assign(std::istreambuf_iterator<char>(in), {});
  });
  io::write_file_atomically(fifo, {bytes});
  reader.join();
  EXPECT_EQ(read_back, text);
  EXPECT_EQ(fs::status(fifo).type(), fs::file_type::fifo);
  EXPECT_NE(test::error_of([&] {
              io::write_file_atomically(dir.string(), {bytes});
            }).find("cannot rename"),
            std::string::npos);
  fs::remove_all(dir);
}

// What a writer killed mid-write left (name.tmp.PID.N of a process gone) is removed; a running
// process's, and other names, stay.
TEST(WriteFileAtomically, TemporariesOfKilledWritersAreRemoved) {
  const fs::path dir = fs::temp_directory_path() / "seqforge_stale_temporaries_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ASSERT_GT(gone, 0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  const std::string dead = std::to_string(gone), alive = std::to_string(::getpid());
  for (const std::string& name :
       {"model.safetensors.tmp." + dead + ".0", "model.safetensors.tmp." + alive + ".1",
        "report.html.tmp." + dead + ".7", "notes.txt.tmp." + dead + ".0",
        std::string("model.safetensors")})
    std::ofstream(dir / name) << "x";
  EXPECT_EQ(remove_stale_temporaries(dir.string(), {"model.safetensors", "report.html"}), 2);
  EXPECT_FALSE(fs::exists(dir / ("model.safetensors.tmp." + dead + ".0")));
  EXPECT_FALSE(fs::exists(dir / ("report.html.tmp." + dead + ".7")));
  EXPECT_TRUE(fs::exists(dir / ("model.safetensors.tmp." + alive + ".1")));
  EXPECT_TRUE(fs::exists(dir / ("notes.txt.tmp." + dead + ".0")));
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  // A write of a file (predict's or merge's output outside any run directory) removes what a
  // killed writer of that file left an hour ago or more, and nothing else: a fresh one may be a
  // writer's in another PID namespace (a container sharing the directory), whose pid is not seen.
  for (const std::string& name : {"preds.csv.tmp." + dead + ".3", "preds.csv.tmp." + dead + ".4",
                                  "other.csv.tmp." + dead + ".0"})
    std::ofstream(dir / name) << "x";
  for (const std::string& name : {"preds.csv.tmp." + dead + ".3", "other.csv.tmp." + dead + ".0"})
    fs::last_write_time(dir / name, fs::file_time_type::clock::now() - std::chrono::hours(2));
  const std::string text = "a,b\n";
  write_file_atomically((dir / "preds.csv").string(), {{text.data(), text.size()}});
  EXPECT_FALSE(fs::exists(dir / ("preds.csv.tmp." + dead + ".3")));
  EXPECT_TRUE(fs::exists(dir / ("preds.csv.tmp." + dead + ".4")));
  EXPECT_TRUE(fs::exists(dir / ("other.csv.tmp." + dead + ".0")));
  EXPECT_TRUE(fs::exists(dir / ("model.safetensors.tmp." + alive + ".1")));
  fs::remove_all(dir);
}

}  // namespace seqforge::io::safetensors_test
