// HierarchicalCommunicator: a group whose all-to-all crosses nodes once per node pair.
//
// A flat all-to-all(v) sends one message from every rank to every rank, so a rank on one of
// N nodes of L group members each sends (N - 1) L messages across nodes. The hierarchical
// exchange (Tutel's 2D all-to-all, DeepEP's intra/inter split) does it in two steps over
// two splits of the group, member (n, l) being the l-th member of node n:
//
//   step 1  intra-node all-to-all(v) over the L members of node n: each row goes to the
//           member of this node with the local index of its destination, so (n, l)
//           collects every row of its node bound for local index l of any node;
//   step 2  inter-node all-to-all(v) over the N members with local index l (one per node):
//           (n, l) sends (n', l) one aggregated message, every row of node n for (n', l).
//
// Rows are reordered between the steps so that every message is one contiguous block, and
// after step 2 into the flat order, by source member. The receiving rank gets exactly the
// bytes flat AllToAllV would give it, in the same order: only the path differs, so results
// are bit-identical to the flat exchange by construction. Inter-node messages per rank:
// N - 1 instead of (N - 1) L; each row still crosses nodes once. The reverse exchange (the
// combine) is the same call with the counts swapped: inside the source node, across, and
// inside the destination node, mirrored.
//
// Which collectives are hierarchical: AllToAllV, AllToAllVAsync (run to completion, then a
// completed Work) and AllToAll, for host tensors of any dtype and for device tensors of
// f32, i32 or u8 (reordered with kernels::GatherRows on the communicator's stream); other
// device dtypes, and every other collective, go to the flat group unchanged. AllToAllV
// first gathers the send counts of the node's members (one intra-node all-gather of
// size() int64 values): step 1's receive counts and step 2's send counts need them.
//
//   auto hier = HierarchicalCommunicator::Create(pc.ep(), nodes_of_ep_members);
//   hier->AllToAllV(rows, send_rows, out, recv_rows);  // == pc.ep().AllToAllV(...)
#pragma once

#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "engine/dist/communicator.h"

namespace switchyard::dist {

// Where a group's members sit: N nodes of L members each. Node indices are the distinct
// node ids in increasing order; a member's local index is its position among its node's
// members in group order. Pure arithmetic.
struct NodeLayout {
  int nodes = 1;                // N
  int per_node = 1;             // L
  std::vector<int> node;        // (size) node index of each member
  std::vector<int> local;       // (size) local index of each member
  std::vector<int> member;      // (N * L) member at (node n, local l): member[n * L + l]

  int MemberAt(int n, int l) const { return member[n * per_node + l]; }
  // node_of_member: any node id per member (e.g. Mesh::NodeOf of its world rank). An error
  // naming the counts when the nodes hold different numbers of members.
  static StatusOr<NodeLayout> Of(std::span<const int> node_of_member);
};

class HierarchicalCommunicator final : public Communicator {
 public:
  // group: the flat group (it must outlive this object); node_of_member: the node id of
  // each of its members (size() entries, the same on every member). Collective over group
  // (two Splits). Errors: a size mismatch, or nodes holding different numbers of members.
  static StatusOr<std::unique_ptr<HierarchicalCommunicator>> Create(
      Communicator& group, std::span<const int> node_of_member);

  const NodeLayout& layout() const { return layout_; }
  Communicator& flat() const { return *flat_; }
  Communicator& intra_node() const { return *intra_; }  // this node's members, by local index
  Communicator& inter_node() const { return *inter_; }  // this local index's members, by node

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  std::vector<int> world_ranks() const override { return flat_->world_ranks(); }
  Device device() const override { return flat_->device(); }
  std::string_view backend() const override { return flat_->backend(); }
  DeviceContext* context() const override { return flat_->context(); }

  void AllToAll(const Tensor& in, Tensor& out) override;
  void AllToAllV(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                 std::span<const int64_t> recv_rows) override;
  std::unique_ptr<Work> AllToAllVAsync(const Tensor& in, std::span<const int64_t> send_rows,
                                       Tensor& out, std::span<const int64_t> recv_rows) override;

  // The rest is the flat group's.
  void AllReduce(Tensor& t, ReduceOp op) override { flat_->AllReduce(t, op); }
  void AllGather(const Tensor& in, Tensor& out) override { flat_->AllGather(in, out); }
  void ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    flat_->ReduceScatter(in, out, op);
  }
  void AllGatherV(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override {
    flat_->AllGatherV(in, out, rows);
  }
  void ReduceScatterV(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                      ReduceOp op) override {
    flat_->ReduceScatterV(in, out, rows, op);
  }
  void Broadcast(Tensor& t, int root) override { flat_->Broadcast(t, root); }
  void Send(const Tensor& t, int peer, int tag = 0) override { flat_->Send(t, peer, tag); }
  void Recv(Tensor& t, int peer, int tag = 0) override { flat_->Recv(t, peer, tag); }
  std::unique_ptr<Work> SendAsync(const Tensor& t, int peer, int tag = 0) override {
    return flat_->SendAsync(t, peer, tag);
  }
  std::unique_ptr<Work> RecvAsync(Tensor& t, int peer, int tag = 0) override {
    return flat_->RecvAsync(t, peer, tag);
  }
  std::unique_ptr<Work> BatchSendRecv(std::span<const P2POp> ops) override {
    return flat_->BatchSendRecv(ops);
  }
  void Barrier() override { flat_->Barrier(); }
  std::unique_ptr<Work> AllReduceAsync(Tensor& t, ReduceOp op) override {
    return flat_->AllReduceAsync(t, op);
  }
  std::unique_ptr<Work> AllGatherAsync(const Tensor& in, Tensor& out) override {
    return flat_->AllGatherAsync(in, out);
  }
  std::unique_ptr<Work> ReduceScatterAsync(const Tensor& in, Tensor& out,
                                           ReduceOp op) override {
    return flat_->ReduceScatterAsync(in, out, op);
  }
  // Splits the flat group (the parts are flat communicators).
  std::unique_ptr<Communicator> Split(const std::vector<std::vector<int>>& groups) override {
    return flat_->Split(groups);
  }

 private:
  HierarchicalCommunicator(Communicator& flat, NodeLayout layout)
      : flat_(&flat), layout_(std::move(layout)) {}
  // Whether the two steps can move in's rows (else the flat group does it).
  bool Hierarchical(const Tensor& in) const;
  // The two steps, given counts[l * size() + d]: rows member (my node, l) sends member d.
  void Exchange(const Tensor& in, std::span<const int64_t> send_rows,
                const std::vector<int64_t>& counts, Tensor& out,
                std::span<const int64_t> recv_rows);

  Communicator* flat_;
  NodeLayout layout_;
  std::unique_ptr<Communicator> intra_, inter_;
};

}  // namespace switchyard::dist
