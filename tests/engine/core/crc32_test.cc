// Crc32 (engine/core/crc32.h) against the standard check value, a byte-at-a-time reference
// of the polynomial on lengths around the 4-byte blocks, incremental use, and files.
#include "engine/core/crc32.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace switchyard {
namespace {

uint32_t Reference(const std::string& s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

TEST(Crc32Test, MatchesTheCheckValueAndABitwiseReference) {
  EXPECT_EQ(Crc32(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(Crc32Hex(0xCBF43926u), "cbf43926");
  EXPECT_EQ(Crc32(0, "", 0), 0u);
  std::string s;
  for (int n = 0; n < 70; ++n) {
    EXPECT_EQ(Crc32(0, s.data(), s.size()), Reference(s)) << n;
    s.push_back(static_cast<char>(n * 37 + 11));
  }
  // Incremental: any split gives the whole's value.
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(Crc32(Crc32(0, s.data(), cut), s.data() + cut, s.size() - cut), Reference(s)) << cut;
  }
}

TEST(Crc32Test, OfAFile) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("sy_crc_" + std::to_string(::getpid()))).string();
  std::string big(3 << 20, '\0');  // several 1 MiB blocks
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 11));
  std::ofstream(path, std::ios::binary) << big;
  auto got = Crc32OfFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->bytes, big.size());
  EXPECT_EQ(got->crc, Crc32(0, big.data(), big.size()));
  std::remove(path.c_str());
  EXPECT_EQ(Crc32OfFile(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace switchyard
