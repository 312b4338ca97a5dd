// The benchmark harness, in the style of nccl-tests: one place for the arguments, warm-up,
// timing, the correctness count, the table and the JSON. The sweep itself (setup, the
// cases, their rows, the summary) is RunBenchmark's (benchmark.h); a benchmark file only
// describes its cases, its byte count or FLOPs, its expected output and its call:
//
//   class AllToAllPerf final : public Benchmark {
//     void AddFlags(cli::FlagSet& flags) override;   // --skew, --hidden, ...
//     Status Setup(Harness& h) override;             // checks them, prints the setting
//     Table MakeTable(Harness& h) override {         // size count type .. | time algbw
//       return h.StandardTable(left, right);         //   busbw #wrong | right ...
//     }
//     int NumCases() const override;                 // the sizes swept
//     StatusOr<int64_t> RunCase(Harness& h, int i, Table& table) override;
//   };                                               //   h.TimeInterleaved, h.Check, AddRow
//
// Conventions every benchmark shares (benchmarks/README.md states them for users):
//  - time: seconds per call after -w warm-up calls; the -n timed calls run in 5 blocks,
//    each block's mean is taken on the slowest rank (the slowest rank bounds a
//    collective), and the figure is the median block; printed in microseconds.
//  - algbw = bytes / time; busbw = algbw * (benchmark factor), GB/s = 1e9 bytes/s.
//  - #wrong: elements that differ from the expected output, summed over ranks (with
//    --check 1); any wrong value makes the run FAILED and the exit status 1.
//  - Every rank runs the same code; rank 0 prints and writes the JSON.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "engine/cli/args.h"
#include "engine/core/dtype.h"
#include "engine/dist/communicator.h"

namespace switchyard::bench {

// Seconds on a monotonic clock.
double Now();

// A Status's message as a std::string (Debian's abseil has its own string_view).
inline std::string Message(const Status& s) {
  return std::string(s.message().data(), s.message().size());
}

// "1M" -> 1048576: an integer with an optional K, M or G (powers of 1024, an optional
// trailing B), as nccl-tests reads -b and -e.
StatusOr<int64_t> ParseBytes(const std::string& text);
// A finite floating value of a flag ("--skew 1.2").
StatusOr<double> ParseDouble(const std::string& flag, const std::string& text);
// nccl-tests' names ("float", "int32", "half", ...) and ours ("f32", ...) -> DType.
StatusOr<DType> ParseBenchDType(const std::string& name);
// The nccl-tests name of a dtype: "float", "bfloat16", "half", "int32", "int64", "uint8".
std::string BenchDTypeName(DType dtype);
// "a,b,c" -> {"a", "b", "c"}; "" -> {} (list flags: --seq_lens, --schedules, --set).
std::vector<std::string> SplitList(const std::string& text);

// Raw MPI's all-to-all-v arguments for rows of `row_elements` elements: element counts per
// peer and their displacements, as a plain MPI program passes them.
struct ElementSplits {
  std::vector<int> counts, displs;
};
ElementSplits ToElementSplits(const std::vector<int64_t>& rows, int64_t row_elements);

// Which common flags a benchmark takes.
struct Features {
  bool sweep = false;  // -b/--minbytes, -e/--maxbytes, -f/--stepfactor
  bool dtype = false;  // -d/--datatype
};

// The common options after parsing.
struct CommonOptions {
  int64_t min_bytes = 1 << 20;   // -b
  int64_t max_bytes = 64 << 20;  // -e
  int step_factor = 2;           // -f: sizes min, min*f, min*f^2, ... <= max
  int iters = 20;                // -n: timed calls per measurement
  int warmup = 5;                // -w: untimed calls before them
  DType dtype = DType::kF32;     // -d
  int check = 1;                 // -c/--check: 1 verifies the output and counts #wrong
  std::string json;              // --json FILE: rank 0 writes the results there
  std::string device = "cpu";    // --device cpu|cuda
  int threads = 0;               // --threads: compute threads per rank (engine/core/thread_pool.h); 0 keeps the default
};

// One cell of a table: an integer, a number printed with the column's precision, or text.
using Cell = std::variant<int64_t, double, std::string>;

struct Column {
  std::string name;   // header and JSON key
  std::string unit;   // second header line, e.g. "(us)"; may be empty
  int width = 10;     // printed width
  int precision = 2;  // digits after the point for doubles
};

// A table printed row by row as results arrive (on the printing rank only) and kept for
// the JSON output. Groups of columns are separated by a blank column, as in nccl-tests.
class Table {
 public:
  // groups: the column groups, left to right (empty groups are skipped).
  Table(std::vector<std::vector<Column>> groups, bool print);

  void PrintHeader() const;
  // cells: one per column, in order.
  void AddRow(std::vector<Cell> cells);
  // The mean of a double column over the rows (0 without rows); used for the average
  // bus bandwidth.
  double Mean(const std::string& column) const;
  // [{column: value, ...}, ...].
  nlohmann::json Rows() const;
  const std::vector<Column>& columns() const { return columns_; }

 private:
  std::vector<Column> columns_;
  std::vector<size_t> group_starts_;
  std::vector<std::vector<Cell>> rows_;
  bool print_;
};

class Harness {
 public:
  Harness(std::string program, std::string summary, Features features);
  ~Harness();

  // Declare the benchmark's own flags here before Start.
  cli::FlagSet& flags() { return *flags_; }

  // Initialises the process (MPI), parses the command line (nccl-tests' short flags -b -e
  // -f -n -w -d -c are accepted beside the long ones), opens the world communicator and,
  // on rank 0, prints the command and the run's setting. Returns an exit status when the
  // program should stop now (--help, a bad flag, --device cuda).
  std::optional<int> Start(int argc, char** argv);
  // A user error found after Start (a bad shape): prints it on rank 0; returns kExitUsage.
  int Fail(const std::string& message);
  // printf on the printing rank (rank 0), flushed; nothing on the others.
  void Printf(const char* format, ...) __attribute__((format(printf, 2, 3)));

  const CommonOptions& options() const { return options_; }
  dist::Communicator& world() { return *world_; }
  int rank() const { return world_->rank(); }
  int ranks() const { return world_->size(); }
  bool printing() const { return world_->rank() == 0; }
  const std::string& program() const { return program_; }

  // The swept sizes in bytes: min, min*f, ... up to max (one size when f <= 1 or min ==
  // max).
  std::vector<int64_t> Sizes() const;

  // The table with nccl-tests' columns
  //   size count type <left...> | time algbw busbw #wrong | <right...>.
  Table StandardTable(std::vector<Column> left, std::vector<Column> right) const;

  // Runs each op -w times, then -n times in `blocks` interleaved blocks (op 0's share,
  // op 1's share, ..., repeated), so that ops compared in one run see the same machine
  // load. Ranks synchronise before every block. Returns, for each op, the median over
  // blocks of the block's mean seconds per call on the slowest rank (the median keeps one
  // disturbed block on a shared machine from deciding the figure).
  std::vector<double> TimeInterleaved(const std::vector<std::function<void()>>& ops,
                                      int blocks = 5);
  // One op: TimeInterleaved({op})[0].
  double Time(const std::function<void()>& op);
  // For loops timed by hand (phases, forward and backward halves): call(false) -w times,
  // then call(true) -n times, each call after a barrier of the world; the timed calls
  // record their own seconds (MedianOfMax reduces them).
  void Repeat(const std::function<void(bool timed)>& call);

  // The #wrong of a check: 0 with --check 0, else count() (run on every rank) summed over
  // the ranks.
  int64_t Check(const std::function<int64_t()>& count);

  // Reductions over the world (every rank gets the result).
  double Max(double v);
  // The median over iterations of the slowest rank's time: per_iter[i] is this rank's
  // seconds for iteration i (the same count on every rank). For loops timed by hand.
  double MedianOfMax(const std::vector<double>& per_iter);
  double Sum(double v);
  int64_t Sum(int64_t v);

  // Prints "# Out of bounds values : N OK|FAILED" and "# Avg bus bandwidth : X" (the
  // mean of the table's busbw column when it has one), writes --json (the table, the
  // options and `extra`), and returns the exit status: 0, or 1 when any value was wrong.
  int Finish(const Table& table, int64_t wrong, nlohmann::json extra = nlohmann::json::object());

 private:
  std::string program_, summary_;
  Features features_;
  std::unique_ptr<cli::FlagSet> flags_;
  CommonOptions options_;
  std::string min_text_ = "1M", max_text_ = "64M", dtype_text_ = "float";
  std::string command_line_;
  std::unique_ptr<dist::Communicator> world_;
  bool started_ = false;
};

// The op that measures the machine's fp32 matrix peak: one n x n x n OpenBLAS sgemm
// (2 n^3 FLOPs) on buffers the returned callable owns. Time it beside the work it is
// compared with (Harness::TimeInterleaved), on every rank at once, so that both see the
// same load and the same sharing of the cores.
std::function<void()> MakeSgemmOp(int64_t n = 2048);

}  // namespace switchyard::bench
