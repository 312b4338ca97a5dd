#include "benchmarks/train_bench.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/data/prep.h"

namespace switchyard::bench {
namespace {

namespace fs = std::filesystem;

Status WriteAndPrepare(const std::string& dir, int vocab) {
  const fs::path text = fs::path(dir) / "corpus";
  fs::create_directories(text);
  std::mt19937 rng(7);
  const char* syllables[] = {"ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "pe", "du"};
  std::ofstream out(text / "synthetic.txt");
  for (int doc = 0; doc < 2000; ++doc) {
    for (int w = 0; w < 60; ++w) {
      const int n = 1 + static_cast<int>(rng() % 3);
      for (int s = 0; s < n; ++s) out << syllables[rng() % 10];
      out << (w % 12 == 11 ? "\n" : " ");
    }
    out << "\n%\n";
  }
  out.close();
  data::PrepOptions options;
  options.out_dir = (fs::path(dir) / "data").string();
  options.files = {(text / "synthetic.txt").string()};
  options.vocab_size = vocab;
  return data::Prepare(options).status();
}

}  // namespace

StatusOr<std::string> MakeSyntheticData(dist::Communicator& world, const std::string& tag, int vocab) {
  Tensor pid = Tensor::FromVector<int64_t>({static_cast<int64_t>(::getpid())}, {1});
  world.Broadcast(pid, 0);
  const std::string dir =
      (fs::temp_directory_path() / (tag + "_" + std::to_string(pid.ToVector<int64_t>()[0]))).string();
  Status made = OkStatus();
  if (world.rank() == 0) made = WriteAndPrepare(dir, vocab);
  Tensor ok = Tensor::FromVector<int32_t>({made.ok() ? 1 : 0}, {1});
  world.Broadcast(ok, 0);
  if (ok.ToVector<int32_t>()[0] == 0) {
    return made.ok() ? FailedPrecondition("synthetic data: rank 0 failed") : made;
  }
  return dir;
}

Status RunQuietly(train::Trainer& trainer, int64_t steps) {
  std::fflush(stdout);
  const int saved = ::dup(1);
  std::FILE* null = std::freopen("/dev/null", "w", stdout);
  (void)null;
  Status ran = trainer.Run(steps);
  std::fflush(stdout);
  ::dup2(saved, 1);
  ::close(saved);
  return ran;
}

}  // namespace switchyard::bench
