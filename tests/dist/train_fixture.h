// What the multi-rank training tests share (trainer_test.cc, zero_test.cc,
// context_parallel_train_test.cc): a small three-language corpus the suite writes and
// prepares once (vocabulary 256), the tiny config of tests/data/train-tiny.yaml pointed at
// it, quiet training runs, the one-rank reference trained by rank 0 alone, and resuming a
// checkpoint under another layout.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/dist/process.h"
#include "engine/config/config.h"
#include "engine/data/prep.h"
#include "engine/train/trainer.h"

#ifndef SY_TRAIN_TINY_CONFIG
#error "SY_TRAIN_TINY_CONFIG (the path of tests/data/train-tiny.yaml) must be defined"
#endif

namespace switchyard::train::testing {

namespace fs = std::filesystem;

inline constexpr int kVocab = 256;

// Sends stdout (the trainer's progress lines and tables) to /dev/null while alive. Only
// around trainer calls: gtest reports failures on stdout.
class QuietStdout {
 public:
  QuietStdout() {
    std::fflush(stdout);
    saved_ = ::dup(1);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::close(null);
  }
  ~QuietStdout() {
    std::fflush(stdout);
    ::dup2(saved_, 1);
    ::close(saved_);
  }

 private:
  int saved_ = -1;
};

// Three "languages" of templated two-line documents in fortune format: learnable, with
// enough repetition that a tiny model's loss falls within a few dozen steps.
inline void WriteCorpus(const fs::path& dir) {
  struct Lang {
    const char* file;
    std::vector<const char*> subjects, verbs;
    const char* line1;  // subject, verb, count
    const char* line2;  // verb
    int shift;
  };
  const Lang langs[] = {
      {"en.txt", {"the cat", "the dog", "a bird", "my friend", "the old man"},
       {"sat", "ran", "sang", "slept", "jumped"}, "%s %s on the mat %d times\n",
       "and then it %s again\n%%\n", 2},
      {"de.txt", {"der hund", "die katze", "ein vogel", "mein freund", "der alte"},
       {"lief", "sang", "schlief", "sprang", "sass"}, "%s %s auf der matte %d mal\n",
       "und dann %s es wieder\n%%\n", 3},
      {"fr.txt", {"le chat", "le chien", "un oiseau", "mon ami", "le vieux"},
       {"dort", "chante", "court", "saute", "mange"}, "%s %s sur le tapis %d fois\n",
       "et puis il %s encore\n%%\n", 1},
  };
  for (const Lang& lang : langs) {
    std::ofstream out(dir / lang.file);
    char line[256];
    for (int i = 0; i < 120; ++i) {
      std::snprintf(line, sizeof(line), lang.line1, lang.subjects[i % 5], lang.verbs[i % 5], i % 7);
      out << line;
      std::snprintf(line, sizeof(line), lang.line2, lang.verbs[(i + lang.shift) % 5]);
      out << line;
    }
  }
}

// Relative error of got against want (absolute below 1e-12).
inline double RelErr(double got, double want) {
  return std::abs(got - want) / std::max(std::abs(want), 1e-12);
}

// The suite's world, its directory (one for every rank, named by rank 0's pid) and the
// prepared corpus.
class TrainFixture : public ::testing::Test {
 public:  // the suites' free helper functions use these too
  static void SetUpTestSuite() {
    world_ = dist::WorldCommunicator();
    Tensor pid = Tensor::FromVector<int64_t>({static_cast<int64_t>(::getpid())}, {1});
    world_->Broadcast(pid, 0);
    root_ = (fs::path(::testing::TempDir()) /
             ("sy_train_" + std::to_string(pid.ToVector<int64_t>()[0])))
                .string();
    int32_t ok = 1;
    if (world_->rank() == 0) {
      fs::remove_all(root_);
      fs::create_directories(fs::path(root_) / "corpus");
      WriteCorpus(fs::path(root_) / "corpus");
      data::PrepOptions options;
      options.out_dir = data_dir();
      for (const char* f : {"de.txt", "en.txt", "fr.txt"}) {
        options.files.push_back((fs::path(root_) / "corpus" / f).string());
      }
      options.vocab_size = kVocab;
      auto index = data::Prepare(options);
      if (!index.ok()) {
        std::fprintf(stderr, "prep failed: %s\n", std::string(index.status().message()).c_str());
        ok = 0;
      }
    }
    Tensor flag = Tensor::FromVector<int32_t>({ok}, {1});
    world_->Broadcast(flag, 0);
    prepared_ = flag.ToVector<int32_t>()[0] == 1;
  }
  static void TearDownTestSuite() {
    world_->Barrier();
    if (world_->rank() == 0) fs::remove_all(root_);
    world_.reset();
  }
  void SetUp() override { ASSERT_TRUE(prepared_) << "data preparation failed on rank 0"; }

  static std::string data_dir() { return (fs::path(root_) / "data").string(); }
  static std::string dir(const std::string& name) { return (fs::path(root_) / name).string(); }
  static int R() { return world_->size(); }
  static bool is_root() { return world_->rank() == 0; }

  // The tiny config with the test's data and `overrides` applied.
  static config::Config TinyConfig(std::vector<std::string> overrides) {
    overrides.push_back("data.dir=" + data_dir());
    auto config = config::LoadConfig(SY_TRAIN_TINY_CONFIG, overrides);
    SY_CHECK_OK(config.status());
    return *config;
  }

  // Creates a trainer on `comm` and runs `steps` steps (0: to train.max_steps); quiet.
  static StatusOr<std::unique_ptr<Trainer>> Train(const config::Config& config, const std::string& out,
                                                  dist::Communicator& comm, int64_t steps = 0) {
    QuietStdout quiet;
    SY_ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer, Trainer::Create(config, out, comm));
    SY_RETURN_IF_ERROR(trainer->Run(steps));
    return trainer;
  }

  // The one-rank reference: `overrides` with grad_accum `micro_batches` (the global batch
  // of the layouts compared with it) for `steps` steps, trained by rank 0 alone into
  // `out`. The trainer on rank 0, null elsewhere.
  static std::unique_ptr<Trainer> TrainReference(std::vector<std::string> overrides,
                                                 const std::string& out, int64_t steps,
                                                 int64_t micro_batches) {
    overrides.push_back("train.max_steps=" + std::to_string(steps));
    overrides.push_back("train.grad_accum=" + std::to_string(micro_batches));
    if (world_->rank() != 0) return nullptr;
    static std::unique_ptr<dist::Communicator> local = dist::MakeLocalCommunicator(Device::Cpu(), 0);
    auto ref = Train(TinyConfig(overrides), out, *local);
    EXPECT_TRUE(ref.ok()) << ref.status();
    if (!ref.ok()) return nullptr;
    EXPECT_EQ((*ref)->losses().size(), static_cast<size_t>(steps));
    return std::move(*ref);
  }

  // Creates a trainer on `comm`, resumes it from the checkpoint `saved` and trains to
  // train.max_steps; the losses of the resumed steps (empty, with a test failure, on error).
  static std::vector<double> ResumeLosses(const config::Config& config, const std::string& saved,
                                          const std::string& out, dist::Communicator& comm) {
    QuietStdout quiet;
    auto t = Trainer::Create(config, out, comm);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    Status loaded = (*t)->Resume(saved);
    EXPECT_TRUE(loaded.ok()) << loaded;
    Status ran = (*t)->Run(0);
    EXPECT_TRUE(ran.ok()) << ran;
    return (*t)->losses();
  }

  // Two runs' losses and every weight are the same bits (the same steps, the same order of
  // operations: e.g. eager against replayed steps, or shadowed against per-product bf16).
  static void ExpectSameBits(Trainer& got, Trainer& want) {
    ASSERT_EQ(got.losses().size(), want.losses().size());
    for (size_t s = 0; s < want.losses().size(); ++s) {
      EXPECT_EQ(std::memcmp(&got.losses()[s], &want.losses()[s], sizeof(double)), 0)
          << "step " << s << ": " << got.losses()[s] << " vs " << want.losses()[s];
    }
    const auto& a = got.registry().params();
    const auto& b = want.registry().params();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].name, b[i].name);
      const std::vector<float> x = a[i].value.ToVector<float>(), y = b[i].value.ToVector<float>();
      ASSERT_EQ(x.size(), y.size()) << a[i].name;
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0)
          << a[i].name << " differs";
    }
  }

  // Each run's losses (named, resumed at step `first`) equal `want`'s steps first.. within
  // MODEL.md section 4's 1e-5.
  static void ExpectResumedLossesMatch(
      const std::vector<std::pair<std::string, std::vector<double>>>& runs,
      const std::vector<double>& want, int64_t first) {
    const int64_t total = static_cast<int64_t>(want.size());
    for (const auto& [what, got] : runs) {
      ASSERT_EQ(got.size(), static_cast<size_t>(total - first)) << what;
      for (int64_t s = first; s < total; ++s) {
        EXPECT_LE(RelErr(got[s - first], want[s]), 1e-5)
            << what << ", step " << s << ": " << got[s - first] << " vs " << want[s];
      }
    }
  }

  static std::unique_ptr<dist::Communicator> world_;
  static std::string root_;
  static bool prepared_;
};

inline std::unique_ptr<dist::Communicator> TrainFixture::world_;
inline std::string TrainFixture::root_;
inline bool TrainFixture::prepared_ = false;

}  // namespace switchyard::train::testing
