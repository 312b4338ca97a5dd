// Files on disk: the one reader every config, index and state file goes through, the
// atomic write every JSON, shard and tensor file goes through, and the atomic, durable
// publish of a finished directory (a checkpoint's step directory, a prep output).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "engine/core/status.h"

namespace switchyard {

// Opens `path` for reading (O_CLOEXEC) when it is a regular file (a symlink to one is fine)
// and returns the descriptor, which the caller closes. A FIFO, a device or a socket is
// refused before any read: a reader would block forever (a FIFO without a writer) or never
// see the end (/dev/zero). NotFound naming the path and the system's reason when it cannot
// be opened, InvalidArgument "is a directory, not a file", NotFound "is a FIFO (named pipe),
// not a regular file" (a character or block device, a socket likewise).
StatusOr<int> OpenRegularFile(const std::string& path);

// Reads the open descriptor `fd` of `path` to its end in blocks of `block` bytes, handing
// each to `use`; closes fd. DataLoss naming path when a read fails; use's error stops it.
Status ReadBlocks(int fd, const std::string& path, size_t block,
                  const std::function<Status(const char* data, size_t n)>& use);

// The bytes of the regular file `path` (OpenRegularFile's errors), DataLoss when the read
// fails part way.
StatusOr<std::string> ReadFile(const std::string& path);

// The same, for a file that must hold at most `max_bytes`: OutOfRange naming the path and
// its size when it holds more, read no further than that (the caller names its limit).
StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes);

// Whether `a` and `b` name one file: the same path once symlinks, "." and ".." are resolved
// (neither needs to exist), or, both existing, the same device and inode (a hard link).
bool SameFile(const std::string& a, const std::string& b);

// Writes all `n` bytes of `data` to `fd`, retrying short writes and EINTR; 0, or the errno of
// the failure.
int WriteAll(int fd, const void* data, size_t n);

// Writes `path` through "<path>.tmp.<pid>": `write(fd)` fills the temporary file (returning
// 0, or an errno on failure), then fsync, close and rename over `path`. FailedPrecondition
// naming `path` (not the temporary file) and the system's reason on any failure
// ("out/o.st: cannot create (No such file or directory)"), with the temporary file removed
// and `path` untouched.
Status WriteFileThroughTemporary(const std::string& path, const std::function<int(int fd)>& write);

// Writes `bytes` to `path` atomically (WriteFileThroughTemporary).
Status WriteFileAtomically(const std::string& path, const std::string& bytes);

// fsyncs the directory `dir`, so that the renames and creations inside it are durable.
// FailedPrecondition naming the directory when it cannot be opened or the fsync fails.
Status FsyncDir(const std::string& dir);

// Moves the finished directory `staging` to `final_dir` atomically and durably: fsyncs
// `staging`, then renames it to `final_dir` (which must not exist) or swaps the two in one
// step when `final_dir` is a directory (RENAME_EXCHANGE; on a filesystem without it, the old
// directory is first moved aside to "<parent>/.<name>.old-<pid>"), fsyncs the parent and
// removes the old directory. `staging` must be in the same filesystem as `final_dir`
// (normally beside it). FailedPrecondition naming the path and the system's reason on any
// failure (an fsync included); until the rename, `final_dir` is left as it was.
Status PublishDirectory(const std::string& staging, const std::string& final_dir);

// An exclusive hold on a directory for one process: flock(2) on the directory itself, so
// nothing is written into it. The kernel lets go when the process ends, however it ends, so a
// lock is never stale. Two processes writing one output directory (two trainings given the
// same --out, or ranks that a launcher started without MPI, each rank 0 of its own world)
// would mix their checkpoints; the second gets an error instead.
class DirectoryLock {
 public:
  // Takes the lock of the existing directory `dir`. FailedPrecondition when another process
  // holds it, naming the directory and the holder's pid (from /proc/locks, when it shows
  // it); on a filesystem without flock the directory is left unlocked (OK, `locked()` false).
  static StatusOr<DirectoryLock> Acquire(const std::string& dir);

  DirectoryLock() = default;
  DirectoryLock(DirectoryLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock();

  bool locked() const { return fd_ >= 0; }

 private:
  explicit DirectoryLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace switchyard
