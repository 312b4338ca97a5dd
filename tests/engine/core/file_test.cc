#include "engine/core/file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/crc32.h"
#include "engine/core/safetensors.h"

namespace switchyard {
namespace {

namespace fs = std::filesystem;

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_file_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // A directory `name` holding one file `file` with `text`.
  std::string MakeDir(const std::string& name, const std::string& file, const std::string& text) {
    fs::create_directories(dir_ / name);
    std::ofstream(dir_ / name / file) << text;
    return Path(name);
  }
  // The names in dir_, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  fs::path dir_;
};

TEST_F(FileTest, WritesAtomicallyAndReadsBack) {
  ASSERT_TRUE(WriteFileAtomically(Path("a.json"), "{\"x\": 1}\n").ok());
  ASSERT_TRUE(WriteFileAtomically(Path("a.json"), "{\"x\": 2}\n").ok());
  auto read = ReadFile(Path("a.json"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "{\"x\": 2}\n");
  EXPECT_EQ(Names(), std::vector<std::string>{"a.json"});  // no temporary left
  const Status missing = WriteFileAtomically(Path("no/such/dir/a.json"), "x");
  EXPECT_FALSE(missing.ok());
  // The file asked for, not its temporary "<path>.tmp.<pid>", with the system's reason.
  EXPECT_EQ(missing.message(), Path("no/such/dir/a.json") + ": cannot create (No such file or directory)");
}

// Every reader refuses what is not a regular file before reading: a FIFO without a writer
// would block it forever, /dev/zero would never end. One error naming the path and what it is.
TEST_F(FileTest, ReadersRefuseWhatIsNotARegularFile) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0644), 0);
  auto fifo = ReadFile(Path("fifo"));
  EXPECT_EQ(fifo.status().code(), absl::StatusCode::kNotFound) << fifo.status();
  EXPECT_EQ(fifo.status().message(), Path("fifo") + ": is a FIFO (named pipe), not a regular file");
  EXPECT_EQ(Crc32OfFile(Path("fifo")).status().message(), fifo.status().message());
  EXPECT_EQ(ReadSafetensors(Path("fifo")).status().message(), fifo.status().message());
  EXPECT_EQ(ReadFile("/dev/zero").status().message(),
            "/dev/zero: is a character device, not a regular file");
  auto dir = ReadFile(dir_.string());
  EXPECT_EQ(dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dir.status().message(), dir_.string() + ": is a directory, not a file");
  // A safetensors reader says so too, not "cannot read the header length".
  EXPECT_EQ(ReadSafetensors(dir_.string()).status().message(), dir.status().message());
  EXPECT_EQ(ReadFile(Path("missing")).status().message(),
            Path("missing") + ": cannot open (No such file or directory)");
  // Through a symlink to a regular file: read.
  ASSERT_TRUE(WriteFileAtomically(Path("a.txt"), "abc").ok());
  fs::create_symlink(Path("a.txt"), Path("link"));
  EXPECT_EQ(*ReadFile(Path("link")), "abc");
}

TEST_F(FileTest, ReadFileWithALimitStopsAtIt) {
  ASSERT_TRUE(WriteFileAtomically(Path("a.txt"), "abcdef").ok());
  EXPECT_EQ(*ReadFile(Path("a.txt"), 6), "abcdef");
  auto over = ReadFile(Path("a.txt"), 5);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kOutOfRange) << over.status();
  EXPECT_EQ(over.status().message(), Path("a.txt") + ": 6 bytes");
}

TEST_F(FileTest, SameFileSeesThroughSymlinksAndHardLinks) {
  ASSERT_TRUE(WriteFileAtomically(Path("a.txt"), "abc").ok());
  fs::create_symlink(Path("a.txt"), Path("sym"));
  fs::create_hard_link(Path("a.txt"), Path("hard"));
  EXPECT_TRUE(SameFile(Path("a.txt"), Path("sym")));
  EXPECT_TRUE(SameFile(Path("a.txt"), Path("hard")));
  EXPECT_TRUE(SameFile(Path("a.txt"), dir_.string() + "/./x/../a.txt"));
  EXPECT_TRUE(SameFile(Path("new"), Path("new")));  // neither needs to exist
  EXPECT_FALSE(SameFile(Path("a.txt"), Path("new")));
}

TEST_F(FileTest, FsyncDirReportsAMissingDirectory) {
  EXPECT_TRUE(FsyncDir(dir_.string()).ok());
  const Status s = FsyncDir(Path("missing"));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(Path("missing")), std::string::npos) << s;
}

TEST_F(FileTest, PublishesIntoANewPath) {
  const std::string staging = MakeDir(".out.tmp-1", "f.txt", "new");
  ASSERT_TRUE(PublishDirectory(staging, Path("out")).ok());
  EXPECT_EQ(*ReadFile(Path("out/f.txt")), "new");
  EXPECT_EQ(Names(), std::vector<std::string>{"out"});
}

TEST_F(FileTest, ReplacesAnExistingDirectoryWhole) {
  MakeDir("out", "old.txt", "old");
  const std::string staging = MakeDir(".out.tmp-1", "f.txt", "new");
  ASSERT_TRUE(PublishDirectory(staging, Path("out") + "/").ok());
  EXPECT_EQ(*ReadFile(Path("out/f.txt")), "new");
  EXPECT_FALSE(fs::exists(Path("out/old.txt")));
  EXPECT_EQ(Names(), std::vector<std::string>{"out"});  // neither staging nor the old one left
}

TEST_F(FileTest, AFailureLeavesTheOldDirectoryIntact) {
  MakeDir("out", "old.txt", "old");
  // The staging directory is missing: nothing moves.
  const Status missing = PublishDirectory(Path(".out.tmp-1"), Path("out"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find(".out.tmp-1"), std::string::npos) << missing;
  EXPECT_EQ(*ReadFile(Path("out/old.txt")), "old");
  // The destination is a file, not a directory: it is not replaced.
  std::ofstream(dir_ / "file") << "mine";
  const std::string staging = MakeDir(".file.tmp-1", "f.txt", "new");
  const Status file = PublishDirectory(staging, Path("file"));
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.message().find("not a directory"), std::string::npos) << file;
  EXPECT_EQ(*ReadFile(Path("file")), "mine");
  EXPECT_EQ(*ReadFile(staging + "/f.txt"), "new");
  EXPECT_EQ(Names(), (std::vector<std::string>{".file.tmp-1", "file", "out"}));
}

// One holder at a time: a second Acquire (another open file description, as another process
// has) is refused naming the holder; the lock goes with its holder, moved or destroyed.
TEST_F(FileTest, DirectoryLockHasOneHolder) {
  const std::string dir = dir_.string();
  StatusOr<DirectoryLock> first = DirectoryLock::Acquire(dir);
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE(first->locked());
  const StatusOr<DirectoryLock> second = DirectoryLock::Acquire(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find(dir + ": another process is writing this output "
                                           "directory (pid " + std::to_string(::getpid()) + ")"),
            std::string::npos)
      << second.status().message();
  DirectoryLock moved = std::move(*first);
  EXPECT_FALSE(first->locked());
  EXPECT_FALSE(DirectoryLock::Acquire(dir).ok());  // the moved-to object holds it
  moved = DirectoryLock();                          // let go
  StatusOr<DirectoryLock> third = DirectoryLock::Acquire(dir);
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_TRUE(third->locked());
  EXPECT_TRUE(Names().empty());  // nothing written into the directory
}

}  // namespace
}  // namespace switchyard
