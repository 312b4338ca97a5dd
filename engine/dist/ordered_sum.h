// Sums in one canonical order, so that a result does not depend on how the summands were
// spread over ranks (../shared/MODEL.md section 4: bit-identical where the math allows).
//
// The order (PairwiseTreeSum) is the pairwise tree of a streaming binary counter over the
// leaves in their global order: each leaf is pushed as a node of level 0; while the two top
// nodes have the same level they are replaced by (lower + upper) at the next level; at the
// end the stack is folded from the top, node[k-1] + node[k], right to left. For 4 leaves
// that is (0 + 1) + (2 + 3); for 7 it is ((0 + 1) + (2 + 3)) + ((4 + 5) + 6).
//
// The property it is chosen for: when M = D * A leaves with A a power of two are held A
// consecutive ones per rank by D ranks (any D, not only powers of two), summing each rank's
// A leaves with the tree and then the D rank results with the same tree is exactly the tree
// over all M leaves, bit for bit (each rank's A leaves are one whole subtree of level
// log2(A), and the counter over the D subtrees is the counter over D leaves). So dp ranks
// that each sum their micro-batches' gradients with TreeAccumulator, followed by
// OrderedAllReduce over dp, equal one rank summing all dp * A micro-batches.
// (tests/dist/ordered_sum_test.cc checks it bitwise for D in {1, 2, 3, 5, 6, 7, 8, 12} and
// A in {1, 2, 4, 8, 16}, and that ranks of 3 leaves break it.)
//
//   PairwiseTreeSum    the tree over values of any type with +
//   TreeAccumulator    the tree over tensors added one at a time (at most log2(M) + 1 live)
//   OrderedAllReduce   the tree over the ranks of a communicator, in rank order, on every
//                      rank: an all-to-all of 1/size of the elements, the tree locally, and
//                      an uneven all-gather (the volume of a ring all-reduce)
//   OrderedReduceScatter  the same sums, each rank keeping only its chunk (ZeRO-2/3):
//                      bit-identical to that chunk of OrderedAllReduce
//   AllReduceDoubles   the tree over ranks of a few doubles (declared in communicator.h)
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::dist {

// The tree over leaves[0..M), in order, with T's operator+; T{} for no leaf.
template <typename T>
T PairwiseTreeSum(std::span<const T> leaves) {
  std::vector<std::pair<int, T>> stack;  // (level, partial sum)
  for (const T& leaf : leaves) {
    std::pair<int, T> node{0, leaf};
    while (!stack.empty() && stack.back().first == node.first) {
      node = {node.first + 1, stack.back().second + node.second};
      stack.pop_back();
    }
    stack.push_back(std::move(node));
  }
  if (stack.empty()) return T{};
  T sum = stack.back().second;
  for (size_t i = stack.size() - 1; i-- > 0;) sum = stack[i].second + sum;
  return sum;
}

// The tree over doubles (0 for none).
inline double TreeSumDoubles(std::span<const double> values) {
  return PairwiseTreeSum<double>(values);
}

// The tree over tensors of one shape, dtype and device, added in order, elementwise.
// f32 on the host or a device (kernels::Add: exact IEEE sums, so the CPU and CUDA agree
// bit for bit); f64 on the host. Keeps at most floor(log2(count)) + 1 buffers of the
// leaf's size, and keeps them over Reset for the next round of leaves of that shape.
class TreeAccumulator {
 public:
  // ctx orders the copies and sums of device tensors (null on the host).
  explicit TreeAccumulator(DeviceContext* ctx = nullptr) : ctx_(ctx) {}

  // Adds the next leaf (copied; the caller may reuse it at once).
  void Add(const Tensor& leaf);
  // The tree sum of every leaf so far, in a new tensor; needs at least one leaf.
  Tensor Result() const;
  // Leaves added since construction or the last Reset.
  int64_t count() const { return count_; }
  // Forgets the leaves (the buffers stay for reuse).
  void Reset();

 private:
  struct Node {
    int level;
    Tensor value;
  };
  // A buffer of the leaf's shape: a spare one, or a new one.
  Tensor TakeBuffer(const Tensor& like);

  DeviceContext* ctx_;
  std::vector<Node> stack_;    // levels strictly decrease from bottom to top
  std::vector<Tensor> spare_;  // buffers freed by merges
  int64_t count_ = 0;
};

// t (f32 or f64, any shape, on comm's device) becomes, on every rank, the tree sum over
// the ranks' t in rank order: bit-identical on every rank, and to a TreeAccumulator fed
// the ranks' tensors in rank order. Every rank passes the same shape. Collective over comm;
// a group of size 1 leaves t unchanged. ctx orders the local sums of device tensors (null:
// comm.context()). f64 on a device is summed on the host (a copy of 1/size of t).
//
// How: t's elements are cut into size() near-equal chunks (the first numel % size one
// element longer); an AllToAllV gives rank j chunk j of every rank; rank j sums those
// size() pieces with the tree; an AllGatherV puts the summed chunks back into t on every
// rank. Each rank sends and receives 2 (size - 1) / size of t, as a ring all-reduce does.
void OrderedAllReduce(Communicator& comm, Tensor& t, DeviceContext* ctx = nullptr);
// The same with the all-to-all started and in flight; Wait() sums and all-gathers (a
// collective: every rank waits for its ordered all-reduces in the same order). t must stay
// alive and untouched until then (the Work holds its buffer).
std::unique_ptr<Work> OrderedAllReduceAsync(Communicator& comm, Tensor& t,
                                            DeviceContext* ctx = nullptr);

// The chunks OrderedAllReduce cuts n elements into over `size` ranks: near-equal, the
// first n % size one element longer; rank j owns chunk j.
std::vector<int64_t> OrderedChunks(int64_t n, int size);

// out (chunk comm.rank() of OrderedChunks(t.numel(), size), same dtype, on comm's device)
// becomes that chunk of the ordered sum over the ranks' t: the bits OrderedAllReduce would
// leave there. t is not changed. Volume: (size - 1) / size of t each way, half an
// all-reduce. Collective; a group of size 1 copies. accumulate: out becomes out + that
// chunk instead (gradient accumulation into a ZeRO-2/3 shard, micro-batch by micro-batch).
// Workspace: the received pieces, t's size rounded up to a multiple of size (the tree sums
// them where they arrived), while in flight; nothing else.
void OrderedReduceScatter(Communicator& comm, const Tensor& t, Tensor& out,
                          DeviceContext* ctx = nullptr, bool accumulate = false);
// The same with the all-to-all in flight; Wait() sums into out. t and out must stay alive
// and untouched until then.
std::unique_ptr<Work> OrderedReduceScatterAsync(Communicator& comm, const Tensor& t, Tensor& out,
                                                DeviceContext* ctx = nullptr,
                                                bool accumulate = false);

}  // namespace switchyard::dist
