// The sweep every benchmark runs, owned by the harness (nccl-tests' struct testColl and
// TimeTest). A benchmark describes itself: its flags, the cases it sweeps (sizes, sequence
// lengths, ZeRO stages, layouts), its table, and per case the call it times, the analytic
// volume or bandwidth formula and the check. RunBenchmark does the rest, in one order:
//
//   Harness::Start      flags, MPI, the "# program: ..." and "# command: ..." lines
//   Setup               checks the flags, prepares what every case shares; may print the
//                       lines above the table (Harness::Printf)
//   MakeTable           the columns; RunBenchmark prints the header
//   RunCase(0..n-1)     measures and checks one case, adds its rows (printed as they come)
//   Conclude            rows or lines below the last case, clean-up
//   Harness::Finish     "# Out of bounds values", "# Avg bus bandwidth", --json, exit status
//
//   class AllToAllPerf final : public Benchmark { ... };
//   int main(int argc, char** argv) {
//     return RunBenchmark<AllToAllPerf>(argc, argv, "alltoall_perf", "...", {.sweep = true});
//   }
//
// A non-OK Status from Setup or RunCase is the user's error (a bad flag or shape, a config
// that does not load): rank 0 prints "<program>: error: <message>" and the exit status is 2.
// kUnavailable is for a machine that cannot run the benchmark at all (no GPU): every rank
// prints "<program>: <message>", exit status 2.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "benchmarks/harness.h"
#include "engine/cli/args.h"
#include "engine/core/status.h"

namespace switchyard::bench {

// What one benchmark supplies to RunBenchmark.
class Benchmark {
 public:
  virtual ~Benchmark() = default;

  // Declares the benchmark's own flags (before the command line is parsed).
  virtual void AddFlags(cli::FlagSet& flags) = 0;
  // Checks the flags and prepares what every case shares, on every rank (collective
  // calls are allowed); may print the lines above the table.
  virtual Status Setup(Harness& h) { return OkStatus(); }
  // The table the cases fill (Harness::StandardTable for nccl-tests' columns).
  virtual Table MakeTable(Harness& h) = 0;
  // How many cases RunCase is called for (after Setup).
  virtual int NumCases() const { return 1; }
  // Measures case `index`, checks it and adds its rows to `table`; returns its #wrong,
  // summed over ranks.
  virtual StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) = 0;
  // After the last case: summary rows, the lines below the table, clean-up.
  virtual void Conclude(Harness& h, Table& table) {}
  // The JSON fields written beside the table's (Harness::Finish's `extra`).
  virtual nlohmann::json Extra(const Harness& h) const { return nlohmann::json::object(); }
};

// Runs `benchmark` as the program (see the file comment); returns the exit status.
// `harness` must outlive nothing of the benchmark's: declare it first.
int RunBenchmark(Harness& harness, Benchmark& benchmark, int argc, char** argv);

// The program's main: a harness named `program` taking the common flags of `features`,
// and a B made after it and destroyed before it (B's communicators go before MPI ends).
template <typename B>
int RunBenchmark(int argc, char** argv, std::string program, std::string summary,
                 Features features = {}) {
  Harness harness(std::move(program), std::move(summary), features);
  B benchmark;
  return RunBenchmark(harness, benchmark, argc, argv);
}

}  // namespace switchyard::bench
