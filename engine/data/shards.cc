// The token shard format; see shards.h.
#include "engine/data/shards.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "engine/core/check.h"
#include "engine/core/file.h"

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

uint64_t Fnv1a64(const void* data, size_t size, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

namespace {

std::string HeaderBytes(uint32_t token_bytes, uint64_t count, uint64_t checksum) {
  std::string bytes(kShardMagic, sizeof(kShardMagic));
  PutLittleEndian(&bytes, kShardVersion, 4);
  PutLittleEndian(&bytes, token_bytes, 4);
  PutLittleEndian(&bytes, count, 8);
  PutLittleEndian(&bytes, checksum, 8);
  return bytes;
}

}  // namespace

StatusOr<std::unique_ptr<ShardWriter>> ShardWriter::Create(const std::string& path,
                                                           uint32_t token_bytes) {
  SY_CHECK(token_bytes == 2 || token_bytes == 4) << "token_bytes=" << token_bytes;
  std::unique_ptr<ShardWriter> writer(new ShardWriter());
  writer->path_ = path;
  writer->token_bytes_ = token_bytes;
  writer->checksum_ = kFnv1a64Start;
  writer->file_ = std::fopen(path.c_str(), "wb");
  if (writer->file_ == nullptr) {
    return FailedPrecondition(path, ": cannot create (", std::strerror(errno), ")");
  }
  const std::string zeros(kShardHeaderBytes, '\0');
  if (std::fwrite(zeros.data(), 1, zeros.size(), writer->file_) != zeros.size()) {
    return FailedPrecondition(path, ": write failed (", std::strerror(errno), ")");
  }
  return writer;
}

ShardWriter::~ShardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status ShardWriter::Append(const int32_t* tokens, size_t count) {
  buffer_.clear();
  for (size_t i = 0; i < count; ++i) {
    SY_CHECK(tokens[i] >= 0 && (token_bytes_ == 4 || tokens[i] < 65536)) << "token " << tokens[i];
    PutLittleEndian(&buffer_, static_cast<uint32_t>(tokens[i]), static_cast<int>(token_bytes_));
  }
  checksum_ = Fnv1a64(buffer_.data(), buffer_.size(), checksum_);
  count_ += count;
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    return FailedPrecondition(path_, ": write failed (", std::strerror(errno), ")");
  }
  return OkStatus();
}

Status ShardWriter::Finish() {
  const std::string header = HeaderBytes(token_bytes_, count_, checksum_);
  bool ok = std::fseek(file_, 0, SEEK_SET) == 0 &&
            std::fwrite(header.data(), 1, header.size(), file_) == header.size() &&
            std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  if (!ok) return FailedPrecondition(path_, ": write failed (", std::strerror(errno), ")");
  return OkStatus();
}

std::string EncodeShard(const std::vector<int32_t>& tokens, uint32_t token_bytes) {
  SY_CHECK(token_bytes == 2 || token_bytes == 4) << "token_bytes=" << token_bytes;
  std::string payload;
  payload.reserve(tokens.size() * token_bytes);
  for (int32_t token : tokens) {
    SY_CHECK(token >= 0 && (token_bytes == 4 || token < 65536)) << "token " << token;
    PutLittleEndian(&payload, static_cast<uint32_t>(token), static_cast<int>(token_bytes));
  }
  return HeaderBytes(token_bytes, tokens.size(), Fnv1a64(payload.data(), payload.size())) +
         payload;
}

Status WriteShard(const std::string& path, const std::vector<int32_t>& tokens,
                  uint32_t token_bytes) {
  return WriteFileAtomically(path, EncodeShard(tokens, token_bytes));
}

StatusOr<ShardHeader> ParseShardHeader(const std::string& path, const unsigned char* head,
                                       uint64_t size) {
  if (size < kShardHeaderBytes) {
    return DataLoss(path, ": not a token shard (", size, " bytes, shorter than the ",
                    kShardHeaderBytes, "-byte header)");
  }
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
  return header;
}

StatusOr<std::vector<int32_t>> ReadShard(const std::string& path, ShardHeader* header_out) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return NotFound(path, ": cannot open the token shard");
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  unsigned char head[kShardHeaderBytes] = {};
  in.read(reinterpret_cast<char*>(head), std::min<uint64_t>(size, kShardHeaderBytes));
  SY_ASSIGN_OR_RETURN(ShardHeader header, ParseShardHeader(path, head, size));
  const uint64_t payload = size - kShardHeaderBytes;
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
