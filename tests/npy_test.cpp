#include "seqforge/io/npy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "seqforge/core/dtype.hpp"
#include "seqforge/core/error.hpp"

namespace seqforge::io::npy_test {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<int64_t>;

const std::string kScript = SEQFORGE_SOURCE_DIR "/tests/python/make_npy_samples.py";

// Element i of the samples, as tests/python/make_npy_samples.py computes it.
double sample_value(DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32:
      return static_cast<float>(static_cast<double>(i) * 0.25 - 1.5);
    case DType::f64:
      return static_cast<double>(i) / 3.0 - 2.0;
    case DType::i32:
      return static_cast<double>(i * 7 - 20);
    case DType::i64:
      return static_cast<double>(i * 3'000'000'000 - 5);
    default:
      return 0;
  }
}

// The sample values as raw bytes of `dtype`.
std::vector<std::byte> sample_bytes(DType dtype, int64_t n) {
  std::vector<std::byte> out(static_cast<size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    std::byte* p = out.data() + i * dtype_size(dtype);
    if (dtype == DType::f32) {
      const float v = static_cast<float>(sample_value(dtype, i));
      std::memcpy(p, &v, 4);
    } else if (dtype == DType::f64) {
      const double v = sample_value(dtype, i);
      std::memcpy(p, &v, 8);
    } else if (dtype == DType::i32) {
      const int32_t v = static_cast<int32_t>(i * 7 - 20);
      std::memcpy(p, &v, 4);
    } else {
      const int64_t v = i * 3'000'000'000 - 5;
      std::memcpy(p, &v, 8);
    }
  }
  return out;
}

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct SampleShape {
  const char* name;
  Shape shape;
};
const std::vector<SampleShape> kShapes = {
    {"scalar", {}}, {"5", {5}}, {"3x4", {3, 4}}, {"2x3x4", {2, 3, 4}}, {"0x3", {0, 3}}};
struct SampleDtype {
  const char* code;
  DType dtype;
};
const std::vector<SampleDtype> kDtypes = {
    {"f4", DType::f32}, {"f8", DType::f64}, {"i4", DType::i32}, {"i8", DType::i64}};

// A .npy file from a header text, data bytes and format version; the header length is computed
// unless `header_len` overrides it.
std::string npy_bytes(std::string_view header, std::string_view data, int major = 1,
                      int64_t header_len = -1) {
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const uint64_t len = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  return out + std::string(header) + std::string(data);
}

class NpyTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    if (samples_ == nullptr) return;
    std::error_code ec;
    fs::remove_all(*samples_, ec);
    delete samples_;
    samples_ = nullptr;
  }

  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("seqforge_npy_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // numpy writes the samples on first use, once per test process.
  static std::string sample(const std::string& name) {
    if (samples_ == nullptr) {
      samples_ = new fs::path(fs::temp_directory_path() /
                              ("seqforge_npy_samples_" + std::to_string(::getpid())));
      fs::remove_all(*samples_);
      const std::string cmd = "/usr/bin/python3 " + kScript + " " + samples_->string();
      samples_status_ = std::system(cmd.c_str());
    }
    EXPECT_EQ(samples_status_, 0) << "numpy could not write the samples: /usr/bin/python3 "
                                  << kScript << " (needs Debian's python3-numpy)";
    return (*samples_ / name).string();
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_raw(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good());
    return p;
  }

  static std::string read_raw(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  // Asserts that `f` throws seqforge::Error whose one-line message names `where` and `phrase`.
  template <typename F>
  static void expect_error(F&& f, const std::string& where, const std::string& phrase) {
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

  // Expects both read_npy on a file of `bytes` and parse_npy of them to fail with `phrase`.
  void expect_rejected(const std::string& bytes, const std::string& phrase) const {
    const std::string p = write_raw("bad.npy", bytes);
    expect_error([&] { read_npy(p); }, p + ": ", phrase);
    expect_error([&] { parse_npy(bytes, "memory"); }, "memory: ", phrase);
  }

  // A header with the given parts, and data matching `shape` when `data` is not given.
  void expect_header_rejected(const std::string& header, const std::string& phrase,
                              const std::string& data = "") const {
    SCOPED_TRACE(header);
    expect_rejected(npy_bytes(header, data), phrase);
  }

  static fs::path* samples_;
  static int samples_status_;
  fs::path dir_;
};
fs::path* NpyTest::samples_ = nullptr;
int NpyTest::samples_status_ = -1;

// ---------------------------------------------------------------------------------------------
// numpy as the oracle

TEST_F(NpyTest, ReadsEveryDtypeShapeAndVersionNumpyWrites) {
  int files = 0;
  for (const SampleDtype& d : kDtypes) {
    for (int version = 1; version <= 3; ++version) {
      for (const SampleShape& s : kShapes) {
        const std::string name =
            std::string(d.code) + "_v" + std::to_string(version) + "_" + s.name + ".npy";
        SCOPED_TRACE(name);
        const NpyArray a = read_npy(sample(name));
        EXPECT_EQ(a.dtype, d.dtype);
        EXPECT_EQ(a.shape, s.shape);
        EXPECT_EQ(a.data, sample_bytes(d.dtype, numel(s.shape)));
        ++files;
      }
    }
  }
  EXPECT_EQ(files, 60);
}

TEST_F(NpyTest, ReadsNpSaveOutputAsTypedValues) {
  const NpyArray a = read_npy(sample("np_save_f8_3x4.npy"));
  ASSERT_EQ(a.dtype, DType::f64);
  ASSERT_EQ(a.shape, (Shape{3, 4}));
  ASSERT_EQ(a.data.size(), 12 * sizeof(double));
  std::vector<double> v(12);
  std::memcpy(v.data(), a.data.data(), a.data.size());
  EXPECT_EQ(v[0], -2.0);
  EXPECT_EQ(v[5], 5.0 / 3.0 - 2.0);  // row 1, column 1
  EXPECT_EQ(v[11], 11.0 / 3.0 - 2.0);

  // parse_npy on the same bytes gives the same array.
  const std::string bytes = read_raw(sample("np_save_f8_3x4.npy"));
  const NpyArray b = parse_npy(bytes, "mem");
  EXPECT_EQ(b.dtype, a.dtype);
  EXPECT_EQ(b.shape, a.shape);
  EXPECT_EQ(b.data, a.data);
}

// numpy's float16: read as half floats, each value exactly as numpy holds it.
TEST_F(NpyTest, ReadsHalfFloats) {
  const NpyArray a = read_npy(sample("half_5.npy"));
  ASSERT_EQ(a.dtype, DType::f16);
  ASSERT_EQ(a.shape, (Shape{5}));
  std::vector<double> v(5);
  convert(a.data.data(), DType::f16, v.data(), DType::f64, v.size());
  EXPECT_EQ(v, (std::vector<double>{0.0, 1.5, -2.25, 65504.0, std::ldexp(1.0, -24)}));
}

TEST_F(NpyTest, RejectsUnsupportedNumpyFiles) {
  struct Case {
    const char* file;
    const char* phrase;
  };
  for (const Case& c : std::vector<Case>{
           {"unsupported_big_endian.npy",
            "descr '>f4' is big-endian, which is not supported; save arr.astype('<f4')"},
           {"unsupported_big_endian_i8.npy", "descr '>i8' is big-endian"},
           {"unsupported_b1.npy", "unsupported descr '|b1'; seqforge reads '<f2', '<f4', '<f8'"},
           {"unsupported_c8.npy", "unsupported descr '<c8'"},
           {"unsupported_u2.npy", "unsupported descr '<u2'"},
           {"unsupported_structured.npy", "structured arrays"},
       }) {
    SCOPED_TRACE(c.file);
    const std::string p = sample(c.file);
    expect_error([&] { read_npy(p); }, p + ": ", c.phrase);
  }
}

// A Fortran-order file (np.save of a transposed view or of a pandas frame's .values) reads as
// the C-order array numpy loads from it, through every reader.
TEST_F(NpyTest, ReadsFortranOrderAsTheArrayNumpyLoads) {
  for (const std::string name : {"fortran_f4_3x4", "fortran_i8_2x3x4"}) {
    SCOPED_TRACE(name);
    const NpyArray want = read_npy(sample(name + "_c.npy"));
    const std::string p = sample(name + ".npy");
    ASSERT_NE(read_raw(p).find("'fortran_order': True"), std::string::npos);
    const NpyArray read = read_npy(p), parsed = parse_npy(read_raw(p), "mem");
    const MappedNpy mapped = map_npy(p);
    EXPECT_EQ(read.shape, want.shape);
    EXPECT_EQ(read.data, want.data);
    EXPECT_EQ(parsed.shape, want.shape);
    EXPECT_EQ(parsed.data, want.data);
    ASSERT_EQ(mapped.shape, want.shape);
    EXPECT_EQ(std::vector<std::byte>(mapped.data, mapped.data + want.data.size()), want.data);
  }
}

TEST_F(NpyTest, NumpyLoadsWhatSeqforgeWrites) {
  const std::string out = path("written");
  fs::create_directories(out);
  for (const SampleDtype& d : kDtypes) {
    for (const SampleShape& s : kShapes) {
      const std::vector<std::byte> bytes = sample_bytes(d.dtype, numel(s.shape));
      write_npy(out + "/" + d.code + "_" + s.name + ".npy", d.dtype, s.shape,
                bytes.empty() ? nullptr : bytes.data());
    }
  }
  const std::string cmd = "/usr/bin/python3 " + kScript + " --check " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

// ---------------------------------------------------------------------------------------------
// Writer

TEST_F(NpyTest, RoundTripEveryDtypeAndShape) {
  for (const SampleDtype& d : kDtypes) {
    for (const SampleShape& s : kShapes) {
      SCOPED_TRACE(std::string(d.code) + " " + s.name);
      const std::vector<std::byte> bytes = sample_bytes(d.dtype, numel(s.shape));
      const std::string p = path("a.npy");
      write_npy(p, d.dtype, s.shape, bytes.data());
      const std::string raw = read_raw(p);
      ASSERT_GE(raw.size(), 10u);
      EXPECT_EQ(raw.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
      const size_t header_len = static_cast<unsigned char>(raw[8]) |
                                static_cast<size_t>(static_cast<unsigned char>(raw[9])) << 8;
      EXPECT_EQ((10 + header_len) % 64, 0u);  // data aligned as numpy aligns it
      EXPECT_EQ(raw[10 + header_len - 1], '\n');
      EXPECT_EQ(raw.size(), 10 + header_len + bytes.size());
      const NpyArray a = read_npy(p);
      EXPECT_EQ(a.dtype, d.dtype);
      EXPECT_EQ(a.shape, s.shape);
      EXPECT_EQ(a.data, bytes);
    }
  }
  const std::string header = read_raw(path("a.npy")).substr(10, 60);
  EXPECT_EQ(header.substr(0, 55), "{'descr': '<i8', 'fortran_order': False, 'shape': (0, 3");
}

TEST_F(NpyTest, WriterUsesVersion2ForHugeHeaders) {
  const Shape shape(30000, 1);  // "1, " per dimension: a header beyond 65535 bytes
  const double value = 2.5;
  const std::string p = path("v2.npy");
  write_npy(p, DType::f64, shape, &value);
  const std::string raw = read_raw(p);
  EXPECT_EQ(raw.substr(0, 8), std::string("\x93NUMPY\x02\x00", 8));
  const NpyArray a = read_npy(p);
  EXPECT_EQ(a.shape, shape);
  ASSERT_EQ(a.data.size(), 8u);
  double back = 0;
  std::memcpy(&back, a.data.data(), 8);
  EXPECT_EQ(back, value);
}

TEST_F(NpyTest, OverwriteIsAtomicAndLeavesNoTemporaryFiles) {
  const std::string p = path("w.npy");
  const std::vector<float> a = {1, 2}, b = {3, 4, 5};
  write_npy(p, DType::f32, {2}, a.data());
  write_npy(p, DType::f32, {3}, b.data());
  const NpyArray back = read_npy(p);
  EXPECT_EQ(back.shape, (Shape{3}));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"w.npy"});
}

TEST_F(NpyTest, WriterRejectsBadArguments) {
  const float x = 1;
  const std::string p = path("bad.npy");
  expect_error([&] { write_npy(p, DType::bf16, {1}, &x); }, p, "cannot write dtype bf16");
  expect_error(
      [&] {
        write_npy(p, DType::f32, {2, -1}, &x);
      },
      p, "negative dimension in shape (2, -1)");
  expect_error([&] { write_npy(p, DType::f32, {3}, nullptr); }, p, "null data");
  expect_error([&] { write_npy(p, DType::f64, {int64_t{1} << 62, 4}, &x); }, p, "too large");
  expect_error([&] { write_npy("", DType::f32, {}, &x); }, "write_npy", "empty output path");
  EXPECT_FALSE(fs::exists(p));
  write_npy(p, DType::f32, {0, 7}, nullptr);  // no elements: no data needed
  EXPECT_EQ(read_npy(p).shape, (Shape{0, 7}));
}

TEST_F(NpyTest, WriterReportsMissingDirectoryAndCleansUp) {
  const float x = 1;
  const std::string missing = path("no/such/dir/out.npy");
  expect_error([&] { write_npy(missing, DType::f32, {}, &x); }, missing,
               "No such file or directory");
  // The target is a non-empty directory: the rename fails after the data was written.
  const std::string target = path("target");
  fs::create_directories(fs::path(target) / "child");
  expect_error([&] { write_npy(target, DType::f32, {}, &x); }, target, "cannot rename");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"target"});
}

// ---------------------------------------------------------------------------------------------
// Header dialects numpy (or Python's literal syntax) allows

TEST_F(NpyTest, AcceptsAnyKeyOrderQuotesSpacingAndTrailingCommas) {
  const std::string four(16, 'x');  // 4 float32
  for (const std::string& header : {
           std::string("{'shape': (2, 2), 'fortran_order': False, 'descr': '<f4'}"),
           std::string("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 2)}"),
           std::string("{'descr':'<f4','fortran_order':False,'shape':(2,2,),}   \n"),
           std::string(
               "  {\n 'descr' : '=f4' ,\n\t'fortran_order' : False ,\n 'shape' : ( 2 , 2 ) }"),
           std::string("{'descr': 'f4', 'fortran_order': False, 'shape': (2L, 2L), }\n"),
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (+2, 2), }\n"),
           std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 1, 1), }\n"),
       }) {
    SCOPED_TRACE(header);
    const NpyArray a = parse_npy(npy_bytes(header, four), "dialect");
    EXPECT_EQ(a.dtype, DType::f32);
    EXPECT_EQ(a.shape.size() >= 2 ? Shape(a.shape.begin(), a.shape.begin() + 2) : a.shape,
              (Shape{2, 2}));
    EXPECT_EQ(a.data.size(), 16u);
  }
  EXPECT_EQ(
      parse_npy(npy_bytes("{'descr':'<i8','fortran_order':False,'shape':()}", "12345678"), "scalar")
          .shape,
      Shape{});
  EXPECT_EQ(
      parse_npy(npy_bytes("{'descr':'<i8','fortran_order':False,'shape':(-0,)}", ""), "z").shape,
      Shape{0});
}

TEST_F(NpyTest, AcceptsVersions2And3AndFortranFlagWhenLayoutIsTheSame) {
  const std::string header = "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }\n";
  EXPECT_EQ(parse_npy(npy_bytes(header, "abcdefgh", 2), "v2").shape, Shape{2});
  EXPECT_EQ(parse_npy(npy_bytes(header, "abcdefgh", 3), "v3").shape, Shape{2});
  // With at most one dimension above 1, Fortran order and C order are the same bytes.
  struct Case {
    std::string shape, data;
  };
  for (const Case& c : std::vector<Case>{
           {"(2,)", "abcdefgh"}, {"(1, 2, 1)", "abcdefgh"}, {"()", "abcd"}, {"(0, 5)", ""}}) {
    SCOPED_TRACE(c.shape);
    const NpyArray a = parse_npy(
        npy_bytes("{'descr': '<i4', 'fortran_order': True, 'shape': " + c.shape + "}", c.data),
        "f");
    EXPECT_EQ(a.data.size(), c.data.size());
  }
}

// ---------------------------------------------------------------------------------------------
// Hostile input: every case throws seqforge::Error naming the file and the problem.

constexpr const char* kHeader = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";

TEST_F(NpyTest, RejectsMissingFileAndDirectory) {
  const std::string p = path("missing.npy");
  expect_error([&] { read_npy(p); }, p, "cannot open");
  const std::string d = path("sub");
  fs::create_directory(d);
  expect_error([&] { read_npy(d); }, d, "cannot read");
}

TEST_F(NpyTest, RejectsBadMagic) {
  expect_rejected("", "file too short (0 bytes)");
  expect_rejected("\x93NUM", "file too short (4 bytes)");
  expect_rejected("\x93NUMPX\x01\x00", "not a .npy file");
  expect_rejected("PK\x03\x04 an npz archive", "not a .npy file");
  expect_rejected("a,b\n1,2\n", "not a .npy file (it does not start with \\x93NUMPY)");
}

TEST_F(NpyTest, RejectsUnsupportedVersions) {
  std::string bytes = npy_bytes(kHeader, "12345678");
  bytes[6] = 4;
  expect_rejected(bytes, "unsupported .npy format version 4.0");
  bytes[6] = 1;
  bytes[7] = 1;
  expect_rejected(bytes, "unsupported .npy format version 1.1");
  bytes[6] = 0;
  bytes[7] = 0;
  expect_rejected(bytes, "unsupported .npy format version 0.0");
}

TEST_F(NpyTest, RejectsTruncatedHeader) {
  expect_rejected(std::string("\x93NUMPY\x01\x00\x10", 9), "truncated header: file too short");
  expect_rejected(std::string("\x93NUMPY\x02\x00\x10\x00\x00", 11), "truncated header");
  expect_rejected(npy_bytes(kHeader, "", 1, 1000),
                  "truncated header: header length 1000 exceeds the 57 bytes after the preamble");
  expect_rejected(npy_bytes(kHeader, "", 2, 0xffffffff), "truncated header: header length");
  expect_rejected(npy_bytes(std::string(kHeader).substr(0, 30), ""), "not a valid Python dict");
}

TEST_F(NpyTest, RejectsHeaderThatIsNotADict) {
  expect_header_rejected("", "header is not a Python dict literal (it starts with nothing)");
  expect_header_rejected("['descr', '<f4']", "header is not a Python dict literal");
  expect_header_rejected("descr: <f4", "header is not a Python dict literal");
  expect_header_rejected("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)",
                         "not a valid Python dict literal: expected ',' or '}'");
  expect_header_rejected("{'descr' '<f4'}", "expected ':' after key 'descr'");
  expect_header_rejected("{'descr': '<f4}", "unterminated string");
  expect_header_rejected("{descr: '<f4'}", "dict keys must be strings");
  expect_header_rejected("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x",
                         "unexpected text after the dict");
  expect_header_rejected("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)};",
                         "unexpected text after the dict");
  expect_header_rejected("{'descr': <f4}", "unexpected '<'");
  expect_header_rejected("{'descr': -}", "expected a number after the sign");
  expect_header_rejected(std::string("{'descr': '<f4'\0, 'fortran_order': False}", 41),
                         "expected ',' or '}' at byte 16 of the header");
}

TEST_F(NpyTest, RejectsMissingUnexpectedAndDuplicateKeys) {
  expect_header_rejected("{'fortran_order': False, 'shape': (2,)}", "header has no 'descr' key");
  expect_header_rejected("{'descr': '<f4', 'shape': (2,)}", "header has no 'fortran_order' key");
  expect_header_rejected("{'descr': '<f4', 'fortran_order': False}", "header has no 'shape' key");
  expect_header_rejected("{}", "header has no 'descr' key");
  expect_header_rejected("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'strides': (4,)}",
                         "header has an unexpected key 'strides'", "12345678");
  expect_header_rejected("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': ()}",
                         "header has a duplicate key 'descr'");
}

TEST_F(NpyTest, RejectsBadDescr) {
  const std::string rest = ", 'fortran_order': False, 'shape': (2,)}";
  expect_header_rejected("{'descr': 4" + rest, "header 'descr' must be a string");
  expect_header_rejected("{'descr': None" + rest, "header 'descr' must be a string");
  expect_header_rejected("{'descr': [('a', '<f4')]" + rest, "structured arrays");
  expect_header_rejected("{'descr': '>f8'" + rest,
                         "descr '>f8' is big-endian, which is not supported; save "
                         "arr.astype('<f8')");
  expect_header_rejected("{'descr': '>f2'" + rest,
                         "descr '>f2' is big-endian, which is not supported; save "
                         "arr.astype('<f2')");
  expect_header_rejected("{'descr': '>u2'" + rest, "descr '>u2' is big-endian and not supported");
  for (const char* d :
       {"|b1", "<c8", "<u4", "|f4", "<i2", "<f16", "float32", "", "<", "<M8[ns]", "|O"}) {
    expect_header_rejected("{'descr': '" + std::string(d) + "'" + rest,
                           "unsupported descr '" + std::string(d) + "'");
  }
}

TEST_F(NpyTest, ReadsFortranOrderAndRejectsABadFlag) {
  // A (2, 3) array of i4 elements a..f (each its letter 4 times), stored column by column.
  std::string data;
  for (char c : std::string("adbecf")) data += std::string(4, c);
  const NpyArray a =
      parse_npy(npy_bytes("{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3)}", data), "f");
  ASSERT_EQ(a.shape, (Shape{2, 3}));
  std::string c_order;
  for (std::byte b : a.data) c_order += static_cast<char>(b);
  std::string want;
  for (char c : std::string("abcdef")) want += std::string(4, c);
  EXPECT_EQ(c_order, want);
  expect_header_rejected("{'descr': '<f4', 'fortran_order': 'False', 'shape': (2,)}",
                         "header 'fortran_order' must be True or False");
  expect_header_rejected("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}",
                         "header 'fortran_order' must be True or False");
}

TEST_F(NpyTest, RejectsBadShapes) {
  const std::string pre = "{'descr': '<f4', 'fortran_order': False, 'shape': ";
  const std::string tuple = "header 'shape' must be a tuple of non-negative integers";
  expect_header_rejected(pre + "[2]}", tuple);
  expect_header_rejected(pre + "2}", tuple);
  expect_header_rejected(pre + "(2)}", tuple);  // Python: a parenthesized int, not a tuple
  expect_header_rejected(pre + "None}", tuple);
  expect_header_rejected(pre + "(2.0,)}", tuple + ", got '2.0'");
  expect_header_rejected(pre + "('2',)}", tuple);
  expect_header_rejected(pre + "(True,)}", tuple);
  expect_header_rejected(pre + "((2,),)}", tuple);
  expect_header_rejected(pre + "(-1,)}", "header 'shape' '(-1,)' has a negative dimension");
  expect_header_rejected(pre + "(3, -2)}", "header 'shape' '(3, -2)' has a negative dimension");
  expect_header_rejected(pre + "(99999999999999999999,)}",
                         "header 'shape' dimension '99999999999999999999' is too large");
  expect_header_rejected(pre + "(4611686018427387904, 4)}",
                         "shape (4611686018427387904, 4) is too large (byte size overflows)");
  expect_header_rejected(pre + "(2,,)}", "unexpected ','");
}

TEST_F(NpyTest, RejectsDataSizeMismatch) {
  expect_rejected(npy_bytes(kHeader, "1234567"),
                  "truncated data: shape (2,) of '<f4' needs 8 bytes, the file has 7");
  expect_rejected(npy_bytes(kHeader, ""), "truncated data");
  expect_rejected(npy_bytes(kHeader, "123456789"),
                  "1 trailing bytes after the data (shape (2,) of '<f4' needs 8 bytes)");
  expect_rejected(
      npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000, 1000000)}", "x"),
      "needs 8000000000000 bytes, the file has 1");
}

TEST_F(NpyTest, RejectsDeepNestingWithoutRecursionBlowup) {
  const std::string deep = "{'descr': " + std::string(100000, '(') + "}";
  expect_header_rejected(deep, "nesting deeper than 32");
  expect_header_rejected("{'descr': " + std::string(100000, '[') + "}", "nesting deeper than 32");
}

TEST_F(NpyTest, ErrorMessagesStayOnOneLineForHostileHeaders) {
  expect_header_rejected("{'descr': 'a\\'b\x01\xff', 'fortran_order': False, 'shape': ()}",
                         "unsupported descr 'a\\x27b\\x01\\xff'");
  expect_header_rejected("{'" + std::string(5000, 'k') + "': 1}", "...'");
}

}  // namespace
}  // namespace seqforge::io::npy_test

TEST(MemoryNpy, MapsTheCallersBufferWhileRegistered) {
  const std::vector<double> values = {1, 2, 3, 4, 5, 6};
  std::string path;
  {
    seqforge::io::MappedNpy array;
    array.dtype = seqforge::DType::f64;
    array.shape = {3, 2};
    array.data = reinterpret_cast<const std::byte*>(values.data());
    const seqforge::io::MemoryNpy memory("numpy array", array);
    path = memory.path();
    EXPECT_EQ(path.substr(0, 13), "<numpy array ");
    EXPECT_TRUE(seqforge::io::MemoryNpy::is_registered(path));
    const seqforge::io::MappedNpy mapped = seqforge::io::map_npy(path);
    EXPECT_EQ(mapped.data, array.data);  // the buffer itself, not a copy
    EXPECT_EQ(mapped.shape, (std::vector<int64_t>{3, 2}));
    const seqforge::io::MemoryNpy other("numpy array", array);
    EXPECT_NE(other.path(), path);
  }
  EXPECT_FALSE(seqforge::io::MemoryNpy::is_registered(path));
  EXPECT_THROW(seqforge::io::map_npy(path), seqforge::Error);
}
