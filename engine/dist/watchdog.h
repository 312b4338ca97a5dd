// The collective watchdog (train.collective_timeout_s; docs/failures.md "Stalled ranks"):
// a rank whose blocking collective has not completed within the timeout (a peer stopped,
// hung or deadlocked in another collective) prints one line naming the collective, its
// group and the ranks that have not arrived, and exits with status 4; mpirun then ends the
// job. Like NCCL's watchdog, the default timeout is generous.
//
// Each MPI collective marks itself with a WatchdogScope (two clock reads and a few stores
// on the calling thread; the operation itself is unchanged, so results are bit-identical
// with or without the watchdog). A background thread checks the mark every 100 ms. On a
// timeout it asks every other rank, over a communicator of its own, which collective it is
// in (each rank stuck in a collective answers once its own watchdog fires; a stopped or
// busy rank does not), waits up to min(timeout, 10 s) for the answers, and reports:
//
//   switchyard: rank 0: all_reduce #523 on group of world ranks [0 1 2 3] did not complete
//   within 5 s; not arrived: rank 1 (no answer); waiting in it too: ranks 2 3
//
// A rank that answers from a different collective is named with it ("rank 3 is in
// all_to_all_v #12 on [2 3]"). Without MPI_THREAD_MULTIPLE the line names the collective
// and the group only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace switchyard::dist {

// Starts the watchdog thread with `timeout_s` (> 0) for this process, or changes its
// timeout; timeout_s <= 0 stops it. Collective over MPI_COMM_WORLD the first time it
// starts (it duplicates the world for its questions). A no-op without MPI or on one rank.
void StartCollectiveWatchdog(double timeout_s);
void StopCollectiveWatchdog();

// Marks a blocking collective of this thread for its lifetime: `op` ("all_reduce"), a
// sequence number counted per communicator, and the group's world ranks. A point-to-point
// wait (send, recv) names the world ranks it waits on in `peers`: the report's "not
// arrived" is then those ranks alone (empty: every rank of the group).
class WatchdogScope {
 public:
  WatchdogScope(const char* op, uint64_t seq, const std::vector<int>& group,
                const std::vector<int>& peers = {});
  ~WatchdogScope();
  WatchdogScope(const WatchdogScope&) = delete;
  WatchdogScope& operator=(const WatchdogScope&) = delete;

 private:
  bool active_ = false;
};

// Marks the calling thread, for the rest of its life, as one whose collectives the watchdog
// does not follow: a communication thread (comm_thread.h), whose exchanges the thread
// waiting for them marks instead. The watchdog follows one thread's collectives.
void UnwatchThisThread();

// What the calling thread is doing, for the watchdog's report of a wait inside it (e.g. the
// pipeline runner: "pipeline stage 0 (world rank 0) waits for stage 1 (world rank 1)"),
// for its lifetime; the previous note comes back when it ends.
class WatchdogNote {
 public:
  explicit WatchdogNote(std::string note);
  ~WatchdogNote();
  WatchdogNote(const WatchdogNote&) = delete;
  WatchdogNote& operator=(const WatchdogNote&) = delete;

 private:
  std::string previous_;
};

// What world rank `world_rank` is, for the watchdog's reports naming it as not arrived:
// "rank 1 [pipeline stage 1]" (the pipeline runner names the ranks of its group).
void NameRankForWatchdog(int world_rank, std::string what);

// "all_reduce #523 on [0 1 2 3]": what a rank answers and reports.
std::string DescribeCollective(const char* op, uint64_t seq, const std::vector<int>& group);

}  // namespace switchyard::dist
