// Readers of untrusted bytes against malformed input, in one process: a table of damaged
// safetensors headers (overflowing shapes, offsets outside the file, wrong dtypes,
// truncated data, bad header lengths), damaged checkpoint indexes and trainer states, and
// bad YAML, each with the one error it must give (naming the file and what is wrong) and
// the values it must leave untouched; then a seeded randomized run of byte flips,
// overwrites and truncations of valid files (a safetensors file, every file of a
// checkpoint, a YAML config) that must each end in success or a clean error, never a
// signal. The same inputs through the `switchyard` command: tests/cli/malformed_input_test.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/safetensors.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/config/config.h"
#include "tests/testing/files.h"

namespace switchyard::train {
namespace {

namespace fs = std::filesystem;
using test_util::ReadBytes;
using test_util::WriteBytes;

// A safetensors file: the 8-byte little-endian header length, the header, the data.
std::string Safetensors(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

class MalformedInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sy_malformed_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    world_ = dist::MakeLocalCommunicator();
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // A registry of two parameters and an optimizer scalar, values set from `base`.
  void MakeParams(float base) {
    params_ = parallel::ParameterRegistry();
    optimizer_.clear();
    parallel::Parameter w;
    w.name = "layers.0.w";
    w.global_shape = {2, 3};
    w.value = Tensor::FromVector<float>({base, 2, 3, 4, 5, 6}, {2, 3});
    w.grad = Tensor::Zeros({2, 3}, DType::kF32);
    params_.Add(w);
    parallel::Parameter b;
    b.name = "layers.0.b";
    b.global_shape = {3};
    b.value = Tensor::FromVector<float>({base + 7, 8, 9}, {3});
    b.grad = Tensor::Zeros({3}, DType::kF32);
    params_.Add(b);
    parallel::Parameter step;
    step.name = "optimizer.step";
    step.trainable = false;
    step.value = Tensor::FromVector<int64_t>({12}, {});
    optimizer_.push_back(step);
  }
  Status Save(const std::string& out, int64_t step) {
    return checkpoint::SaveCheckpoint(out, step,
                          {.params = &params_,
                           .optimizer_state = optimizer_,
                           .trainer_state_json = R"({"loss": 1.5})",
                           .config_yaml = "x: 1\n"},
                          *world_, *dist::Mesh::Create(1, {}));
  }
  std::vector<float> Values() const {
    std::vector<float> out;
    for (const parallel::Parameter& p : params_.params()) {
      for (float v : p.value.ToVector<float>()) out.push_back(v);
    }
    return out;
  }

  fs::path dir_;
  std::unique_ptr<dist::Communicator> world_;
  parallel::ParameterRegistry params_;
  std::vector<parallel::Parameter> optimizer_;
};

struct SafetensorsCase {
  const char* name;
  std::string header, data;
  const char* want;  // in the error message, after "<path>: "
};

TEST_F(MalformedInputTest, DamagedSafetensorsHeadersGetOneClearError) {
  const std::string f32x2 = R"("dtype":"F32","shape":[2])";
  const std::vector<SafetensorsCase> cases = {
      {"a shape whose bytes overflow 64 bits",
       R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
       std::string(8, 'x'), "(more bytes than fit)"},
      {"a dimension past 2^62", R"({"x":{"dtype":"U8","shape":[9223372036854775807],"data_offsets":[0,8]}})",
       std::string(8, 'x'), "tensor 'x' has a bad shape"},
      {"a negative dimension", R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
       std::string(8, 'x'), "tensor 'x' has a bad shape"},
      {"a fractional dimension", R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})",
       std::string(8, 'x'), "tensor 'x' has a bad shape"},
      {"offsets past the end of the file",
       R"({"x":{)" + f32x2 + R"(,"data_offsets":[8,16]}})", std::string(8, 'x'),
       "data_offsets [8, 16) do not hold f32 (2) (8 bytes) inside 8 bytes of data"},
      {"offsets near 2^64", R"({"x":{)" + f32x2 +
                                 R"(,"data_offsets":[18446744073709551610,18446744073709551615]}})",
       std::string(8, 'x'), "do not hold f32 (2)"},
      {"offsets backwards", R"({"x":{)" + f32x2 + R"(,"data_offsets":[8,0]}})", std::string(8, 'x'),
       "data_offsets [8, 0)"},
      {"negative offsets", R"({"x":{)" + f32x2 + R"(,"data_offsets":[-8,0]}})", std::string(8, 'x'),
       "tensor 'x' has bad data_offsets"},
      {"three offsets", R"({"x":{)" + f32x2 + R"(,"data_offsets":[0,4,8]}})", std::string(8, 'x'),
       "tensor 'x' has a malformed header entry"},
      {"a dtype that does not exist", R"({"x":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})",
       std::string(8, 'x'), "tensor 'x': unsupported safetensors dtype 'F31'"},
      {"a dtype that is not a string", R"({"x":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})",
       std::string(8, 'x'), "tensor 'x' has a malformed header entry"},
      {"a dtype whose size disagrees with the range",
       R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", std::string(8, 'x'),
       "do not hold f64 (2) (16 bytes)"},
      {"truncated data", R"({"x":{)" + f32x2 + R"(,"data_offsets":[0,8]}})", std::string(5, 'x'),
       "inside 5 bytes of data"},
      {"overlapping tensors",
       R"({"x":{)" + f32x2 + R"(,"data_offsets":[0,8]},"y":{)" + f32x2 + R"(,"data_offsets":[4,12]}})",
       std::string(12, 'x'), "tensors overlap"},
      {"a header that is not JSON", "{\"x\": [", "",
       "header is not JSON (line 1, column 8: syntax error while parsing value - unexpected end of input"},
      {"a header that is a list", "[1, 2]", "", "header is not a JSON object"},
      {"metadata that is not an object", R"({"__metadata__": [1]})", "", "__metadata__ is not an object"},
      {"a metadata value that is not a string", R"({"__metadata__": {"k": 1}})", "",
       "__metadata__.k is not a string"},
      {"a tensor listed twice (a JSON reader keeps one)",
       R"({"x":{)" + f32x2 + R"(,"data_offsets":[0,8]},"x":{)" + f32x2 + R"(,"data_offsets":[8,16]}})",
       std::string(16, 'x'), "the header lists tensor 'x' twice"},
      {"a key set twice in one entry", R"({"x":{"dtype":"F64",)" + f32x2 + R"(,"data_offsets":[0,8]}})",
       std::string(8, 'x'), "the header sets 'dtype' twice in tensor 'x'"},
  };
  for (const SafetensorsCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = Path("bad.safetensors");
    WriteBytes(path, Safetensors(c.header, c.data));
    const std::string before = ReadBytes(path);
    StatusOr<SafetensorsFile> r = ReadSafetensors(path);
    ASSERT_FALSE(r.ok());
    const std::string message(r.status().message());
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(c.want), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_EQ(ReadBytes(path), before);  // a reader changes nothing
  }
  // Header lengths that do not fit the file, including one that wraps 8 + n around 2^64.
  for (uint64_t n : {uint64_t{0xffffffffffffffff}, uint64_t{0xfffffffffffffff9},
                     uint64_t{1} << 40, uint64_t{100}}) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    WriteBytes(Path("len.safetensors"), bytes + "{}");
    StatusOr<SafetensorsFile> r = ReadSafetensors(Path("len.safetensors"));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find(StrCat("header length ", n, " does not fit a 10-byte file")),
              std::string::npos)
        << r.status();
  }
  WriteBytes(Path("tiny.safetensors"), "abc");
  EXPECT_NE(ReadSafetensors(Path("tiny.safetensors")).status().message().find("not a safetensors file (3 bytes)"),
            std::string::npos);
  // A directory where a file should be.
  fs::create_directories(Path("dir.safetensors"));
  StatusOr<SafetensorsFile> d = ReadSafetensors(Path("dir.safetensors"));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(Path("dir.safetensors")), std::string::npos) << d.status();
}

// (file in the step directory, text it is replaced with, the error's text) for the index
// and the trainer state; the parameters keep their values and the other files their bytes.
TEST_F(MalformedInputTest, DamagedIndexAndTrainerStateGetOneClearError) {
  MakeParams(1.0f);
  ASSERT_TRUE(Save(Path("run"), 3).ok());
  const std::string step = Path("run/step-00000003");
  const std::string index = ReadBytes(step + "/" + checkpoint::kModelIndexFile);
  const std::string state = ReadBytes(step + "/" + checkpoint::kTrainerStateFile);
  struct Case {
    const char* file;
    std::string text;
    const char* want;
  };
  auto replace = [](std::string s, const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
  };
  const std::vector<Case> cases = {
      {checkpoint::kModelIndexFile, "", "not JSON (line 1, column 1: "},
      {checkpoint::kModelIndexFile, "{\"weight_map\": {", "not JSON (line 1, column 17: "},
      {checkpoint::kModelIndexFile, "[]", "not a safetensors index"},
      {checkpoint::kModelIndexFile, replace(index, "\"shape\":[2,3]", "\"shape\":[4294967296,4294967296,4294967296]"),
       "tensor 'layers.0.w': a bad shape"},
      {checkpoint::kModelIndexFile, replace(index, "\"shape\":[2,3]", "\"shape\":[-2,3]"),
       "tensor 'layers.0.w': a bad shape"},
      {checkpoint::kModelIndexFile, replace(index, "\"dtype\":\"F32\"", "\"dtype\":\"Q8\""),
       "unsupported safetensors dtype 'Q8'"},
      {checkpoint::kModelIndexFile, replace(index, "\"file\":\"model.safetensors\"", "\"file\":\"../model.safetensors\""),
       "piece 0: file \"../model.safetensors\" is not a file name"},
      // Each index message gives its real reason.
      {checkpoint::kModelIndexFile, replace(index, "\"trainer_state.json\":", "\"../../etc/passwd\":"),
       "files: '../../etc/passwd' is not a file name"},
      {checkpoint::kModelIndexFile, replace(index, "\"offset\":[0,0]", "\"offset\":[-1,0]"),
       "piece 0: offset is [-1,0], not a list of non-negative integers"},
      {checkpoint::kModelIndexFile, replace(index, "\"box\":[2,3]", "\"box\":[4611686018427387904,3]"),
       "piece 0: box is [4611686018427387904,3], more than 2^62 elements"},
      {checkpoint::kModelIndexFile, replace(index, "\"elements\":[0,6]", "\"elements\":[6,0]"),
       "piece 0: elements [6,0] is not a range [begin, end)"},
      {checkpoint::kModelIndexFile, replace(index, "\"tensors\": {\n", "\"tensors\": {\n  \"layers.0.b\": 1,\n"),
       "\"tensors\" lists 'layers.0.b' twice"},
      {checkpoint::kModelIndexFile, replace(index, "\"box\":[2,3]", "\"box\":[2,30]"), "a piece outside the tensor"},
      {checkpoint::kModelIndexFile, replace(index, "\"format_version\":2", "\"format_version\":\"two\""),
       "metadata.format_version is \"two\""},
      // The checksum table covers every file read, and the metadata is what format 2 writes.
      {checkpoint::kModelIndexFile, replace(index, "\"config.yaml\":", "\"config.yml\":"),
       "\"files\" has no checksum for config.yaml"},
      {checkpoint::kModelIndexFile, replace(index, "\"trainer_state.json\":", "\"state.json\":"),
       "\"files\" has no checksum for trainer_state.json"},
      {checkpoint::kModelIndexFile, replace(index, "\"model.safetensors\": {", "\"model.st\": {"),
       "lists pieces in model.safetensors but no checksum for it"},
      {checkpoint::kModelIndexFile, replace(index, "{\"metadata\": {", "{\"meta\": {"),
       "no \"metadata\" object (format 2 writes format, format_version and total_size there)"},
      {checkpoint::kModelIndexFile, replace(index, "\"format_version\":2", "\"format_version\":0"),
       "metadata.format_version is 0, not a format version (1 to 2)"},
      {checkpoint::kModelIndexFile, replace(index, "\"format_version\":2", "\"format_version\":1"),
       "metadata.format_version is 1 but trainer_state.json's is 2"},
      {checkpoint::kModelIndexFile, replace(index, "\"format_version\":2,", ""),
       "metadata has no format_version"},
      {checkpoint::kModelIndexFile,
       replace(index, "\"format\":\"switchyard-checkpoint\"", "\"format\":\"bogus\""),
       "metadata.format is \"bogus\", not \"switchyard-checkpoint\""},
      {checkpoint::kTrainerStateFile, replace(state, "\"format_version\": 2", "\"format_version\": 0"),
       "format_version 0 is not a format version (1 to 2)"},
      {checkpoint::kTrainerStateFile, replace(state, "\"format_version\": 2", "\"format_version\": 4294967298"),
       "format version 4294967298"},
      {checkpoint::kTrainerStateFile, "", "trainer_state.json: not JSON (line 1, column 1: "},
      {checkpoint::kTrainerStateFile, replace(state, "\"step\": 3", "\"step\": \"3\""), "not a Switchyard trainer state"},
      // The layout and the data position, range-checked.
      {checkpoint::kTrainerStateFile, replace(state, "\"world\": 1", "\"world\": 0"),
       "layout.world=0 must be an integer in [1, 131072]"},
      {checkpoint::kTrainerStateFile, replace(state, "\"ep\": 1", "\"ep\": 3"),
       "layout.world=1 but tp 1 x cp 1 x pp 1 x dp 1 = 1 and etp 1 x ep 3 x pp 1 x edp 1 = 3"},
      {checkpoint::kTrainerStateFile, replace(state, "\"loss\"", "\"data_position\": {\"next_step\": -5}, \"loss\""),
       "data_position.next_step=-5 must be an integer in [0, 9007199254740992]"},
      {checkpoint::kTrainerStateFile,
       replace(state, "\"loss\"", "\"data_position\": {\"next_step\": 4611686018427387904}, \"loss\""),
       "data_position.next_step=4611686018427387904 must be an integer in [0, 9007199254740992]"},
      {checkpoint::kTrainerStateFile, replace(state, "\"loss\"", "\"data_position\": {\"next_step\": 2}, \"loss\""),
       "data_position.next_step=2 but the checkpoint is of step 3"},
  };
  const std::vector<float> values = Values();
  MakeParams(100.0f);  // what loading must not change
  const std::vector<float> untouched = Values();
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.file) + " <- " + c.text.substr(0, 60));
    const std::string path = step + "/" + c.file;
    WriteBytes(path, c.text);
    const std::string model_bytes = ReadBytes(step + "/" + checkpoint::kModelFile);
    StatusOr<checkpoint::LoadedCheckpoint> r = checkpoint::LoadCheckpoint(Path("run"), params_, &optimizer_, *world_);
    ASSERT_FALSE(r.ok());
    const std::string message(r.status().message());
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find(c.want), std::string::npos) << message;
    EXPECT_EQ(Values(), untouched);
    EXPECT_EQ(ReadBytes(step + "/" + checkpoint::kModelFile), model_bytes);
    WriteBytes(step + "/" + checkpoint::kModelIndexFile, index);
    WriteBytes(step + "/" + checkpoint::kTrainerStateFile, state);
  }
  ASSERT_TRUE(checkpoint::LoadCheckpoint(Path("run"), params_, &optimizer_, *world_).ok());
  EXPECT_EQ(Values(), values);
  // Checksums are written in lower case and read in either.
  std::string upper = index;
  for (size_t at = upper.find("\"crc32\":\""); at != std::string::npos;
       at = upper.find("\"crc32\":\"", at + 1)) {
    for (size_t i = at + 9; i < at + 17; ++i) upper[i] = static_cast<char>(std::toupper(upper[i]));
  }
  ASSERT_NE(upper, index);
  WriteBytes(step + "/" + checkpoint::kModelIndexFile, upper);
  EXPECT_TRUE(checkpoint::LoadCheckpoint(Path("run"), params_, &optimizer_, *world_).ok());
}

TEST_F(MalformedInputTest, BadYamlGetsOneClearError) {
  struct Case {
    std::string yaml;
    const char* want;
  };
  const std::vector<Case> cases = {
      {"model: {d_model: [", "cfg.yaml:1: YAML syntax error"},
      {"model:\n  d_model: 32\n bad indent: 1\n", "YAML syntax error"},
      {"- 1\n- 2\n", "cfg.yaml: the top level must be a mapping of sections"},
      {"model: 3\n", "cfg.yaml: section 'model' must be a mapping"},
      {"? [a, b]\n: 1\n", "cfg.yaml: a section name (line 1) must be a plain word, not '[...]'"},
      {"model:\n  ? {a: 1}\n  : 2\n", "cfg.yaml: a key of section 'model' (line 2) must be a plain word"},
      {"model:\n  d_model: [1, 2]\n", "cfg.yaml: model.d_model: expected an integer, got '[...]'"},
      {"model:\n  d_model: 99999999999999999999\n", "model.d_model: expected an integer"},
      {"train:\n  lr: fast\n", "train.lr: expected a number, got 'fast'"},
      {"moe:\n  activation: {a: 1}\n", "moe.activation: expected a name"},
      {"data:\n  dir: [a]\n", "data.dir: expected a string"},
      {"&a [*a]\n", "cfg.yaml"},
      {"model:\n  d_model: 32\n  n_layers: 2\n  d_model: 64\n",
       "cfg.yaml: 'model.d_model' is set twice, on lines 2 and 4; keep one"},
      {"model:\n  d_model: 32\ntrain:\n  lr: 0.1\nmodel:\n  n_layers: 2\n",
       "cfg.yaml: 'model' is set twice, on lines 1 and 5; keep one"},
      // Bytes of the file echoed in a message are escaped, never printed raw.
      {std::string("a: \"\\\0\"\n", 8), "YAML syntax error: unknown escape character: \\x00"},
      {"a: \"\\\xff\"\n", "YAML syntax error: unknown escape character: \\xff"},
      {"model:\n  vocab_size: 20\x1b[31m\n", "model.vocab_size: expected an integer, got '20\\x1b[31m'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.yaml);
    StatusOr<config::Config> r = config::ParseConfig(c.yaml, "cfg.yaml", {});
    ASSERT_FALSE(r.ok());
    const std::string message(r.status().message());
    EXPECT_NE(message.find(c.want), std::string::npos) << message;
    EXPECT_EQ(message, PrintableText(message)) << "a raw control or non-UTF-8 byte";
  }
}

TEST_F(MalformedInputTest, AnEmptyConfigFileOrADirectoryIsRefused) {
  for (const auto& [text, want] : {std::pair<std::string, std::string>{"", "(0 bytes)"},
                                   {"# only a comment\n\n", "(no keys)"}}) {
    WriteBytes(Path("empty.yaml"), text);
    StatusOr<config::Config> r = config::LoadConfig(Path("empty.yaml"));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().message(), Path("empty.yaml") + ": the config file is empty " + want +
                                        "; see configs/ and docs/config.md");
  }
  StatusOr<config::Config> d = config::LoadConfig(dir_.string());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), dir_.string() + ": is a directory, not a file");
}

// ---- randomized ---------------------------------------------------------------------------

// A copy of `bytes` damaged one of four ways: 1-4 random bytes flipped, a random byte
// overwritten with a digit or JSON/YAML punctuation, a truncation, or the first 8 bytes
// (a safetensors header length) replaced.
std::string Damage(const std::string& bytes, std::mt19937_64& rng) {
  std::string out = bytes;
  if (out.empty()) return out;
  auto at = [&]() { return static_cast<size_t>(rng() % out.size()); };
  switch (rng() % 4) {
    case 0:
      for (int i = 0, n = 1 + static_cast<int>(rng() % 4); i < n; ++i) {
        out[at()] ^= static_cast<char>(1u << (rng() % 8));
      }
      break;
    case 1: {
      static const char kChars[] = "0123456789-.e[]{}:,\"' \n#&*!?|>";
      out[at()] = kChars[rng() % (sizeof(kChars) - 1)];
      break;
    }
    case 2:
      out.resize(at());
      break;
    default:
      for (int i = 0; i < 8 && i < static_cast<int>(out.size()); ++i) {
        out[i] = static_cast<char>(rng() % 3 == 0 ? rng() : 0);
      }
      break;
  }
  return out;
}

constexpr uint64_t kSeed = 20261125;

TEST_F(MalformedInputTest, RandomDamageToASafetensorsFileIsACleanErrorOrSuccess) {
  SafetensorsFile file;
  file.tensors["x"] = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {1, 2, 3});
  file.tensors["ids"] = Tensor::FromVector<int64_t>({7, 8}, {2});
  file.tensors["empty"] = Tensor::Empty({0, 4}, DType::kF32);
  file.metadata["format"] = "pt";
  ASSERT_TRUE(WriteSafetensors(Path("good.safetensors"), file).ok());
  const std::string good = ReadBytes(Path("good.safetensors"));
  std::mt19937_64 rng(kSeed);
  int errors = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string path = Path("case.safetensors");
    WriteBytes(path, Damage(good, rng));
    StatusOr<SafetensorsFile> r = ReadSafetensors(path);
    if (r.ok()) continue;
    ++errors;
    const std::string message(r.status().message());
    ASSERT_EQ(message.rfind(path + ": ", 0), 0u) << "case " << i << ": " << message;
    ASSERT_EQ(message.find('\n'), std::string::npos) << "case " << i << ": " << message;
  }
  EXPECT_GT(errors, 150);  // most damage is caught; flipped data bits are not (checksums are)
}

TEST_F(MalformedInputTest, RandomDamageToACheckpointIsACleanErrorOrSuccess) {
  MakeParams(1.0f);
  ASSERT_TRUE(Save(Path("run"), 2).ok());
  const std::string step = Path("run/step-00000002");
  const std::vector<std::string> files = {checkpoint::kModelIndexFile, checkpoint::kTrainerStateFile, checkpoint::kModelFile,
                                          checkpoint::kOptimizerFile, "../latest"};
  std::vector<std::string> good;
  for (const std::string& f : files) good.push_back(ReadBytes(step + "/" + f));
  std::mt19937_64 rng(kSeed + 1);
  int errors = 0;
  for (int i = 0; i < 250; ++i) {
    const size_t which = rng() % files.size();
    const std::string path = step + "/" + files[which];
    WriteBytes(path, Damage(good[which], rng));
    MakeParams(100.0f);
    const std::vector<float> before = Values();
    StatusOr<checkpoint::LoadedCheckpoint> r = checkpoint::LoadCheckpoint(Path("run"), params_, &optimizer_, *world_);
    if (!r.ok()) {
      ++errors;
      const std::string message(r.status().message());
      ASSERT_NE(message.find(Path("run")), std::string::npos) << "case " << i << ": " << message;
      ASSERT_EQ(message.find('\n'), std::string::npos) << "case " << i << ": " << message;
      ASSERT_EQ(Values(), before) << "case " << i << ": a failed load changed a value";
    }
    WriteBytes(path, good[which]);
  }
  EXPECT_GT(errors, 125);
}

TEST_F(MalformedInputTest, RandomDamageToAYamlConfigIsACleanErrorOrSuccess) {
  const std::string good = ReadBytes(SY_TRAIN_TINY_CONFIG);
  ASSERT_FALSE(good.empty());
  std::mt19937_64 rng(kSeed + 2);
  int errors = 0;
  for (int i = 0; i < 300; ++i) {
    const std::string yaml = Damage(good, rng);
    StatusOr<config::Config> r = config::ParseConfig(yaml, "cfg.yaml", {});
    Status s = r.ok() ? r->Validate(1) : r.status();
    if (s.ok()) s = r->model.Validate();
    if (s.ok()) continue;
    ++errors;
    ASSERT_EQ(std::string(s.message()).find('\n'), std::string::npos) << "case " << i << ": " << s;
  }
  EXPECT_GT(errors, 30);
}

}  // namespace
}  // namespace switchyard::train
