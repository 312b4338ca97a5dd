// A token shard memory-mapped for the loader: opening it reads only the 32-byte header
// (checked: magic, version, width, length); tokens are read from the mapping when a batch
// needs them, so a rank touches only the pages it consumes and a corpus larger than memory
// works. Verify() reads the whole shard once (checksum and token ids) and then drops its
// pages from the process's memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/core/status.h"
#include "engine/data/shards.h"

namespace switchyard::data {

class MappedShard {
 public:
  // Maps `path` read-only and checks its header; errors name the path.
  static StatusOr<std::unique_ptr<MappedShard>> Open(const std::string& path);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;

  // Checks the checksum and that every token is below `vocab_size`.
  Status Verify(int64_t vocab_size) const;
  // Copies tokens [first, first + n) into out as int32 (first + n <= count()).
  void Copy(uint64_t first, uint64_t n, int32_t* out) const;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return header_; }
  uint64_t count() const { return header_.count; }

 private:
  MappedShard() = default;
  std::string path_;
  ShardHeader header_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  const unsigned char* tokens_ = nullptr;
};

}  // namespace switchyard::data
