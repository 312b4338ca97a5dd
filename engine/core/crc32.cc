#include "engine/core/crc32.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "engine/core/file.h"

namespace switchyard {
namespace {

// Slicing-by-4 tables: kTable[0] is the byte-wise table, kTable[k][b] the CRC of b
// followed by k zero bytes.
using Tables = std::array<std::array<uint32_t, 256>, 4>;

Tables MakeTables() {
  Tables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][b] = c;
  }
  for (uint32_t b = 0; b < 256; ++b) {
    for (int k = 1; k < 4; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}

const Tables& Table() {
  static const Tables t = MakeTables();
  return t;
}

}  // namespace

uint32_t Crc32(uint32_t crc, const void* data, size_t n) {
  const Tables& t = Table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 4) {
    c ^= static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
    c = t[3][c & 0xff] ^ t[2][(c >> 8) & 0xff] ^ t[1][(c >> 16) & 0xff] ^ t[0][c >> 24];
    p += 4;
    n -= 4;
  }
  while (n-- > 0) c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

std::string Crc32Hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", crc);
  return buf;
}

StatusOr<FileCrc> Crc32OfFile(const std::string& path) {
  SY_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path));  // a FIFO would block forever
  FileCrc out;
  SY_RETURN_IF_ERROR(ReadBlocks(fd, path, 1 << 20, [&](const char* data, size_t n) {
    out.crc = Crc32(out.crc, data, n);
    out.bytes += n;
    return OkStatus();
  }));
  return out;
}

}  // namespace switchyard
