// train_batches: writes the token batches `switchyard train` reads at steps 0 .. N-1 (one
// rank, grad_accum 1), so that the PyTorch reference (benchmarks/reference/train_torch.py)
// trains on exactly the same tokens without re-implementing the loader's window order.
//
//   train_batches --data DIR --seq_len S --micro_batch_size B --seed SEED --steps N --out FILE
//
// FILE: one JSON line {"steps", "micro_batch_size", "seq_len", "first_sequence": [per step]}
// then, per step, inputs (B, S) and targets (B, S) as little-endian int32.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchmarks/harness.h"
#include "engine/cli/args.h"
#include "engine/data/loader.h"

namespace switchyard {
namespace {

constexpr char kName[] = "train_batches";

int Main(int argc, char** argv) {
  std::string dir, out;
  int seq_len = 0, micro_batch_size = 0, seed = 1234, steps = 0;
  cli::FlagSet flags(kName, "Writes the training batches of steps 0 .. N-1 (one rank).");
  flags.AddString("data", &dir, "a `switchyard prep` folder", true);
  flags.AddInt("seq_len", &seq_len, "model.seq_len", true);
  flags.AddInt("micro_batch_size", &micro_batch_size, "train.micro_batch_size", true);
  flags.AddInt("seed", &seed, "train.seed (default 1234)");
  flags.AddInt("steps", &steps, "N, steps to write", true);
  flags.AddString("out", &out, "output file", true);
  if (Status s = flags.Parse({argv + 1, argv + argc}); !s.ok()) {
    return cli::UsageError(kName, bench::Message(s));
  }
  if (flags.help_requested()) {
    std::printf("%s", flags.Usage().c_str());
    return 0;
  }
  if (steps < 1) return cli::UsageError(kName, StrCat("--steps=", steps, " must be >= 1"));
  data::LoaderOptions lo;
  lo.dir = dir;
  lo.seq_len = seq_len;
  lo.micro_batch_size = lo.global_batch_size = micro_batch_size;
  lo.seed = static_cast<uint64_t>(seed);
  if (Status s = lo.Validate(); !s.ok()) return cli::UsageError(kName, bench::Message(s));
  StatusOr<data::DataLoader> loader = data::DataLoader::Open(lo);
  if (!loader.ok()) {
    std::fprintf(stderr, "%s: error: %s\n", kName, bench::Message(loader.status()).c_str());
    return 1;
  }
  std::vector<data::Batch> batches;
  nlohmann::json first = nlohmann::json::array();
  for (int s = 0; s < steps; ++s) {
    batches.push_back(loader->GetBatch(s, 0));
    first.push_back(batches.back().sequences.front());
  }
  const std::string tmp = out + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << nlohmann::json{{"steps", steps}, {"micro_batch_size", micro_batch_size},
                        {"seq_len", seq_len}, {"first_sequence", first}}
             .dump()
      << "\n";
    for (const data::Batch& b : batches) {
      f.write(reinterpret_cast<const char*>(b.inputs.data<int32_t>()), b.inputs.numel() * 4);
      f.write(reinterpret_cast<const char*>(b.targets.data<int32_t>()), b.targets.numel() * 4);
    }
    if (!f.good()) {
      std::fprintf(stderr, "%s: error: cannot write %s\n", kName, tmp.c_str());
      return 1;
    }
  }
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    std::fprintf(stderr, "%s: error: cannot rename %s to %s\n", kName, tmp.c_str(), out.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace switchyard

int main(int argc, char** argv) { return switchyard::Main(argc, argv); }
