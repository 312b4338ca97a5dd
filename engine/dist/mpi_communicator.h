// The MPI backend of Communicator: host tensors (f32, f64, i32, i64, u8; bf16 and f16 for
// the collectives that do not reduce). Messages count rows of a contiguous row datatype, so a
// message may hold up to 2^31-1 rows of any size. Only built with MPI (SY_HAVE_MPI).
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "engine/dist/communicator.h"

namespace switchyard::dist {

// World ranks of the members of `comm`, in its rank order.
std::vector<int> MpiWorldRanks(MPI_Comm comm);

class MpiCommunicator final : public Communicator {
 public:
  // A communicator over a duplicate of `comm` (so its traffic never matches the caller's
  // messages). Collective over `comm`.
  static std::unique_ptr<MpiCommunicator> Duplicate(MPI_Comm comm);

  // Takes ownership of `comm` (freed in the destructor). world_ranks[i] is the world rank
  // of member i of `comm`.
  MpiCommunicator(MPI_Comm comm, std::vector<int> world_ranks);
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  // Frees the communicator and the row datatypes, unless MPI is already finalized.
  ~MpiCommunicator() override;

  // The underlying MPI communicator (still owned by this object).
  MPI_Comm comm() const { return comm_; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<int> world_ranks() const override { return world_ranks_; }
  Device device() const override { return Device::Cpu(); }
  std::string_view backend() const override { return "mpi"; }
  DeviceContext* context() const override { return nullptr; }

  void AllReduce(Tensor& t, ReduceOp op) override;
  void AllGather(const Tensor& in, Tensor& out) override;
  void ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  void AllToAll(const Tensor& in, Tensor& out) override;
  void AllToAllV(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                 std::span<const int64_t> recv_rows) override;
  // MPI_Allgatherv over row datatypes.
  void AllGatherV(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override;
  // MPI_Reduce_scatter with element counts.
  void ReduceScatterV(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                      ReduceOp op) override;
  void Broadcast(Tensor& t, int root) override;
  void Send(const Tensor& t, int peer, int tag = 0) override;
  void Recv(Tensor& t, int peer, int tag = 0) override;
  // MPI_Isend / MPI_Irecv; Wait is MPI_Waitall (and checks a receive got all its rows).
  std::unique_ptr<Work> SendAsync(const Tensor& t, int peer, int tag = 0) override;
  std::unique_ptr<Work> RecvAsync(Tensor& t, int peer, int tag = 0) override;
  std::unique_ptr<Work> BatchSendRecv(std::span<const P2POp> ops) override;
  void Barrier() override;

  std::unique_ptr<Work> AllReduceAsync(Tensor& t, ReduceOp op) override;
  std::unique_ptr<Work> AllGatherAsync(const Tensor& in, Tensor& out) override;
  std::unique_ptr<Work> ReduceScatterAsync(const Tensor& in, Tensor& out,
                                           ReduceOp op) override;
  std::unique_ptr<Work> AllToAllVAsync(const Tensor& in, std::span<const int64_t> send_rows,
                                       Tensor& out,
                                       std::span<const int64_t> recv_rows) override;

  // MPI_Comm_split(color = index of my group, key = my position in it); singleton groups
  // get a local communicator (and MPI_UNDEFINED as their color).
  std::unique_ptr<Communicator> Split(const std::vector<std::vector<int>>& groups) override;

 private:
  // {the world rank of group member `peer`}, what a point-to-point wait names to the
  // watchdog (empty for a peer outside the group: the caller's check reports it).
  std::vector<int> PeerOf(int peer) const {
    if (peer < 0 || peer >= static_cast<int>(world_ranks_.size())) return {};
    return {world_ranks_[peer]};
  }
  class Request;

  // The committed datatype of one row of t (row_size() elements of its dtype), cached.
  MPI_Datatype RowType(const Tensor& t);

  // Each starts one collective: blocking when async is false (the returned Request is then
  // complete but for the kAvg division), non-blocking otherwise.
  std::unique_ptr<Request> StartAllReduce(Tensor& t, ReduceOp op, bool async);
  std::unique_ptr<Request> StartAllGather(const Tensor& in, Tensor& out, bool async);
  std::unique_ptr<Request> StartReduceScatter(const Tensor& in, Tensor& out, ReduceOp op,
                                              bool async);
  // Posts one MPI_Isend or MPI_Irecv of op's tensor on `request`.
  void PostP2P(const P2POp& op, Request& request);
  std::unique_ptr<Request> StartAllToAllV(const Tensor& in, std::span<const int64_t> send_rows,
                                          Tensor& out, std::span<const int64_t> recv_rows,
                                          bool async);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;
  uint64_t seq_ = 0;  // collectives started on this communicator (the watchdog names them)
  std::map<std::pair<int, int64_t>, MPI_Datatype> row_types_;  // (dtype, row_size) -> type
};

}  // namespace switchyard::dist
