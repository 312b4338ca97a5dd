// Token shards: the binary files `switchyard prep` writes and the loader reads.
//
// A shard is a 32-byte header followed by the tokens, all little-endian:
//   bytes  0-7   magic "SYTOKENS"
//   bytes  8-11  u32 version (1)
//   bytes 12-15  u32 bytes per token: 2 (u16, vocabularies up to 65536) or 4 (u32)
//   bytes 16-23  u64 token count
//   bytes 24-31  u64 FNV-1a 64 checksum of the token bytes
//   bytes 32-    count tokens
// The file is exactly 32 + count * bytes-per-token bytes long.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/status.h"

namespace switchyard::data {

// The header's fixed fields (see the layout above).
inline constexpr char kShardMagic[8] = {'S', 'Y', 'T', 'O', 'K', 'E', 'N', 'S'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 32;

// The decoded header of a shard.
struct ShardHeader {
  uint32_t version = kShardVersion;
  uint32_t token_bytes = 2;  // 2 or 4
  uint64_t count = 0;
  uint64_t checksum = 0;
};

// Bytes per token for a vocabulary: 2 up to 65536 ids, else 4.
uint32_t TokenBytesForVocab(int64_t vocab_size);

// FNV-1a 64 over `size` bytes; `h` continues a checksum over earlier bytes.
inline constexpr uint64_t kFnv1a64Start = 0xcbf29ce484222325ull;
uint64_t Fnv1a64(const void* data, size_t size, uint64_t h = kFnv1a64Start);

// The bytes of a shard holding `tokens` (each must fit in token_bytes).
std::string EncodeShard(const std::vector<int32_t>& tokens, uint32_t token_bytes);

// Writes a shard atomically (temporary name, fsync, rename).
Status WriteShard(const std::string& path, const std::vector<int32_t>& tokens,
                  uint32_t token_bytes);

// Writes a shard piece by piece, so a shard never has to fit in memory: a placeholder
// header, the tokens as they come (checksummed on the way), then the real header. Until
// Finish succeeds the file is not a valid shard (its magic is zero), and Finish fsyncs it.
class ShardWriter {
 public:
  // Creates (or truncates) `path` for tokens of `token_bytes` (2 or 4) bytes.
  static StatusOr<std::unique_ptr<ShardWriter>> Create(const std::string& path,
                                                       uint32_t token_bytes);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends tokens (each must fit in the width).
  Status Append(const int32_t* tokens, size_t count);
  // Writes the header, fsyncs and closes the file.
  Status Finish();
  // Tokens appended so far.
  uint64_t count() const { return count_; }

 private:
  ShardWriter() = default;
  std::string path_;
  std::FILE* file_ = nullptr;
  uint32_t token_bytes_ = 2;
  uint64_t count_ = 0;
  uint64_t checksum_ = 0;
  std::string buffer_;
};

// Decodes and checks the header of a shard of `size` bytes whose first bytes are `head`
// (at least min(size, 32) of them): the magic, the version, the token width, and the
// length against the count (without overflow). Errors name `path`.
StatusOr<ShardHeader> ParseShardHeader(const std::string& path, const unsigned char* head,
                                       uint64_t size);

// Reads and checks a whole shard: the magic, the version, the token width, the length
// against the count, and the checksum. Each error names the path and what is wrong.
// `header`, when given, receives the header.
StatusOr<std::vector<int32_t>> ReadShard(const std::string& path, ShardHeader* header = nullptr);

}  // namespace switchyard::data
