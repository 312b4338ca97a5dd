// A Communicator that counts what passes through another one: for benchmarks that print
// the bytes each parallelism sends beside the analytic volume. Every call is forwarded;
// Split returns counting communicators too, so wrapping the world counts every group a
// ParallelContext makes from it.
//
// Bytes are payloads as the caller sees them, per rank:
//   all_reduce      t's bytes                  all_gather(v)      out's bytes (every rank's)
//   reduce_scatter  in's bytes (every rank's)  all_to_all(v)      the bytes this rank sends
//   p2p             bytes sent                 broadcast          t's bytes
// What travels on a wire depends on the algorithm; for a ring, rank-sent bytes are
// 2 (n-1)/n of an all-reduce payload and (n-1)/n of an all-gather or reduce-scatter one
// (nccl-tests' bus bandwidth factors), which TrafficCounters::RingBytes applies.
//
// PeerTraffic, optional and shared by a communicator and every Split of it, records where
// this rank's point-to-point payloads go: for all_to_all(v) and send / batch sends, the
// bytes and the messages (non-empty payloads) to each other rank, by world rank. With a
// node map that gives the inter-node bytes and messages of an exchange (alltoall_perf).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/dist/communicator.h"

namespace switchyard::dist {

struct TrafficCounters {
  int64_t all_reduce_calls = 0, all_reduce_bytes = 0;
  int64_t all_gather_calls = 0, all_gather_bytes = 0;
  int64_t reduce_scatter_calls = 0, reduce_scatter_bytes = 0;
  int64_t all_to_all_calls = 0, all_to_all_bytes = 0;
  int64_t p2p_calls = 0, p2p_bytes = 0;
  int64_t broadcast_calls = 0, broadcast_bytes = 0;

  // Bytes a rank of an n-rank ring sends for these payloads.
  double RingBytes(int n) const;
  void Reset() { *this = TrafficCounters(); }
};

// Bytes and messages this rank sent to each world rank (sized to the largest seen).
struct PeerTraffic {
  std::vector<int64_t> bytes, messages;

  void Add(int world_rank, int64_t payload);
  // Sums over the world ranks for which `counted` is true.
  int64_t BytesTo(const std::function<bool(int)>& counted) const;
  int64_t MessagesTo(const std::function<bool(int)>& counted) const;
  void Reset() { bytes.clear(), messages.clear(); }
};

class CountingCommunicator final : public Communicator {
 public:
  // peers: where to record per-peer traffic (shared with the Splits); null: not recorded.
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner,
                                std::shared_ptr<PeerTraffic> peers = nullptr);

  const TrafficCounters& traffic() const { return traffic_; }
  const std::shared_ptr<PeerTraffic>& peer_traffic() const { return peers_; }
  void ResetTraffic() { traffic_.Reset(); }
  Communicator& inner() { return *inner_; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::vector<int> world_ranks() const override { return inner_->world_ranks(); }
  Device device() const override { return inner_->device(); }
  std::string_view backend() const override { return inner_->backend(); }
  DeviceContext* context() const override { return inner_->context(); }

  void AllReduce(Tensor& t, ReduceOp op) override;
  void AllGather(const Tensor& in, Tensor& out) override;
  void ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override;
  void AllToAll(const Tensor& in, Tensor& out) override;
  void AllToAllV(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                 std::span<const int64_t> recv_rows) override;
  void AllGatherV(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override;
  void ReduceScatterV(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                      ReduceOp op) override;
  void Broadcast(Tensor& t, int root) override;
  void Send(const Tensor& t, int peer, int tag = 0) override;
  void Recv(Tensor& t, int peer, int tag = 0) override;
  std::unique_ptr<Work> SendAsync(const Tensor& t, int peer, int tag = 0) override;
  std::unique_ptr<Work> RecvAsync(Tensor& t, int peer, int tag = 0) override;
  std::unique_ptr<Work> BatchSendRecv(std::span<const P2POp> ops) override;
  void Barrier() override { inner_->Barrier(); }
  std::unique_ptr<Work> AllReduceAsync(Tensor& t, ReduceOp op) override;
  std::unique_ptr<Work> AllGatherAsync(const Tensor& in, Tensor& out) override;
  std::unique_ptr<Work> ReduceScatterAsync(const Tensor& in, Tensor& out, ReduceOp op) override;
  std::unique_ptr<Work> AllToAllVAsync(const Tensor& in, std::span<const int64_t> send_rows,
                                       Tensor& out, std::span<const int64_t> recv_rows) override;
  std::unique_ptr<Communicator> Split(const std::vector<std::vector<int>>& groups) override;

 private:
  // Records sends of rows[i] rows of row_bytes to members i (not this rank).
  void RecordPeers(std::span<const int64_t> rows, int64_t row_bytes);
  void RecordPeer(int peer, int64_t bytes);

  std::unique_ptr<Communicator> inner_;
  TrafficCounters traffic_;
  std::shared_ptr<PeerTraffic> peers_;
  std::vector<int> world_ranks_;
};

}  // namespace switchyard::dist
