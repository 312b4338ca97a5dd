// Memory-mapped token shards; see mapped_shard.h.
#include "engine/data/mapped_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "engine/core/check.h"

namespace switchyard::data {

static_assert(std::endian::native == std::endian::little, "shards are little-endian");

StatusOr<std::unique_ptr<MappedShard>> MappedShard::Open(const std::string& path) {
  std::unique_ptr<MappedShard> shard(new MappedShard());
  shard->path_ = path;
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return NotFound(path, ": cannot open the token shard (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return DataLoss(path, ": not a regular file");
  }
  shard->size_ = static_cast<uint64_t>(st.st_size);
  if (shard->size_ > 0) {
    shard->map_ = ::mmap(nullptr, shard->size_, PROT_READ, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (shard->map_ == MAP_FAILED) {
    shard->map_ = nullptr;
    return DataLoss(path, ": cannot map the token shard (", std::strerror(errno), ")");
  }
  const auto* bytes = static_cast<const unsigned char*>(shard->map_);
  unsigned char head[kShardHeaderBytes] = {};
  if (bytes != nullptr) std::memcpy(head, bytes, std::min<uint64_t>(shard->size_, kShardHeaderBytes));
  SY_ASSIGN_OR_RETURN(shard->header_, ParseShardHeader(path, head, shard->size_));
  shard->tokens_ = bytes + kShardHeaderBytes;
  return shard;
}

MappedShard::~MappedShard() {
  if (map_ != nullptr) ::munmap(map_, size_);
}

Status MappedShard::Verify(int64_t vocab_size) const {
  const uint64_t width = header_.token_bytes;
  const uint64_t payload = header_.count * width;
  if (Fnv1a64(tokens_, payload) != header_.checksum) {
    return DataLoss(path_, ": checksum mismatch (the tokens are corrupt)");
  }
  for (uint64_t i = 0; i < header_.count; ++i) {
    uint32_t value = 0;
    std::memcpy(&value, tokens_ + i * width, width);
    if (static_cast<int64_t>(value) >= vocab_size) {
      return DataLoss(path_, ": token ", i, " is ", value, ", not below the vocabulary size ",
                      vocab_size);
    }
  }
  // The pages stay in the page cache; they leave this process's resident set.
  if (map_ != nullptr) ::madvise(map_, size_, MADV_DONTNEED);
  return OkStatus();
}

void MappedShard::Copy(uint64_t first, uint64_t n, int32_t* out) const {
  SY_CHECK_LE(first + n, header_.count);
  if (header_.token_bytes == 2) {
    for (uint64_t i = 0; i < n; ++i) {
      uint16_t value;
      std::memcpy(&value, tokens_ + (first + i) * 2, 2);
      out[i] = value;
    }
  } else {
    for (uint64_t i = 0; i < n; ++i) {
      uint32_t value;
      std::memcpy(&value, tokens_ + (first + i) * 4, 4);
      out[i] = static_cast<int32_t>(value);
    }
  }
}

}  // namespace switchyard::data
