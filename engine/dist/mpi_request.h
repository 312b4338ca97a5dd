// Internal to the MPI backend (mpi_communicator.cc, mpi_p2p.cc): the Work of a posted MPI
// operation, which keeps its tensors and count arrays alive until it completes, and the
// small helpers both files use.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/check.h"
#include "engine/dist/mpi_check.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/dist/watchdog.h"

namespace switchyard::dist {
namespace internal {

// n as an MPI count, which is an int.
inline int ToCount(int64_t n, std::string_view what) {
  SY_CHECK(n >= 0 && n <= INT_MAX) << what << " of " << n << " does not fit an MPI count";
  return static_cast<int>(n);
}

// Whether MPI_Finalize has run (nothing may be waited on or freed after it).
inline bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

}  // namespace internal

// The MPI requests of one collective, the tensors and count arrays they use (kept alive
// until completion), and what runs once they complete (the kAvg division).
class MpiCommunicator::Request final : public Work {
 public:
  ~Request() override {
    if (!done_ && !internal::MpiFinalized()) Wait();
  }

  void Wait() override {
    if (done_) return;
    std::vector<MPI_Status> statuses(requests_.size());
    if (!requests_.empty()) {
      const WatchdogScope watch(op_, seq_, group_, peers_);
      SY_MPI_CHECK(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(),
                               statuses.data()));
    }
    Finish(statuses);
  }

  // MPI_Testall: completes the op (as Wait does) once every request has.
  bool Test() override {
    if (done_) return true;
    std::vector<MPI_Status> statuses(requests_.size());
    if (!requests_.empty()) {
      int flag = 0;
      SY_MPI_CHECK(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                               statuses.data()));
      if (flag == 0) return false;
    }
    Finish(statuses);
    return true;
  }

  // A slot for the next non-blocking call's request.
  MPI_Request* NewRequest() {
    requests_.push_back(MPI_REQUEST_NULL);
    return &requests_.back();
  }
  void Keep(const Tensor& t) { tensors_.push_back(t); }
  // The last request is a receive of `rows` rows of `type` into t: Wait checks its count.
  void ExpectRows(const Tensor& t, int rows, MPI_Datatype type, int peer) {
    receives_.push_back({requests_.size() - 1, rows, type, peer, t});
  }
  // An int array that must outlive the requests.
  std::vector<int>& Counts(size_t n) {
    counts_.emplace_back(n, 0);
    return counts_.back();
  }
  void OnDone(std::function<void()> finish) { finish_ = std::move(finish); }
  // What the watchdog names while Wait blocks.
  // peers: the world ranks a point-to-point request waits on (empty: the group).
  void Label(const char* op, uint64_t seq, const std::vector<int>& group,
             std::vector<int> peers = {}) {
    op_ = op;
    seq_ = seq;
    group_ = group;
    peers_ = std::move(peers);
  }

 private:
  // After every request completed: checks the receives' lengths, runs what follows (the
  // kAvg division) and drops the tensors.
  void Finish(const std::vector<MPI_Status>& statuses) {
    for (const Receive& r : receives_) {
      int received = 0;
      SY_MPI_CHECK(MPI_Get_count(&statuses[r.index], r.type, &received));
      SY_CHECK_EQ(received, r.rows) << "Recv into " << r.tensor.DebugString() << " from rank "
                                    << r.peer << ": the message is shorter (or not whole rows)";
    }
    if (finish_) finish_();
    done_ = true;
    requests_.clear();
    receives_.clear();
    tensors_.clear();
    counts_.clear();
    finish_ = nullptr;
  }

  struct Receive {
    size_t index;  // into requests_
    int rows;
    MPI_Datatype type;
    int peer;
    Tensor tensor;
  };

  bool done_ = false;
  const char* op_ = "request";
  uint64_t seq_ = 0;
  std::vector<int> group_;
  std::vector<int> peers_;
  std::vector<MPI_Request> requests_;
  std::vector<Receive> receives_;
  std::vector<Tensor> tensors_;
  std::deque<std::vector<int>> counts_;  // a deque: Counts() references stay valid
  std::function<void()> finish_;
};

}  // namespace switchyard::dist
