// The gtest main of every multi-rank test (linked by sy_dist_test, run under mpirun).
// Rank 0 prints gtest's usual output; every other rank prints only its failures, each
// line prefixed with "[rank r]". The exit status is non-zero on every rank when any rank
// failed, and rank 0 names the ranks that did.
//
// A test must run the same collectives on every rank whatever its checks find: use
// EXPECT_*, not ASSERT_*, between collectives, or one rank returns early and the others
// wait for it forever.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/check.h"
#include "engine/dist/process.h"

#ifdef SY_HAVE_MPI
#include <mpi.h>
#endif

namespace {

using switchyard::dist::WorldRank;
using switchyard::dist::WorldSize;

// Prints failed assertions of this rank to stderr, prefixed with the rank.
class RankFailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  // Remembered here: UnitTest::current_test_info() would deadlock inside
  // OnTestPartResult (gtest holds its mutex while reporting a result).
  void OnTestStart(const testing::TestInfo& test) override {
    test_ = std::string(test.test_suite_name()) + "." + test.name();
  }
  void OnTestEnd(const testing::TestInfo&) override { test_ = "(outside a test)"; }

  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::ostringstream out;
    out << "[rank " << rank_ << "] " << test_ << " "
        << (result.file_name() ? result.file_name() : "?") << ":" << result.line_number()
        << ": Failure\n";
    std::istringstream lines(result.message());
    for (std::string line; std::getline(lines, line);) {
      out << "[rank " << rank_ << "]   " << line << "\n";
    }
    const std::string text = out.str();
    std::fwrite(text.data(), 1, text.size(), stderr);
    std::fflush(stderr);
  }

 private:
  int rank_;
  std::string test_ = "(outside a test)";
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  SY_CHECK_OK(switchyard::dist::InitProcess(&argc, &argv));
  const int rank = WorldRank();
  const int size = WorldSize();

  testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  } else {
    std::printf("[ dist     ] %d rank%s\n", size, size == 1 ? "" : "s");
  }

  const int local_failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = local_failed;
#ifdef SY_HAVE_MPI
  std::vector<int> failed(size, 0);
  MPI_Gather(&local_failed, 1, MPI_INT, failed.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Allreduce(&local_failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed) {
    std::ostringstream out;
    out << "[ dist     ] FAILED on rank(s):";
    for (int r = 0; r < size; ++r) {
      if (failed[r]) out << ' ' << r;
    }
    std::printf("%s\n", out.str().c_str());
  }
#endif
  std::fflush(stdout);
  switchyard::dist::FinalizeProcess();
  return any_failed;
}
