// The hierarchical side of alltoall_perf (benchmarks/alltoall_hier.h).
#include "benchmarks/alltoall_hier.h"

#include <mpi.h>

#include "engine/dist/mpi_communicator.h"
#include "engine/dist/process.h"

namespace switchyard::bench {
namespace {

// The formulas of alltoall_hier.h from the (G, G) matrix of rows.
InterNodeTraffic Formulas(const std::vector<int64_t>& m, const dist::NodeLayout& layout, int me,
                          int64_t row_bytes) {
  const int g = static_cast<int>(layout.node.size());
  const int n = layout.node[me], l = layout.local[me];
  InterNodeTraffic t;
  for (int d = 0; d < g; ++d) {
    if (layout.node[d] == n || m[me * g + d] == 0) continue;
    t.flat_formula.bytes += m[me * g + d] * row_bytes;
    ++t.flat_formula.messages;
  }
  for (int np = 0; np < layout.nodes; ++np) {
    if (np == n) continue;
    int64_t rows = 0;
    for (int lp = 0; lp < layout.per_node; ++lp) {
      rows += m[layout.MemberAt(n, lp) * g + layout.MemberAt(np, l)];
    }
    t.hier_formula.bytes += rows * row_bytes;
    t.hier_formula.messages += rows > 0;
  }
  return t;
}

}  // namespace

StatusOr<std::unique_ptr<HierarchicalAllToAll>> HierarchicalAllToAll::Create(int ranks_per_node) {
  std::unique_ptr<HierarchicalAllToAll> out(new HierarchicalAllToAll());
  out->peers_ = std::make_shared<dist::PeerTraffic>();
  out->world_ = std::make_unique<dist::CountingCommunicator>(
      dist::MpiCommunicator::Duplicate(MPI_COMM_WORLD), out->peers_);
  const int world = out->world_->size();
  const int per_node = ranks_per_node > 0 ? ranks_per_node : dist::DetectRanksPerNode();
  if (world % per_node != 0) {
    return InvalidArgument("--ranks_per_node=", per_node, " does not divide the ", world,
                           " ranks");
  }
  std::vector<int> nodes(world);
  for (int r = 0; r < world; ++r) nodes[r] = r / per_node;
  SY_ASSIGN_OR_RETURN(out->hier_, dist::HierarchicalCommunicator::Create(*out->world_, nodes));
  return out;
}

InterNodeTraffic HierarchicalAllToAll::Measure(const Tensor& in, std::span<const int64_t> send,
                                               Tensor& out, std::span<const int64_t> recv,
                                               bool uniform) {
  const int g = world_->size(), me = world_->rank();
  Tensor mine = Tensor::FromVector(std::vector<int64_t>(send.begin(), send.end()), {1, g});
  Tensor all = Tensor::Empty({g, g}, DType::kI64);
  world_->inner().AllGather(mine, all);
  const int64_t row_bytes = in.dim(0) == 0 ? 0 : static_cast<int64_t>(in.nbytes()) / in.dim(0);
  InterNodeTraffic t = Formulas(all.ToVector<int64_t>(), layout(), me, row_bytes);
  const auto off_node = [&](int w) { return layout().node[w] != layout().node[me]; };
  auto run = [&](dist::Communicator& comm) {
    peers_->Reset();
    if (uniform) {
      comm.AllToAll(in, out);
    } else {
      comm.AllToAllV(in, send, out, recv);
    }
    return NodeTraffic{peers_->BytesTo(off_node), peers_->MessagesTo(off_node)};
  };
  t.flat = run(*world_);
  t.hier = run(*hier_);
  return t;
}

}  // namespace switchyard::bench
