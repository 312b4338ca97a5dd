// The sweep every benchmark runs; see benchmark.h.
#include "benchmarks/benchmark.h"

#include <cstdio>

namespace switchyard::bench {
namespace {

// The exit status of a Setup or RunCase that failed (benchmark.h).
int Stop(Harness& h, const Status& status) {
  if (absl::IsUnavailable(status)) {
    std::fprintf(stderr, "%s: %s\n", h.program().c_str(), Message(status).c_str());
    return cli::kExitUsage;
  }
  return h.Fail(Message(status));
}

}  // namespace

int RunBenchmark(Harness& harness, Benchmark& benchmark, int argc, char** argv) {
  benchmark.AddFlags(harness.flags());
  if (auto code = harness.Start(argc, argv)) return *code;
  if (Status s = benchmark.Setup(harness); !s.ok()) return Stop(harness, s);
  Table table = benchmark.MakeTable(harness);
  table.PrintHeader();
  int64_t wrong = 0;
  for (int i = 0; i < benchmark.NumCases(); ++i) {
    StatusOr<int64_t> case_wrong = benchmark.RunCase(harness, i, table);
    if (!case_wrong.ok()) return Stop(harness, case_wrong.status());
    wrong += *case_wrong;
  }
  benchmark.Conclude(harness, table);
  return harness.Finish(table, wrong, benchmark.Extra(harness));
}

}  // namespace switchyard::bench
