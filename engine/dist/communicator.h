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
//  - Every backend moves every dtype; reductions take f32, f64, i32, i64 and u8 (NCCL also
//    bf16 and f16).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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
  // Whether the op is complete, without blocking: once true, Wait returns at once and the
  // op's tensors may be released (a device op: its kernels have finished). May drive the
  // op's progress (MPI_Test). A Work that cannot tell answers false until it is waited for
  // (the default), so callers that poll must still Wait at the end.
  virtual bool Test() { return false; }
};

// A Work that is already complete (for groups of size 1).
std::unique_ptr<Work> CompletedWork();

// One message of Communicator::BatchSendRecv: send `tensor` to `peer`, or receive into it
// from `peer`. tensor is a handle: a receive writes the caller's memory.
struct P2POp {
  enum Kind { kSend, kRecv } kind;
  Tensor tensor;
  int peer;
  int tag = 0;
};

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
  // The context whose stream orders this communicator's device ops; null for host
  // communicators.
  virtual DeviceContext* context() const = 0;

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
  // Uneven all-gather. rows[r] (size() entries >= 0, zeros allowed, the same on every
  // rank) rows come from rank r: in: (rows[me], ...) -> out: (sum(rows), ...), rank r's rows
  // at [offset_r, offset_r + rows[r]) with offset_r = rows[0] + ... + rows[r-1]. out must
  // not overlap in. (NCCL: one broadcast per rank with rows, grouped.)
  virtual void AllGatherV(const Tensor& in, Tensor& out, std::span<const int64_t> rows) = 0;
  // Uneven reduce-scatter, the mirror of AllGatherV: in: (sum(rows), ...) on every rank ->
  // out: (rows[me], ...), the reduction over ranks of in's rows [offset_me, offset_me +
  // rows[me]). out must not overlap in. (NCCL: one reduce per rank with rows, grouped.)
  virtual void ReduceScatterV(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                              ReduceOp op) = 0;
  // t: the same shape on every rank; becomes root's t.
  virtual void Broadcast(Tensor& t, int root) = 0;
  // Point-to-point: Send(t, peer) on one rank matches Recv(t', me) on peer with the same
  // tag (NCCL ignores tags: messages between a pair match in order). Shapes must agree.
  virtual void Send(const Tensor& t, int peer, int tag = 0) = 0;
  virtual void Recv(Tensor& t, int peer, int tag = 0) = 0;
  // Non-blocking Send and Recv: the message is posted, Wait completes it. A rank may post
  // its send to the next rank and its receive from the previous one in either order before
  // waiting for either. NCCL: posted ops are queued and launched together (one NCCL group)
  // at the first Wait of any of them or before this communicator's next other op, so post
  // every matching op before waiting or calling a collective.
  virtual std::unique_ptr<Work> SendAsync(const Tensor& t, int peer, int tag = 0) = 0;
  virtual std::unique_ptr<Work> RecvAsync(Tensor& t, int peer, int tag = 0) = 0;
  // Posts every op at once (MPI: Isend/Irecv and one Waitall; NCCL: one group), so ops to
  // and from any peers in any order cannot deadlock against the peers' batches: a pipeline
  // stage posts {send to next, recv from prev} as one batch. Between a pair of ranks,
  // messages of one tag match in posting order (NCCL ignores tags). A send to this rank
  // itself must be matched by a receive from itself in the same batch (same tag, equal
  // element count and dtype); on a group of size 1 that is the only op allowed: a copy.
  virtual std::unique_ptr<Work> BatchSendRecv(std::span<const P2POp> ops) = 0;
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

// Every rank's values[i] summed over the group as the pairwise tree in rank order
// (ordered_sum.h), so the result is bit-identical on every rank and independent of how
// MPI or NCCL would order a sum. Collective over comm; host or device communicators (the
// values travel as f64 on comm's device). Defined in ordered_sum.cc.
std::vector<double> AllReduceDoubles(Communicator& comm, std::span<const double> values);

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
// rows: size entries >= 0. Returns the offsets, size + 1 entries (offsets[r] =
// rows[0] + ... + rows[r-1]).
std::vector<int64_t> CheckRowCounts(std::span<const int64_t> rows, int size,
                                    std::string_view op);
// in: (rows[rank], ...), out: (sum(rows), ...), equal row shapes; returns the offsets.
std::vector<int64_t> CheckAllGatherV(const Tensor& in, const Tensor& out,
                                     std::span<const int64_t> rows, int size, int rank);
// in: (sum(rows), ...), out: (rows[rank], ...), equal row shapes; returns the offsets.
std::vector<int64_t> CheckReduceScatterV(const Tensor& in, const Tensor& out,
                                         std::span<const int64_t> rows, int size, int rank);
// A Send/Recv peer: another rank of the group.
void CheckPeer(int peer, int size, int rank, std::string_view op);
// The tensors of ops are defined on `device`, peers in [0, size), tags >= 0, and the sends
// to `rank` itself pair with its receives from itself (the k-th send of a tag with the
// k-th receive of that tag; equal dtype and element count). Returns those pairs as
// (index of the send, index of the receive).
std::vector<std::pair<size_t, size_t>> CheckBatch(std::span<const P2POp> ops, Device device,
                                                  int size, int rank);
// groups partition [0, size); returns {index of rank's group, rank's position in it}.
std::pair<int, int> CheckSplit(const std::vector<std::vector<int>>& groups, int size,
                               int rank);
// Copies in to out unless they are the same memory (size-1 collectives).
void CopyIfDistinct(const Tensor& in, Tensor& out, DeviceContext* ctx);

}  // namespace internal
}  // namespace switchyard::dist
