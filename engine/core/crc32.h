// CRC-32 (the IEEE 802.3 / zlib / PNG polynomial 0xEDB88320, reflected): the checksum a
// checkpoint's index stores for each of its files (docs/checkpoints.md). Incremental:
//
//   uint32_t crc = 0;
//   crc = Crc32(crc, part1, n1);
//   crc = Crc32(crc, part2, n2);   // == Crc32(0, part1 + part2, n1 + n2)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/core/status.h"

namespace switchyard {

// The CRC-32 of `crc`'s bytes followed by data[0, n); Crc32(0, "123456789", 9) is 0xCBF43926.
uint32_t Crc32(uint32_t crc, const void* data, size_t n);

// "cbf43926": eight lowercase hex digits.
std::string Crc32Hex(uint32_t crc);

// The CRC-32 and size of a whole regular file, read in 1 MiB blocks. NotFound / DataLoss
// naming the path when it cannot be opened or read (OpenRegularFile: not a FIFO or device).
struct FileCrc {
  uint32_t crc = 0;
  uint64_t bytes = 0;
};
StatusOr<FileCrc> Crc32OfFile(const std::string& path);

}  // namespace switchyard
