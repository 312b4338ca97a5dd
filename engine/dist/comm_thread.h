// CommThread: uneven all-to-alls that move while the caller computes.
//
// MPI moves the bytes of a nonblocking collective only inside MPI calls (Open MPI has no
// progress thread for shared memory or TCP), and on the CPU nobody calls MPI while the
// caller runs a GEMM: an MPI_Ialltoallv posted before a GEMM mostly moves in its Wait. A
// CommThread runs the exchanges posted to it on a thread of its own, one after another in
// posting order, each as the communicator's blocking AllToAllV, so they progress while the
// posting thread computes. That takes MPI_THREAD_MULTIPLE (the posting thread may run other
// collectives meanwhile, e.g. over etp); without it, and for communicators that are not host
// MPI ones (a size-1 local group does no communication; NCCL orders its work on a stream),
// Post falls back to the communicator's own AllToAllVAsync.
//
// Rules: every rank of the group posts the same exchanges in the same order; while any is
// in flight the posting thread must not use the same communicator itself (the thread does);
// the tensors are handles kept alive by the work, and reading `out` or writing `in` before
// Wait is a race. The thread's collectives are not followed by the collective watchdog
// (watchdog.h); the Wait of each exchange is, under the name all_to_all_v.
//
// Timing (for `switchyard train --profile`, engine/core/profile.h): each exchange knows how
// long it ran on the thread (seconds) and how long the posting thread blocked in Wait for
// it (exposed); the rest of its time ran while the caller did other work (hidden). In the
// fallback the bytes move inside Wait, so seconds = exposed.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "engine/dist/communicator.h"

namespace switchyard::dist {

// The Work of one posted exchange, with its timing.
class TimedWork : public Work {
 public:
  // Seconds the exchange ran, and of them the seconds the caller waited in Wait; both
  // final once Wait has returned.
  virtual double seconds() const = 0;
  virtual double exposed_seconds() const = 0;
};

class CommThread {
 public:
  // comm: the group the exchanges run over (kept by pointer). Starts the thread when MPI
  // allows it and comm is a host MPI communicator of more than one rank.
  explicit CommThread(Communicator& comm);
  // Waits for everything posted, then stops the thread.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Whether exchanges run on the thread (else they are the communicator's async ones).
  bool threaded() const { return thread_.joinable(); }
  Communicator& comm() const { return *comm_; }

  // Posts Communicator::AllToAllV(in, send_rows, out, recv_rows) (the same arguments and
  // checks) and returns at once.
  std::unique_ptr<TimedWork> AllToAllV(const Tensor& in, std::span<const int64_t> send_rows,
                                       Tensor& out, std::span<const int64_t> recv_rows);

  struct Job;  // one posted exchange (comm_thread.cc)

 private:
  void Run();

  Communicator* comm_;
  uint64_t seq_ = 0;  // exchanges posted, for the watchdog's name of a Wait
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace switchyard::dist
