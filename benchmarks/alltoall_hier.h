// The hierarchical side of alltoall_perf: the world's all-to-all through
// dist::HierarchicalCommunicator over nodes of --ranks_per_node ranks, with the inter-node
// bytes and messages each rank sends, measured (dist::PeerTraffic of a counting world)
// and from the formulas of docs/moe-layer.md "Hierarchical dispatch". With M[s][d] the
// rows member s sends member d, B the bytes of a row, rank (n, l) of N nodes of L ranks:
//   flat          bytes  sum over d off node n of M[(n,l)][d] B
//                 msgs   #{d off node n : M[(n,l)][d] > 0}           (N - 1) L uniform
//   hierarchical  bytes  sum over n' != n of A(n') B,  A(n') = sum over l' of M[(n,l')][(n',l)]
//                 msgs   #{n' != n : A(n') > 0}                      N - 1 uniform
// Both move every row across nodes once: equal total bytes, fewer and larger messages.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/dist/counting_communicator.h"
#include "engine/dist/hierarchical_communicator.h"

namespace switchyard::bench {

// One rank's traffic to other nodes.
struct NodeTraffic {
  int64_t bytes = 0, messages = 0;
  bool operator==(const NodeTraffic&) const = default;
};

struct InterNodeTraffic {
  NodeTraffic flat, flat_formula, hier, hier_formula;
};

class HierarchicalAllToAll {
 public:
  // ranks_per_node: 0 detects them (dist::DetectRanksPerNode); must divide the world.
  // Collective over the MPI world.
  static StatusOr<std::unique_ptr<HierarchicalAllToAll>> Create(int ranks_per_node);

  dist::Communicator& hier() { return *hier_; }
  const dist::NodeLayout& layout() const { return hier_->layout(); }

  // Runs the exchange once flat and once hierarchical through the counting world and
  // returns this rank's inter-node traffic beside the formulas. in: send[d] rows to each
  // member, out: recv[s] rows from each. uniform: AllToAll instead of AllToAllV.
  InterNodeTraffic Measure(const Tensor& in, std::span<const int64_t> send, Tensor& out,
                           std::span<const int64_t> recv, bool uniform);

 private:
  std::shared_ptr<dist::PeerTraffic> peers_;
  std::unique_ptr<dist::CountingCommunicator> world_;
  std::unique_ptr<dist::HierarchicalCommunicator> hier_;
};

}  // namespace switchyard::bench
