#include "engine/core/safetensors.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace switchyard {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_safetensors_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }
  void WriteRaw(const std::string& path, const std::string& header, const std::string& data) {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) out.put(static_cast<char>((n >> (8 * i)) & 0xff));
    out << header << data;
  }
  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsTensorsAndMetadata) {
  SafetensorsFile file;
  file.tensors["w"] = Tensor::FromVector<float>({1.5f, -2, 3, 4, 5, 6}, {2, 3});
  file.tensors["ids"] = Tensor::FromVector<int64_t>({7, 8}, {2});
  file.tensors["empty"] = Tensor::Empty({0, 4}, DType::kF32);
  file.metadata["format"] = "pt";
  ASSERT_TRUE(WriteSafetensors(Path("a.safetensors"), file).ok());
  auto read = ReadSafetensors(Path("a.safetensors"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->metadata.at("format"), "pt");
  EXPECT_EQ(read->tensors.at("w").ToVector<float>(), file.tensors["w"].ToVector<float>());
  EXPECT_EQ(read->tensors.at("w").shape(), (Shape{2, 3}));
  EXPECT_EQ(read->tensors.at("ids").ToVector<int64_t>(), (std::vector<int64_t>{7, 8}));
  EXPECT_EQ(read->tensors.at("empty").shape(), (Shape{0, 4}));
  // No temporary file is left behind.
  int entries = 0;
  for (auto& e : fs::directory_iterator(dir_)) entries += e.is_regular_file();
  EXPECT_EQ(entries, 1);
}

TEST_F(SafetensorsTest, ReadsAHandWrittenFile) {
  // Two little-endian f32 values 1.0 (0x3f800000) and -2.0 (0xc0000000).
  std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);
  WriteRaw(Path("h.safetensors"), R"({"v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data);
  auto read = ReadSafetensors(Path("h.safetensors"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->tensors.at("v").ToVector<float>(), (std::vector<float>{1.0f, -2.0f}));
}

TEST_F(SafetensorsTest, DamagedFilesGetOneClearError) {
  auto message = [&](const std::string& header, const std::string& data) {
    WriteRaw(Path("bad.safetensors"), header, data);
    auto r = ReadSafetensors(Path("bad.safetensors"));
    EXPECT_FALSE(r.ok());
    return std::string(r.status().message());
  };
  EXPECT_NE(message("{not json", "").find(
                "header is not JSON (line 1, column 3: syntax error while parsing object key - invalid literal"),
            std::string::npos);
  EXPECT_NE(message("[1, 2]", "").find("header is not a JSON object"), std::string::npos);
  EXPECT_NE(message(R"({"v":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x'))
                .find("tensor 'v' data_offsets [0, 8) do not hold f32 (3)"),
            std::string::npos);
  EXPECT_NE(message(R"({"v":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "x")
                .find("unsupported safetensors dtype 'Q7'"),
            std::string::npos);
  EXPECT_NE(message(R"({"v":{"dtype":"U8","shape":[1]}})", "x").find("malformed"), std::string::npos);
  // A truncated file: the header claims more bytes than exist.
  std::ofstream(Path("short.safetensors"), std::ios::binary) << std::string("\xff\x00\x00\x00\x00\x00\x00\x00{", 9);
  auto r = ReadSafetensors(Path("short.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(std::string(r.status().message()).find("truncated"), std::string::npos);
  EXPECT_EQ(ReadSafetensors(Path("missing.safetensors")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, GetTensorNamesTheMismatch) {
  SafetensorsFile file;
  file.tensors["x"] = Tensor::Zeros({4, 8}, DType::kBF16);
  auto bad = GetTensor(file, "x", DType::kF32, {4, 8}, "in.safetensors");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "in.safetensors: tensor 'x': expected f32 (4, 8), got bf16 (4, 8)");
  EXPECT_EQ(GetTensor(file, "y", DType::kF32, {}, "in.safetensors").status().message(),
            "in.safetensors: missing tensor 'y'");
  EXPECT_TRUE(GetTensor(file, "x", DType::kBF16, {4, 8}, "in.safetensors").ok());
}

TEST_F(SafetensorsTest, FailedWriteLeavesTheOldFileIntact) {
  SafetensorsFile file;
  file.tensors["a"] = Tensor::FromVector<float>({1, 2}, {2});
  const std::string path = Path("keep.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, file).ok());
  SafetensorsFile on_device_missing_dir;
  on_device_missing_dir.tensors["a"] = Tensor::FromVector<float>({9, 9}, {2});
  EXPECT_FALSE(WriteSafetensors(Path("no/such/dir/x.safetensors"), on_device_missing_dir).ok());
  auto read = ReadSafetensors(path);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->tensors.at("a").ToVector<float>(), (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace switchyard
