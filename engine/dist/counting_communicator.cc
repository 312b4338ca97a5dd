#include "engine/dist/counting_communicator.h"

namespace switchyard::dist {
namespace {

int64_t Bytes(const Tensor& t) { return static_cast<int64_t>(t.nbytes()); }

int64_t RowBytes(const Tensor& t) {
  return t.ndim() == 0 ? Bytes(t) : (t.dim(0) == 0 ? 0 : Bytes(t) / t.dim(0));
}

// Bytes of the rows this rank sends to others in an uneven all-to-all.
int64_t SentBytes(const Tensor& in, std::span<const int64_t> send_rows) {
  int64_t rows = 0;
  for (int64_t r : send_rows) rows += r;
  return rows == 0 ? 0 : Bytes(in) / (in.ndim() == 0 ? 1 : in.dim(0)) * rows;
}

}  // namespace

double TrafficCounters::RingBytes(int n) const {
  if (n <= 1) return 0.0;
  const double f = static_cast<double>(n - 1) / n;
  return 2 * f * all_reduce_bytes + f * (all_gather_bytes + reduce_scatter_bytes) +
         f * all_to_all_bytes + p2p_bytes + f * broadcast_bytes;
}

void PeerTraffic::Add(int world_rank, int64_t payload) {
  if (payload <= 0) return;
  if (static_cast<int>(bytes.size()) <= world_rank) {
    bytes.resize(world_rank + 1, 0);
    messages.resize(world_rank + 1, 0);
  }
  bytes[world_rank] += payload;
  ++messages[world_rank];
}

int64_t PeerTraffic::BytesTo(const std::function<bool(int)>& counted) const {
  int64_t sum = 0;
  for (size_t r = 0; r < bytes.size(); ++r) sum += counted(static_cast<int>(r)) ? bytes[r] : 0;
  return sum;
}

int64_t PeerTraffic::MessagesTo(const std::function<bool(int)>& counted) const {
  int64_t sum = 0;
  for (size_t r = 0; r < messages.size(); ++r) {
    sum += counted(static_cast<int>(r)) ? messages[r] : 0;
  }
  return sum;
}

CountingCommunicator::CountingCommunicator(std::unique_ptr<Communicator> inner,
                                           std::shared_ptr<PeerTraffic> peers)
    : inner_(std::move(inner)), peers_(std::move(peers)) {
  if (peers_) world_ranks_ = inner_->world_ranks();
}

void CountingCommunicator::RecordPeer(int peer, int64_t bytes) {
  if (peers_ && peer != rank()) peers_->Add(world_ranks_[peer], bytes);
}

void CountingCommunicator::RecordPeers(std::span<const int64_t> rows, int64_t row_bytes) {
  for (size_t i = 0; i < rows.size(); ++i) RecordPeer(static_cast<int>(i), rows[i] * row_bytes);
}

void CountingCommunicator::AllReduce(Tensor& t, ReduceOp op) {
  ++traffic_.all_reduce_calls;
  traffic_.all_reduce_bytes += Bytes(t);
  inner_->AllReduce(t, op);
}

void CountingCommunicator::AllGather(const Tensor& in, Tensor& out) {
  ++traffic_.all_gather_calls;
  traffic_.all_gather_bytes += Bytes(out);
  inner_->AllGather(in, out);
}

void CountingCommunicator::ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) {
  ++traffic_.reduce_scatter_calls;
  traffic_.reduce_scatter_bytes += Bytes(in);
  inner_->ReduceScatter(in, out, op);
}

void CountingCommunicator::AllToAll(const Tensor& in, Tensor& out) {
  ++traffic_.all_to_all_calls;
  traffic_.all_to_all_bytes += Bytes(in);
  if (peers_) {
    const int64_t rows = in.ndim() == 0 ? 1 : in.dim(0);
    RecordPeers(std::vector<int64_t>(size(), rows / size()), RowBytes(in));
  }
  inner_->AllToAll(in, out);
}

void CountingCommunicator::AllToAllV(const Tensor& in, std::span<const int64_t> send_rows,
                                     Tensor& out, std::span<const int64_t> recv_rows) {
  ++traffic_.all_to_all_calls;
  traffic_.all_to_all_bytes += SentBytes(in, send_rows);
  RecordPeers(send_rows, RowBytes(in));
  inner_->AllToAllV(in, send_rows, out, recv_rows);
}

void CountingCommunicator::AllGatherV(const Tensor& in, Tensor& out,
                                      std::span<const int64_t> rows) {
  ++traffic_.all_gather_calls;
  traffic_.all_gather_bytes += Bytes(out);
  inner_->AllGatherV(in, out, rows);
}

void CountingCommunicator::ReduceScatterV(const Tensor& in, Tensor& out,
                                          std::span<const int64_t> rows, ReduceOp op) {
  ++traffic_.reduce_scatter_calls;
  traffic_.reduce_scatter_bytes += Bytes(in);
  inner_->ReduceScatterV(in, out, rows, op);
}

void CountingCommunicator::Broadcast(Tensor& t, int root) {
  ++traffic_.broadcast_calls;
  traffic_.broadcast_bytes += Bytes(t);
  inner_->Broadcast(t, root);
}

void CountingCommunicator::Send(const Tensor& t, int peer, int tag) {
  ++traffic_.p2p_calls;
  traffic_.p2p_bytes += Bytes(t);
  RecordPeer(peer, Bytes(t));
  inner_->Send(t, peer, tag);
}

void CountingCommunicator::Recv(Tensor& t, int peer, int tag) { inner_->Recv(t, peer, tag); }

std::unique_ptr<Work> CountingCommunicator::SendAsync(const Tensor& t, int peer, int tag) {
  ++traffic_.p2p_calls;
  traffic_.p2p_bytes += Bytes(t);
  RecordPeer(peer, Bytes(t));
  return inner_->SendAsync(t, peer, tag);
}

std::unique_ptr<Work> CountingCommunicator::RecvAsync(Tensor& t, int peer, int tag) {
  return inner_->RecvAsync(t, peer, tag);
}

std::unique_ptr<Work> CountingCommunicator::BatchSendRecv(std::span<const P2POp> ops) {
  for (const P2POp& op : ops) {
    if (op.kind != P2POp::kSend) continue;
    ++traffic_.p2p_calls;
    traffic_.p2p_bytes += Bytes(op.tensor);
    RecordPeer(op.peer, Bytes(op.tensor));
  }
  return inner_->BatchSendRecv(ops);
}

std::unique_ptr<Work> CountingCommunicator::AllReduceAsync(Tensor& t, ReduceOp op) {
  ++traffic_.all_reduce_calls;
  traffic_.all_reduce_bytes += Bytes(t);
  return inner_->AllReduceAsync(t, op);
}

std::unique_ptr<Work> CountingCommunicator::AllGatherAsync(const Tensor& in, Tensor& out) {
  ++traffic_.all_gather_calls;
  traffic_.all_gather_bytes += Bytes(out);
  return inner_->AllGatherAsync(in, out);
}

std::unique_ptr<Work> CountingCommunicator::ReduceScatterAsync(const Tensor& in, Tensor& out,
                                                               ReduceOp op) {
  ++traffic_.reduce_scatter_calls;
  traffic_.reduce_scatter_bytes += Bytes(in);
  return inner_->ReduceScatterAsync(in, out, op);
}

std::unique_ptr<Work> CountingCommunicator::AllToAllVAsync(const Tensor& in,
                                                           std::span<const int64_t> send_rows,
                                                           Tensor& out,
                                                           std::span<const int64_t> recv_rows) {
  ++traffic_.all_to_all_calls;
  traffic_.all_to_all_bytes += SentBytes(in, send_rows);
  RecordPeers(send_rows, RowBytes(in));
  return inner_->AllToAllVAsync(in, send_rows, out, recv_rows);
}

std::unique_ptr<Communicator> CountingCommunicator::Split(
    const std::vector<std::vector<int>>& groups) {
  return std::make_unique<CountingCommunicator>(inner_->Split(groups), peers_);
}

}  // namespace switchyard::dist
