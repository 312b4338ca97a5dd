// The hierarchical all-to-all (engine/dist/hierarchical_communicator.h): the node layout,
// the two exchanges and the row reorders around them.
#include "engine/dist/hierarchical_communicator.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "engine/core/check.h"
#include "kernels/permute.h"

namespace switchyard::dist {
namespace {

// A run of rows moved from row src of one tensor to row dst of another.
struct Block {
  int64_t src, dst, rows;
};

bool IsIdentity(const std::vector<Block>& blocks) {
  return std::all_of(blocks.begin(), blocks.end(),
                     [](const Block& b) { return b.rows == 0 || b.src == b.dst; });
}

Tensor EmptyRows(const Tensor& like, int64_t rows) {
  Shape shape = like.shape();
  shape[0] = rows;
  return Tensor::Empty(shape, like.dtype(), like.device());
}

// dst's rows from src's by blocks that cover dst: byte copies on the host, one GatherRows
// on a device (src and dst viewed as (rows, row_size), index built on the host).
void MoveRows(const Tensor& src, Tensor& dst, const std::vector<Block>& blocks,
              DeviceContext* ctx) {
  const int64_t width = dst.row_size();
  if (dst.device().is_cpu()) {
    const size_t row_bytes = static_cast<size_t>(width) * SizeOf(dst.dtype());
    const auto* s = static_cast<const char*>(src.raw_data());
    auto* t = static_cast<char*>(dst.raw_data());
    for (const Block& b : blocks) {
      if (b.rows > 0) std::memcpy(t + b.dst * row_bytes, s + b.src * row_bytes, b.rows * row_bytes);
    }
    return;
  }
  if (dst.dim(0) == 0) return;
  std::vector<int64_t> index(dst.dim(0), -1);
  for (const Block& b : blocks)
    for (int64_t r = 0; r < b.rows; ++r) index[b.dst + r] = b.src + r;
  Tensor device_index = Tensor::FromVector(index, {dst.dim(0)}).To(dst.device(), ctx);
  Tensor dst2 = dst.Reshape({dst.dim(0), width});
  kernels::GatherRows(src.Reshape({src.dim(0), width}), device_index, dst2, ctx);
}

// src reordered by blocks into a fresh (rows, ...) tensor, or src itself when they move
// nothing.
Tensor Reordered(const Tensor& src, int64_t rows, const std::vector<Block>& blocks,
                 DeviceContext* ctx) {
  if (IsIdentity(blocks) && rows == src.dim(0)) return src;
  Tensor out = EmptyRows(src, rows);
  MoveRows(src, out, blocks, ctx);
  return out;
}

std::vector<int64_t> Offsets(std::span<const int64_t> rows) {
  std::vector<int64_t> off(rows.size() + 1, 0);
  for (size_t i = 0; i < rows.size(); ++i) off[i + 1] = off[i] + rows[i];
  return off;
}

}  // namespace

StatusOr<NodeLayout> NodeLayout::Of(std::span<const int> node_of_member) {
  if (node_of_member.empty()) return InvalidArgument("a node layout needs at least one member");
  std::map<int, int> members_of;  // node id -> members
  for (int id : node_of_member) ++members_of[id];
  const int per_node = members_of.begin()->second;
  for (const auto& [id, count] : members_of) {
    if (count != per_node) {
      return InvalidArgument("the group's nodes hold different numbers of its members (node ",
                             members_of.begin()->first, ": ", per_node, ", node ", id, ": ",
                             count, "); the hierarchical all-to-all needs the same number on "
                             "every node");
    }
  }
  NodeLayout layout;
  layout.nodes = static_cast<int>(members_of.size());
  layout.per_node = per_node;
  std::map<int, int> index_of;  // node id -> node index, in increasing id
  for (const auto& [id, count] : members_of) index_of.emplace(id, static_cast<int>(index_of.size()));
  const int size = static_cast<int>(node_of_member.size());
  layout.node.resize(size);
  layout.local.resize(size);
  layout.member.resize(size);
  std::vector<int> seen(layout.nodes, 0);
  for (int m = 0; m < size; ++m) {
    const int n = index_of[node_of_member[m]];
    layout.node[m] = n;
    layout.local[m] = seen[n]++;
    layout.member[n * per_node + layout.local[m]] = m;
  }
  return layout;
}

StatusOr<std::unique_ptr<HierarchicalCommunicator>> HierarchicalCommunicator::Create(
    Communicator& group, std::span<const int> node_of_member) {
  if (static_cast<int>(node_of_member.size()) != group.size()) {
    return InvalidArgument("hierarchical all-to-all: ", node_of_member.size(),
                           " node ids for a group of ", group.size());
  }
  SY_ASSIGN_OR_RETURN(NodeLayout layout, NodeLayout::Of(node_of_member));
  std::vector<std::vector<int>> intra(layout.nodes), inter(layout.per_node);
  for (int n = 0; n < layout.nodes; ++n) {
    for (int l = 0; l < layout.per_node; ++l) {
      intra[n].push_back(layout.MemberAt(n, l));
      inter[l].push_back(layout.MemberAt(n, l));
    }
  }
  std::unique_ptr<HierarchicalCommunicator> out(
      new HierarchicalCommunicator(group, std::move(layout)));
  out->intra_ = group.Split(intra);
  out->inter_ = group.Split(inter);
  return out;
}

bool HierarchicalCommunicator::Hierarchical(const Tensor& in) const {
  if (layout_.nodes == 1 || layout_.per_node == 1 || in.ndim() == 0) return false;
  const DType t = in.dtype();
  return in.device().is_cpu() || t == DType::kF32 || t == DType::kI32 || t == DType::kU8;
}

void HierarchicalCommunicator::AllToAll(const Tensor& in, Tensor& out) {
  if (!Hierarchical(in)) return flat_->AllToAll(in, out);
  internal::CheckAllToAll(in, out, size());
  const std::vector<int64_t> rows(size(), in.dim(0) / size());
  Exchange(in, rows, std::vector<int64_t>(layout_.per_node * size(), rows[0]), out, rows);
}

void HierarchicalCommunicator::AllToAllV(const Tensor& in, std::span<const int64_t> send_rows,
                                         Tensor& out, std::span<const int64_t> recv_rows) {
  if (!Hierarchical(in)) return flat_->AllToAllV(in, send_rows, out, recv_rows);
  internal::CheckAllToAllV(in, send_rows, out, recv_rows, size(), rank());
  // counts (L, size): the send counts of this node's members, by local index.
  Tensor mine = Tensor::FromVector(std::vector<int64_t>(send_rows.begin(), send_rows.end()),
                                   {1, size()});
  Tensor all = Tensor::Empty({layout_.per_node, size()}, DType::kI64);
  if (device().is_cpu()) {
    intra_->AllGather(mine, all);
  } else {
    Tensor all_dev = Tensor::Empty(all.shape(), DType::kI64, device());
    intra_->AllGather(mine.To(device(), context()), all_dev);
    all = all_dev.To(Device::Cpu(), context());  // waits for the stream
  }
  Exchange(in, send_rows, all.ToVector<int64_t>(), out, recv_rows);
}

std::unique_ptr<Work> HierarchicalCommunicator::AllToAllVAsync(
    const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
    std::span<const int64_t> recv_rows) {
  if (!Hierarchical(in)) return flat_->AllToAllVAsync(in, send_rows, out, recv_rows);
  AllToAllV(in, send_rows, out, recv_rows);
  return CompletedWork();
}

void HierarchicalCommunicator::Exchange(const Tensor& in, std::span<const int64_t> send_rows,
                                        const std::vector<int64_t>& counts, Tensor& out,
                                        std::span<const int64_t> recv_rows) {
  const int g = size(), nodes = layout_.nodes, per_node = layout_.per_node;
  const int me = rank(), l = layout_.local[me];
  const auto count = [&](int src_local, int dst) { return counts[src_local * g + dst]; };
  const std::vector<int64_t> in_off = Offsets(send_rows), out_off = Offsets(recv_rows);
  DeviceContext* ctx = context();

  // Step 1 (inside the node): in's blocks ordered by (destination local index, node).
  std::vector<Block> blocks;
  std::vector<int64_t> send1(per_node, 0), recv1(per_node, 0);
  int64_t rows1 = 0;
  for (int lp = 0; lp < per_node; ++lp) {
    for (int np = 0; np < nodes; ++np) {
      const int d = layout_.MemberAt(np, lp);
      blocks.push_back({in_off[d], rows1, send_rows[d]});
      rows1 += send_rows[d];
      send1[lp] += send_rows[d];
    }
  }
  const Tensor sent1 = Reordered(in, rows1, blocks, ctx);
  // From local member ls: its rows for (n', l), ordered by n'.
  int64_t got1 = 0;
  for (int ls = 0; ls < per_node; ++ls) {
    for (int np = 0; np < nodes; ++np) recv1[ls] += count(ls, layout_.MemberAt(np, l));
    got1 += recv1[ls];
  }
  Tensor received1 = EmptyRows(in, got1);
  intra_->AllToAllV(sent1, send1, received1, recv1);

  // Step 2 (across nodes): (source local, destination node) -> (destination node, source
  // local), one block per destination node.
  std::vector<int64_t> src_off(per_node * nodes);
  int64_t off = 0;
  for (int ls = 0; ls < per_node; ++ls) {
    for (int np = 0; np < nodes; ++np) {
      src_off[ls * nodes + np] = off;
      off += count(ls, layout_.MemberAt(np, l));
    }
  }
  blocks.clear();
  std::vector<int64_t> send2(nodes, 0), recv2(nodes, 0);
  off = 0;
  for (int np = 0; np < nodes; ++np) {
    for (int ls = 0; ls < per_node; ++ls) {
      const int64_t rows = count(ls, layout_.MemberAt(np, l));
      blocks.push_back({src_off[ls * nodes + np], off, rows});
      off += rows;
      send2[np] += rows;
    }
  }
  const Tensor sent2 = Reordered(received1, got1, blocks, ctx);
  // From node ns: the rows of its members (ns, ls) for me, ordered by ls; then into the
  // flat order, by source member.
  blocks.clear();
  off = 0;
  for (int ns = 0; ns < nodes; ++ns) {
    for (int ls = 0; ls < per_node; ++ls) {
      const int s = layout_.MemberAt(ns, ls);
      blocks.push_back({off, out_off[s], recv_rows[s]});
      off += recv_rows[s];
      recv2[ns] += recv_rows[s];
    }
  }
  if (IsIdentity(blocks)) {
    inter_->AllToAllV(sent2, send2, out, recv2);
    return;
  }
  Tensor received2 = EmptyRows(out, out.dim(0));
  inter_->AllToAllV(sent2, send2, received2, recv2);
  MoveRows(received2, out, blocks, ctx);
}

}  // namespace switchyard::dist
