// Every test process writes its temporary files into a directory of its own,
// /tmp/seqforge_tests_<pid> (TMPDIR for the process and what it starts), removed when the process
// ends: tests name their files by the test, so two runs at once (a build and its sanitizer build,
// or a developer's run beside CI) would otherwise overwrite each other's files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

namespace fs = std::filesystem;

class ProcessTempDir : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* base = std::getenv("TMPDIR");
    dir_ =
        fs::path(base && *base ? base : "/tmp") / ("seqforge_tests_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    setenv("TMPDIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

 private:
  fs::path dir_;
};

::testing::Environment* const kProcessTempDir =
    ::testing::AddGlobalTestEnvironment(new ProcessTempDir);

TEST(TestProcess, TemporaryFilesGoToADirectoryOfItsOwn) {
  const std::string dir = fs::temp_directory_path().string();
  EXPECT_NE(dir.find("seqforge_tests_" + std::to_string(::getpid())), std::string::npos) << dir;
  EXPECT_TRUE(fs::is_directory(dir));
}

}  // namespace
