// The `switchyard` command: looks the subcommand up in kCommands and runs it.
//   switchyard <command> [flags]      switchyard help [command]      switchyard --help
// Adding a subcommand is one line in kCommands (and its Run function in commands.h).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/core/allocator.h"
#include "engine/core/thread_pool.h"
#include "engine/dist/process.h"

namespace switchyard::cli {
namespace {

struct Command {
  std::string_view name;
  std::string_view summary;  // one line for `switchyard --help`
  int (*run)(const std::vector<std::string>& args);
};

constexpr Command kCommands[] = {
    {"mesh", "print the process groups of a parallel layout (dense and expert views)", RunMesh},
    {"plan", "the fastest layouts of a config on N GPUs that fit, by predicted step time",
     RunPlan},
    {"pipeline", "validate a pipeline schedule and print its timeline and bubble", RunPipeline},
    {"prep", "train a tokenizer on text files and write token shards (fortunes by default)",
     RunPrep},
    {"train", "train a model from a config (one rank, or many under mpirun)", RunTrain},
    {"eval", "validation loss, perplexity and routing statistics of a checkpoint", RunEval},
    {"moe-layer", "forward and backward of one MoE layer on tensors from a file", RunMoELayer},
    {"route", "each token's experts, gates and drops in every MoE layer for a text", RunRoute},
    {"export", "write a checkpoint as a Hugging Face MixtralForCausalLM directory", RunExport},
    {"import", "a Hugging Face MixtralForCausalLM directory as a checkpoint", RunImport},
    {"upcycle", "a checkpoint's MLPs copied into the experts of a new MoE model (step 0)",
     RunUpcycle},
    {"report", "an HTML page of runs' losses and expert load over the steps", RunReport},
    {"checkpoint", "verify a checkpoint's checksums, step and values without a model",
     RunCheckpoint},
};

const Command* FindCommand(std::string_view name) {
  for (const Command& command : kCommands) {
    if (command.name == name) return &command;
  }
  return nullptr;
}

void PrintUsage() {
  std::printf("usage: switchyard <command> [flags]\n\n"
              "Switchyard, a Mixture-of-Experts training engine. Run one rank as\n"
              "`switchyard <command>` and several as `mpirun -np N switchyard <command>`.\n\n"
              "commands:\n");
  for (const Command& command : kCommands) {
    std::printf("  %-10.*s %.*s\n", static_cast<int>(command.name.size()), command.name.data(),
                static_cast<int>(command.summary.size()), command.summary.data());
  }
  std::printf("\n`switchyard <command> --help` describes a command's flags.\n");
}

int Main(int argc, char** argv) {
  // A write past a file-size limit (ulimit -f) fails with EFBIG and goes through the
  // writer's error path (one line, a failed save's temporary removed) instead of SIGXFSZ
  // killing the process with nothing said (docs/failures.md).
  std::signal(SIGXFSZ, SIG_IGN);
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    return UsageError("switchyard", "no command given; run `switchyard --help` for the list");
  }
  const std::string& name = args[0];
  if (name == "--help" || name == "-h" || name == "help") {
    if (name == "help" && args.size() > 1) {
      const Command* command = FindCommand(args[1]);
      if (command == nullptr) {
        return UsageError("switchyard", "unknown command \"" + args[1] +
                                            "\"; run `switchyard --help` for the list");
      }
      return command->run({"--help"});
    }
    PrintUsage();
    return kExitOk;
  }
  const Command* command = FindCommand(name);
  if (command == nullptr) {
    return UsageError("switchyard",
                      "unknown command \"" + name + "\"; run `switchyard --help` for the list");
  }
  if (Status s = CheckThreadsEnv(); !s.ok()) {
    return UsageError("switchyard " + name, std::string(s.message()));
  }
  // SWITCHYARD_MPI is read when a command starts MPI; checked here for every command, also
  // those that never start it (mesh, plan, pipeline, report, checkpoint).
  const auto env = [](const char* key) -> const char* { return std::getenv(key); };
  if (StatusOr<bool> mpi = dist::ShouldStartMpi(dist::MpiStart::kIfLaunched, env); !mpi.ok()) {
    return UsageError("switchyard " + name, std::string(mpi.status().message()));
  }
  // A failed allocation outside the tensor allocator (a vector, a parsed file) is one line
  // and exit 5 like the allocator's own, not std::terminate's abort (a thread the system
  // refuses is too, where it is started: ExitNoThread).
  try {
    return command->run(std::vector<std::string>(args.begin() + 1, args.end()));
  } catch (const std::bad_alloc&) {
    ExitHostOutOfMemory(name.c_str());
  }
}

}  // namespace
}  // namespace switchyard::cli

int main(int argc, char** argv) { return switchyard::cli::Main(argc, argv); }
