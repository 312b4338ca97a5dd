// The token shard format; see shards.h.
#include "engine/train/data/shards.h"

#include <cstring>
#include <fstream>

#include "engine/core/check.h"
#include "engine/core/safetensors.h"

namespace switchyard::data {
namespace {

void PutLittleEndian(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t GetLittleEndian(const unsigned char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

}  // namespace

uint32_t TokenBytesForVocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

uint64_t Fnv1a64(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string EncodeShard(const std::vector<int32_t>& tokens, uint32_t token_bytes) {
  SY_CHECK(token_bytes == 2 || token_bytes == 4) << "token_bytes=" << token_bytes;
  std::string payload;
  payload.reserve(tokens.size() * token_bytes);
  for (int32_t token : tokens) {
    SY_CHECK(token >= 0 && (token_bytes == 4 || token < 65536)) << "token " << token;
    PutLittleEndian(&payload, static_cast<uint32_t>(token), static_cast<int>(token_bytes));
  }
  std::string bytes(kShardMagic, sizeof(kShardMagic));
  PutLittleEndian(&bytes, kShardVersion, 4);
  PutLittleEndian(&bytes, token_bytes, 4);
  PutLittleEndian(&bytes, tokens.size(), 8);
  PutLittleEndian(&bytes, Fnv1a64(payload.data(), payload.size()), 8);
  return bytes + payload;
}

Status WriteShard(const std::string& path, const std::vector<int32_t>& tokens,
                  uint32_t token_bytes) {
  return WriteFileAtomically(path, EncodeShard(tokens, token_bytes));
}

StatusOr<std::vector<int32_t>> ReadShard(const std::string& path, ShardHeader* header_out) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return NotFound(path, ": cannot open the token shard");
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (size < kShardHeaderBytes) {
    return DataLoss(path, ": not a token shard (", size, " bytes, shorter than the ",
                    kShardHeaderBytes, "-byte header)");
  }
  unsigned char head[kShardHeaderBytes];
  in.read(reinterpret_cast<char*>(head), kShardHeaderBytes);
  if (std::memcmp(head, kShardMagic, sizeof(kShardMagic)) != 0) {
    return DataLoss(path, ": not a token shard (bad magic; expected \"SYTOKENS\")");
  }
  ShardHeader header;
  header.version = static_cast<uint32_t>(GetLittleEndian(head + 8, 4));
  header.token_bytes = static_cast<uint32_t>(GetLittleEndian(head + 12, 4));
  header.count = GetLittleEndian(head + 16, 8);
  header.checksum = GetLittleEndian(head + 24, 8);
  if (header.version != kShardVersion) {
    return DataLoss(path, ": token shard version ", header.version, " (this build reads ",
                    kShardVersion, ")");
  }
  if (header.token_bytes != 2 && header.token_bytes != 4) {
    return DataLoss(path, ": bad token width ", header.token_bytes, " bytes (expected 2 or 4)");
  }
  const uint64_t payload = size - kShardHeaderBytes;
  if (header.count > payload / header.token_bytes || payload != header.count * header.token_bytes) {
    const std::string want =
        header.count > (UINT64_MAX - kShardHeaderBytes) / header.token_bytes
            ? std::string("more than 2^64")
            : std::to_string(kShardHeaderBytes + header.count * header.token_bytes);
    return DataLoss(path, ": truncated or padded: its header promises ", header.count,
                    " tokens of ", header.token_bytes, " bytes (", want,
                    " bytes in all) but the file has ", size, " bytes");
  }
  std::vector<unsigned char> bytes(payload);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(payload));
  if (!in) return DataLoss(path, ": read failed");
  if (Fnv1a64(bytes.data(), bytes.size()) != header.checksum) {
    return DataLoss(path, ": checksum mismatch (the tokens are corrupt)");
  }
  std::vector<int32_t> tokens(header.count);
  for (uint64_t i = 0; i < header.count; ++i) {
    const uint64_t value = GetLittleEndian(bytes.data() + i * header.token_bytes,
                                           static_cast<int>(header.token_bytes));
    if (value > static_cast<uint64_t>(INT32_MAX)) {
      return DataLoss(path, ": token ", i, " is ", value, ", above the int32 range");
    }
    tokens[i] = static_cast<int32_t>(value);
  }
  if (header_out != nullptr) *header_out = header;
  return tokens;
}

}  // namespace switchyard::data
