// A small flag parser shared by the subcommands: "--name value" and "--name=value",
// integer, string and boolean (no value) flags, required flags, and a usage text built
// from the declarations. Errors are one line naming the flag and the value.
//
//   FlagSet flags("switchyard mesh", "Prints the process groups of a layout.");
//   int world = 0;
//   flags.AddInt("world", &world, "number of ranks", /*required=*/true);
//   if (Status s = flags.Parse(args); !s.ok()) ...
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/status.h"

namespace switchyard::cli {

// Exit statuses of every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the command ran and failed
inline constexpr int kExitUsage = 2;    // bad flags or an impossible request
// `switchyard train` (docs/failures.md): a non-finite loss or gradient norm stopped
// training (train.on_nonfinite), nothing new saved.
inline constexpr int kExitNonFinite = 3;
// A collective did not complete within train.collective_timeout_s (the watchdog).
inline constexpr int kExitCollectiveTimeout = 4;
// A device could not serve an allocation (engine/core/allocator.h, ExitOutOfMemory).
inline constexpr int kExitOutOfMemory = ::switchyard::kExitOutOfMemory;
// Stopped by SIGTERM/SIGINT after its checkpoint was saved: requeue and --resume
// (sysexits' EX_TEMPFAIL, "try again later").
inline constexpr int kExitPreempted = 75;

// The most ranks `mesh --world`, `plan --gpus` and `train --dry-run --world` take: 2^17 =
// 131072, above the largest training jobs run so far (about 100k GPUs) and still planned in
// seconds (they walk every rank: `train --dry-run --world 131072` takes about 7 s on one core).
inline constexpr int kMaxWorld = 1 << 17;

// "--NAME=VALUE must be between 1 and kMaxWorld (...)" when value is outside that range.
Status CheckWorldFlag(std::string_view name, int value);

class FlagSet {
 public:
  // `command` prefixes messages ("switchyard mesh"); `summary` heads the usage text.
  FlagSet(std::string command, std::string summary);

  // Declares --name. The pointee keeps its value (the default) unless the flag is given.
  void AddInt(std::string name, int* value, std::string help, bool required = false);
  void AddString(std::string name, std::string* value, std::string help, bool required = false);
  // A string naming a file or directory: an empty value ("--out ''") is an error.
  void AddPath(std::string name, std::string* value, std::string help, bool required = false);
  // A switch: "--name" sets *value to true; it takes no value.
  void AddBool(std::string name, bool* value, std::string help);

  // Parses `args` (without the program and subcommand names). "--help" / "-h" sets
  // help_requested() and stops. Errors: unknown flag, missing value, a value that is not an
  // integer, a value given to a switch, an empty path, a flag given twice (each is
  // single-valued; `--set` is taken out before, by TakeOverrides), a positional argument, a
  // missing required flag.
  Status Parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_requested_; }
  // Whether --name appeared on the command line.
  bool IsSet(std::string_view name) const;
  // "usage: switchyard mesh --world N [--tp N] ...", the summary and one line per flag.
  std::string Usage() const;

 private:
  enum class Kind { kInt, kString, kPath, kBool };
  struct Flag {
    std::string name;
    Kind kind;
    void* value;
    std::string help;
    bool required;
    bool set = false;
  };

  Flag* Find(std::string_view name);
  Status Assign(Flag& flag, const std::string& value);

  std::string command_;
  std::string summary_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

// Prints "<command>: error: <message>" as one line to stderr and returns kExitUsage.
int UsageError(std::string_view command, std::string_view message);

}  // namespace switchyard::cli
