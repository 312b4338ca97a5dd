// Pieces shared by the subcommands that run under mpirun (train, eval, moe-layer, route,
// upcycle, import, export, prep).
#pragma once

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/core/status.h"
#include "engine/data/tokenizer.h"
#include "engine/dist/communicator.h"

namespace switchyard::cli {

// Removes every "--set X" / "--set=X" from args and returns the X's in order (config
// overrides "section.key=value"); FlagSet does not take repeated flags.
StatusOr<std::vector<std::string>> TakeOverrides(std::vector<std::string>& args);

// Collective over `world`: returns kExitOk when every rank's `status` is OK; otherwise
// every rank returns the exit code of the lowest failing rank, which alone prints
// "<command>: error: <message>" (so a multi-rank failure is one line and no rank hangs
// in a later collective). code: kExitFailure or kExitUsage.
int Agree(dist::Communicator& world, const Status& status, int code, const std::string& command);

// Starts the process (MPI under mpirun), checks that every rank got the same command line
// (CheckSameArgs: else exit kExitUsage on every rank, one line from the rank that differs),
// runs `run(args)`, finalizes, and returns its exit code; a failed start is one error line
// and kExitFailure (kExitUsage for a bad SWITCHYARD_MPI). Every communicator `run` made
// must be gone when it returns.
int RunInProcess(const std::string& command, int (*run)(const std::vector<std::string>&),
                 const std::vector<std::string>& args);

// OK when `out` does not exist or is an empty directory; otherwise one error naming it
// (the commands that write a new checkpoint or export overwrite nothing).
Status CheckFreshOutput(const std::string& out);

// OK when `path` (the value of --`flag`) can be created as a file: not a directory, in a
// directory that exists and may be written. Otherwise NotFound naming the flag, the path and
// the system's reason ("--out /nonexistent/o.st: cannot create it (/nonexistent: No such
// file or directory)"), so that a command says so before its work, not on its temporary file.
Status CheckOutputFile(const std::string& flag, const std::string& path);

// OK when this rank loaded the config rank 0 did (ToYaml's text: every key after the
// overrides); else the first key that differs, with both values. Ranks launched with different
// configs (an MPMD launch, a node with another copy of the file) would otherwise end in a
// collective's size mismatch or train different models in one job. Collective over world.
Status CheckSameConfig(dist::Communicator& world, const config::Config& config);

// OK when this rank was launched with the command line rank 0 was (`command` and `args`,
// word for word); else InvalidArgument naming the first argument that differs, with both
// values ("rank 1's command line differs from rank 0's: argument 3 is '--verify' here,
// absent on rank 0 (...)"). Ranks given other flags (an MPMD launch, a wrapper that adds
// flags on some ranks) would otherwise abort in a collective (a size mismatch) or, worse,
// mix two inputs into one answer. Collective over world.
Status CheckSameArgs(dist::Communicator& world, const std::string& command,
                     const std::vector<std::string>& args);

// Prints "<command>: error: <message>" to stderr.
void PrintError(const std::string& command, const std::string& message);

// --data `data` against the data a checkpoint was trained on (`trained`, its config's data
// dir): shards cut by another tokenizer hold other token ids, and the loss or routing of them
// means nothing. Compared when both folders hold a tokenizer.model; when the trained data is
// gone (or the config names none) there is nothing to compare and --data is taken as it is.
Status CheckSameTokenizer(const std::string& trained, const std::string& data);

// The tokenizer of data folder `dir`, refused (naming both) when it has more pieces than the
// model's vocabulary: its larger ids would index past the embedding table.
StatusOr<data::Tokenizer> LoadDataTokenizer(const std::string& dir, int64_t model_vocab);

}  // namespace switchyard::cli
