// Communicator: the collectives of one process group, one object per group and process.
// Backends: MPI for host tensors (mpi_communicator.h), NCCL for device tensors
// (nccl_communicator.h), and the size-1 local communicator below that every build has.
//
// Rules shared by every backend:
//  - Every rank of the group calls the same collectives in the same order.
//  - Tensors are contiguous; "rows" are indices of dim 0, a row is row_size() elements.
//    A 0-d tensor is one row of one element.
//  - A shape or dtype mismatch between the arguments is a programming error (SY_CHECK
//    naming the shapes); so is a tensor on another device than the communicator's.
//  - Ops on device tensors are ordered on the caller's DeviceContext stream: a
//    "synchronous" op returns when the work is queued and later work on that stream sees
//    its result. Ops on host tensors are complete when they return.
//  - A group of size 1 does no communication (it copies `in` to `out` where they differ).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/tensor.h"

namespace switchyard {
class DeviceContext;
}

namespace switchyard::dist {

// How AllReduce / ReduceScatter combine the ranks' values. kAvg is the sum divided by the
// group size and is only defined for floating dtypes.
enum class ReduceOp { kSum, kAvg, kMax, kMin };

// "sum", "avg", "max", "min".
std::string_view ReduceOpName(ReduceOp op);

// The handle of an asynchronous collective. The op's tensors stay alive (the Work holds
// their handles) until it completes; reading or writing them before Wait is a race.
class Work {
 public:
  virtual ~Work();
  // Completes the op (for kAvg including the division): for host tensors the result is
  // then in place; for device tensors later work on the caller's stream is ordered after
  // it. Idempotent. A Work destroyed without Wait waits in its destructor.
  virtual void Wait() = 0;
};

// A Work that is already complete (for groups of size 1).
std::unique_ptr<Work> CompletedWork();

class Communicator {
 public:
  virtual ~Communicator();

  // This process's rank in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // world_ranks()[i] is the world rank of group member i.
  virtual std::vector<int> world_ranks() const = 0;
  // Where this communicator's tensors live.
  virtual Device device() const = 0;
  // "local", "mpi" or "nccl".
  virtual std::string_view backend() const = 0;

  // t: any shape; every rank's t becomes the elementwise reduction over the group.
  virtual void AllReduce(Tensor& t, ReduceOp op) = 0;
  // in: (n, ...) -> out: (size*n, ...), rank r's rows at [r*n, (r+1)*n).
  virtual void AllGather(const Tensor& in, Tensor& out) = 0;
  // in: (size*n, ...) -> out: (n, ...), the reduction of rows [rank*n, (rank+1)*n) of
  // every rank's in. out must not overlap in.
  virtual void ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) = 0;
  // in: (size*n, ...) -> out: (size*n, ...): rows [d*n, (d+1)*n) of in go to rank d, and
  // out's rows [s*n, (s+1)*n) come from rank s. out must not overlap in.
  virtual void AllToAll(const Tensor& in, Tensor& out) = 0;
  // Uneven all-to-all. send_rows[d] rows of in (consecutive, in rank order of d) go to
  // rank d; recv_rows[s] rows of out (in rank order of s) come from rank s. Both spans
  // have size() entries >= 0 (zeros allowed); sum(send_rows) == in.dim(0),
  // sum(recv_rows) == out.dim(0), and recv_rows[s] on this rank must equal send_rows[me]
  // on rank s. in: (sum(send_rows), ...), out: (sum(recv_rows), ...), equal row shapes.
  virtual void AllToAllV(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                         std::span<const int64_t> recv_rows) = 0;
  // t: the same shape on every rank; becomes root's t.
  virtual void Broadcast(Tensor& t, int root) = 0;
  // Point-to-point: Send(t, peer) on one rank matches Recv(t', me) on peer with the same
  // tag (NCCL ignores tags: messages between a pair match in order). Shapes must agree.
  virtual void Send(const Tensor& t, int peer, int tag = 0) = 0;
  virtual void Recv(Tensor& t, int peer, int tag = 0) = 0;
  // Returns on every rank once every rank has entered it (device backends: after the
  // caller's stream has drained).
  virtual void Barrier() = 0;

  // Asynchronous versions of the collectives above, same arguments. Several may be in
  // flight and waited for in any order.
  virtual std::unique_ptr<Work> AllReduceAsync(Tensor& t, ReduceOp op) = 0;
  virtual std::unique_ptr<Work> AllGatherAsync(const Tensor& in, Tensor& out) = 0;
  virtual std::unique_ptr<Work> ReduceScatterAsync(const Tensor& in, Tensor& out,
                                                   ReduceOp op) = 0;
  virtual std::unique_ptr<Work> AllToAllVAsync(const Tensor& in,
                                               std::span<const int64_t> send_rows,
                                               Tensor& out,
                                               std::span<const int64_t> recv_rows) = 0;

  // A communicator for this rank's group of a partition of this communicator's ranks.
  // groups: lists of ranks of *this* communicator, each rank in exactly one list; every
  // rank passes the same partition. Collective over this communicator. Member i of the
  // new group is the i-th rank of its list. Groups of one rank get a local communicator.
  virtual std::unique_ptr<Communicator> Split(const std::vector<std::vector<int>>& groups) = 0;

  // "mpi(rank 1 of 4, world [0, 2, 4, 6], cpu)".
  std::string ToString() const;
};

// A group of one process: every collective is a copy (or nothing). world_rank is what
// world_ranks() reports; ctx orders the copies of device tensors (required for CUDA).
std::unique_ptr<Communicator> MakeLocalCommunicator(Device device = Device::Cpu(),
                                                    int world_rank = 0,
                                                    DeviceContext* ctx = nullptr);

// Argument checks shared by the backends; each fails with a SY_CHECK naming the shapes.
namespace internal {

// Rows of dim 0 (1 for a 0-d tensor).
int64_t Rows(const Tensor& t);
// t is defined and lives on `device`.
void CheckTensor(const Tensor& t, Device device, std::string_view op);
// op is defined for t's dtype (kAvg: floating dtypes only).
void CheckReduce(const Tensor& t, ReduceOp op);
// out is in gathered size times along dim 0.
void CheckAllGather(const Tensor& in, const Tensor& out, int size);
// in is out scattered size times along dim 0.
void CheckReduceScatter(const Tensor& in, const Tensor& out, int size);
// in and out: (size*n, ...) with equal shapes.
void CheckAllToAll(const Tensor& in, const Tensor& out, int size);
// The counts match the tensors (see Communicator::AllToAllV), and `rank` receives from
// itself what it sends itself.
void CheckAllToAllV(const Tensor& in, std::span<const int64_t> send_rows, const Tensor& out,
                    std::span<const int64_t> recv_rows, int size, int rank);
// groups partition [0, size); returns {index of rank's group, rank's position in it}.
std::pair<int, int> CheckSplit(const std::vector<std::vector<int>>& groups, int size,
                               int rank);
// Copies in to out unless they are the same memory (size-1 collectives).
void CopyIfDistinct(const Tensor& in, Tensor& out, DeviceContext* ctx);

}  // namespace internal
}  // namespace switchyard::dist
