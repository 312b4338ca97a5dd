#include "engine/core/file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace switchyard {
namespace {

namespace fs = std::filesystem;

// `path` without a trailing '/' or '.' parts, so that its parent and name are its folder's.
fs::path Normal(const std::string& path) {
  fs::path p = fs::absolute(path).lexically_normal();
  return p.has_filename() ? p : p.parent_path();
}

// Renames `staging` over the existing directory `final_dir`, leaving the old directory at
// *old (staging's name after an exchange, or `aside` after the fallback).
Status ReplaceDirectory(const std::string& staging, const std::string& final_dir,
                        const std::string& aside, std::string* old) {
  // Swap the two directories in one step; the old one ends up under the staging name.
  if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
    *old = staging;
    return OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS) {
    return FailedPrecondition(final_dir, ": exchange failed (", std::strerror(errno), ")");
  }
  // A filesystem without RENAME_EXCHANGE: move the old one aside first.
  if (std::rename(final_dir.c_str(), aside.c_str()) != 0) {
    return FailedPrecondition(final_dir, ": rename failed (", std::strerror(errno), ")");
  }
  if (std::rename(staging.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    std::rename(aside.c_str(), final_dir.c_str());
    return FailedPrecondition(final_dir, ": rename failed (", std::strerror(err), ")");
  }
  *old = aside;
  return OkStatus();
}

// "x: is a FIFO (named pipe), not a regular file"; a directory: "x: is a directory, not a file".
Status NotRegular(const std::string& path, mode_t mode) {
  if (S_ISDIR(mode)) return InvalidArgument(path, ": is a directory, not a file");
  const char* kind = S_ISFIFO(mode)   ? "a FIFO (named pipe)"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "something else";
  return NotFound(path, ": is ", kind, ", not a regular file");
}

}  // namespace

StatusOr<int> OpenRegularFile(const std::string& path) {
  struct stat st;
  // stat first: opening a socket fails (ENXIO) with a reason that does not say why.
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) return NotRegular(path, st.st_mode);
  // O_NONBLOCK: a FIFO put in place after the stat opens at once instead of waiting for a
  // writer; fstat then refuses it. Reads of a regular file ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return NotFound(path, ": cannot open (", std::strerror(errno), ")");
  const bool stat_ok = ::fstat(fd, &st) == 0;
  const int err = errno;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    ::close(fd);
    if (!stat_ok) return NotFound(path, ": cannot stat (", std::strerror(err), ")");
    return NotRegular(path, st.st_mode);
  }
  return fd;
}

StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) {
  SY_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));
  struct stat st;
  const uint64_t size = ::fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  if (size > max_bytes) {
    ::close(fd);
    return absl::OutOfRangeError(StrCat(path, ": ", size, " bytes"));
  }
  std::string out;
  out.reserve(static_cast<size_t>(size));
  SY_RETURN_IF_ERROR(ReadBlocks(fd, path, 1 << 16, [&](const char* data, size_t n) {
    out.append(data, n);
    if (out.size() <= max_bytes) return OkStatus();
    return absl::OutOfRangeError(StrCat(path, ": more than ", max_bytes, " bytes"));  // it grew
  }));
  return out;
}

Status ReadBlocks(int fd, const std::string& path, size_t block,
                  const std::function<Status(const char* data, size_t n)>& use) {
  std::vector<char> buffer(block);
  Status status = OkStatus();
  while (status.ok()) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      status = DataLoss(path, ": read failed (", std::strerror(errno), ")");
    } else if (got == 0) {
      break;
    } else {
      status = use(buffer.data(), static_cast<size_t>(got));
    }
  }
  ::close(fd);
  return status;
}

StatusOr<std::string> ReadFile(const std::string& path) {
  return ReadFile(path, std::numeric_limits<uint64_t>::max());
}

bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec_a, ec_b;
  const fs::path pa = fs::weakly_canonical(a, ec_a), pb = fs::weakly_canonical(b, ec_b);
  if (!ec_a && !ec_b && pa == pb) return true;
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

int WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t done = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) return errno;
    p += done;
    n -= static_cast<size_t>(done);
  }
  return 0;
}

Status WriteFileThroughTemporary(const std::string& path, const std::function<int(int fd)>& write) {
  const std::string tmp = StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  // Errors name `path`, the file the caller asked for, not the temporary one.
  if (fd < 0) return FailedPrecondition(path, ": cannot create (", std::strerror(errno), ")");
  if (const int err = write(fd); err != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return FailedPrecondition(path, ": write failed (", std::strerror(err), ")");
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return FailedPrecondition(path, ": fsync/close failed (", std::strerror(err), ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return FailedPrecondition(path, ": rename failed (", std::strerror(err), ")");
  }
  return OkStatus();
}

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  return WriteFileThroughTemporary(
      path, [&](int fd) { return WriteAll(fd, bytes.data(), bytes.size()); });
}

Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return FailedPrecondition(dir, ": cannot open (", std::strerror(errno), ")");
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return FailedPrecondition(dir, ": fsync failed (", std::strerror(err), ")");
  return OkStatus();
}

Status PublishDirectory(const std::string& staging, const std::string& final_dir) {
  SY_RETURN_IF_ERROR(FsyncDir(staging));
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(final_dir, ec);
  std::string old;  // the replaced directory, once staging is in place
  if (!fs::exists(st)) {
    if (std::rename(staging.c_str(), final_dir.c_str()) != 0) {
      return FailedPrecondition(final_dir, ": rename failed (", std::strerror(errno), ")");
    }
  } else if (!fs::is_directory(st)) {
    return FailedPrecondition(final_dir, ": exists and is not a directory; not replacing it");
  } else {
    const fs::path normal = Normal(final_dir);
    const std::string aside =
        (normal.parent_path() / StrCat(".", normal.filename().string(), ".old-", ::getpid()))
            .string();
    SY_RETURN_IF_ERROR(ReplaceDirectory(staging, final_dir, aside, &old));
  }
  const Status synced = FsyncDir(Normal(final_dir).parent_path().string());
  if (!old.empty()) fs::remove_all(old, ec);
  return synced;
}

namespace {

// The pid holding a flock on inode `ino` by /proc/locks ("1: FLOCK  ADVISORY  WRITE 123
// 08:01:4567 0 EOF"), or -1 (not found, or not Linux).
long FlockHolder(ino_t ino) {
  std::ifstream locks("/proc/locks");
  for (std::string line; std::getline(locks, line);) {
    std::istringstream in(line);
    std::string id, type, mode, access, device;
    long pid = -1;
    if (!(in >> id >> type >> mode >> access >> pid >> device) || type != "FLOCK") continue;
    const size_t colon = device.rfind(':');
    if (colon == std::string::npos) continue;
    if (std::strtoull(device.c_str() + colon + 1, nullptr, 10) == static_cast<uint64_t>(ino)) {
      return pid;
    }
  }
  return -1;
}

}  // namespace

StatusOr<DirectoryLock> DirectoryLock::Acquire(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return FailedPrecondition(dir, ": cannot open the output directory to lock it (",
                              std::strerror(errno), ")");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return DirectoryLock(fd);
  const int err = errno;
  struct stat st {};
  const long holder = err == EWOULDBLOCK && ::fstat(fd, &st) == 0 ? FlockHolder(st.st_ino) : -1;
  ::close(fd);
  if (err != EWOULDBLOCK) return DirectoryLock();  // no flock here (ENOLCK...): go on without
  const std::string who = holder > 0 ? "pid " + std::to_string(holder) : "its lock is held";
  return FailedPrecondition(dir, ": another process is writing this output directory (", who,
                            "); wait for it to end or choose another --out");
}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor lets go of the flock
}

}  // namespace switchyard
