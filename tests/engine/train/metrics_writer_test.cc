// JsonlWriter (engine/train/metrics.h) when the file cannot grow: under a file-size limit
// (RLIMIT_FSIZE, SIGXFSZ ignored) every record is written whole or not at all, so the file
// holds only whole lines and never passes the limit; writes that fail return false and are
// counted. On resume, the records at and after the resumed step (and a torn last line) are
// dropped. The same through `switchyard train` (a full disk): tests/cli/failures_cli_test.sh.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/train/metrics.h"

namespace switchyard::train {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> Lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

class MetricsWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_metrics_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = (dir_ / "metrics.jsonl").string();
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  std::string path_;
};

// A record of `n` bytes (without the newline) for step s.
std::string Record(int s, size_t n) {
  std::string head = "{\"step\":" + std::to_string(s) + ",\"pad\":\"";
  return head + std::string(n - head.size() - 2, 'x') + "\"}";
}

TEST_F(MetricsWriterTest, AFileSizeLimitNeverTearsARecord) {
  auto w = JsonlWriter::Open(path_, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = old;
  limited.rlim_cur = 1000;  // bytes
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::vector<bool> written;
  for (int s = 0; s < 10; ++s) written.push_back(w->Write(Record(s, 299)));  // 300 with '\n'
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  // Three whole records fit in 1000 bytes; the fourth would be cut at 100 bytes and is
  // removed again; the rest fail at once.
  EXPECT_EQ(written, (std::vector<bool>{true, true, true, false, false, false, false, false,
                                        false, false}));
  EXPECT_EQ(w->failed(), 7);
  EXPECT_EQ(fs::file_size(path_), 900u);
  const std::vector<std::string> lines = Lines(path_);
  ASSERT_EQ(lines.size(), 3u);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(lines[s], Record(s, 299));
  // Once the file can grow again, records are written again.
  EXPECT_TRUE(w->Write(Record(10, 50)));
  EXPECT_EQ(Lines(path_).back(), Record(10, 50));
}

TEST_F(MetricsWriterTest, ResumingDropsTheRecordsFromTheResumedStepOn) {
  {
    auto w = JsonlWriter::Open(path_, 0);
    ASSERT_TRUE(w.ok());
    for (int s = 0; s < 6; ++s) ASSERT_TRUE(w->Write(Record(s, 40)));
    ASSERT_TRUE(w->Write("{\"step\":5,\"val_loss\":1.5}"));
  }
  std::ofstream(path_, std::ios::app) << "{\"step\":6,\"lo";  // a torn last line
  auto w = JsonlWriter::Open(path_, 4);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->dropped(), 4);  // steps 4, 5, the validation record of 5, the torn line
  ASSERT_TRUE(w->Write(Record(4, 40)));
  const std::vector<std::string> lines = Lines(path_);
  ASSERT_EQ(lines.size(), 5u);
  for (int s = 0; s < 5; ++s) EXPECT_EQ(lines[s], Record(s, 40));
  // A new run starts an empty file.
  auto fresh = JsonlWriter::Open(path_, 0);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fs::file_size(path_), 0u);
}

}  // namespace
}  // namespace switchyard::train
