#include "engine/dist/ordered_sum.h"

#include "engine/core/check.h"
#include "kernels/elementwise.h"

namespace switchyard::dist {
namespace {

// out = a + b elementwise: kernels::Add for f32 (any device), a host loop for f64. out may
// be a or b.
void AddInto(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx) {
  if (out.dtype() == DType::kF32) {
    kernels::Add(a, b, out, ctx);
    return;
  }
  SY_CHECK(out.device().is_cpu()) << "a tree sum of f64 tensors runs on the host, got "
                                  << out.DebugString();
  const double* x = a.data<double>();
  const double* y = b.data<double>();
  double* z = out.data<double>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) z[i] = x[i] + y[i];
}

// The tree over the size() equal pieces of `pieces` ((size * c,) on comm's device), in
// order, summed in place: each node of the tree is kept in the slot of its first leaf, so
// no buffer beyond the received pieces is needed. Returns the (c,) slice holding the sum.
// (a + b == b + a in IEEE arithmetic, so the bits are TreeAccumulator's.) f64 on a device
// is summed on the host and comes back as a new tensor.
Tensor TreeOfPieces(Tensor& pieces, int size, int64_t c, DeviceContext* ctx) {
  if (!pieces.device().is_cpu() && pieces.dtype() != DType::kF32) {
    const Tensor host = pieces.To(Device::Cpu(), ctx);
    TreeAccumulator tree;
    for (int s = 0; s < size; ++s) tree.Add(host.Slice(s * c, (s + 1) * c));
    return tree.Result().To(pieces.device(), ctx);
  }
  auto slot = [&](int s) { return pieces.Slice(s * c, (s + 1) * c); };
  std::vector<std::pair<int, int>> stack;  // (level, slot of the node's first leaf)
  for (int s = 0; s < size; ++s) {
    std::pair<int, int> node{0, s};
    while (!stack.empty() && stack.back().first == node.first) {
      const int lower = stack.back().second;
      stack.pop_back();
      Tensor into = slot(lower);
      AddInto(into, slot(node.second), into, ctx);
      node = {node.first + 1, lower};
    }
    stack.push_back(node);
  }
  // Fold from the top: sum = node[k-1] + sum, right to left.
  int sum = stack.back().second;
  for (size_t i = stack.size() - 1; i-- > 0;) {
    Tensor into = slot(stack[i].second);
    AddInto(into, slot(sum), into, ctx);
    sum = stack[i].second;
  }
  return slot(sum);
}

// An ordered all-reduce (or, with `out` defined, reduce-scatter into out) with its
// all-to-all in flight (see OrderedAllReduce).
class OrderedAllReduceWork final : public Work {
 public:
  OrderedAllReduceWork(Communicator& comm, const Tensor& t, DeviceContext* ctx, Tensor out = Tensor(),
                       bool accumulate = false)
      : comm_(comm), flat_(t.Reshape({t.numel()})), ctx_(ctx), out_(std::move(out)),
        accumulate_(accumulate) {
    const int size = comm.size();
    chunks_ = OrderedChunks(flat_.numel(), size);
    mine_ = chunks_[comm.rank()];
    const std::vector<int64_t> from_each(size, mine_);
    // (size * mine_,): rank s's chunk `rank` at [s * mine_, (s + 1) * mine_).
    pieces_ = Tensor::Empty({size * mine_}, t.dtype(), t.device());
    exchange_ = comm.AllToAllVAsync(flat_, chunks_, pieces_, from_each);
  }
  ~OrderedAllReduceWork() override { Wait(); }

  void Wait() override {
    if (done_) return;
    done_ = true;
    exchange_->Wait();
    exchange_.reset();
    // The pieces are summed where they arrived; they go once the sum is used.
    Tensor sum = mine_ > 0 ? TreeOfPieces(pieces_, comm_.size(), mine_, ctx_)
                           : Tensor::Empty({0}, flat_.dtype(), flat_.device());
    if (out_.defined()) {
      if (mine_ > 0 && accumulate_) {
        AddInto(out_, sum, out_, ctx_);
      } else if (mine_ > 0) {
        out_.CopyFrom(sum, ctx_);
      }
    } else {
      comm_.AllGatherV(sum, flat_, chunks_);
    }
    pieces_ = Tensor();
  }
  // The sum needs a collective after the exchange, so only a waited op is complete.
  bool Test() override { return done_; }

 private:
  Communicator& comm_;
  Tensor flat_;  // (numel,) view of the caller's t
  DeviceContext* ctx_;
  std::vector<int64_t> chunks_;  // elements of each rank's chunk
  int64_t mine_ = 0;             // chunks_[rank]
  Tensor out_;                   // reduce-scatter: (chunks_[rank],)
  bool accumulate_ = false;      // reduce-scatter: out_ += the sum
  Tensor pieces_;
  std::unique_ptr<Work> exchange_;
  bool done_ = false;
};

}  // namespace

std::vector<int64_t> OrderedChunks(int64_t n, int size) {
  std::vector<int64_t> chunks(size, n / size);
  for (int j = 0; j < n % size; ++j) ++chunks[j];
  return chunks;
}

// ---- TreeAccumulator --------------------------------------------------------------------

Tensor TreeAccumulator::TakeBuffer(const Tensor& like) {
  if (!spare_.empty() && (spare_.back().shape() != like.shape() ||
                          spare_.back().dtype() != like.dtype() ||
                          spare_.back().device() != like.device())) {
    spare_.clear();  // leaves of another shape since the last Reset
  }
  if (spare_.empty()) return Tensor::Empty(like.shape(), like.dtype(), like.device());
  Tensor buffer = std::move(spare_.back());
  spare_.pop_back();
  return buffer;
}

void TreeAccumulator::Add(const Tensor& leaf) {
  SY_CHECK(leaf.defined() && (leaf.dtype() == DType::kF32 ||
                              (leaf.dtype() == DType::kF64 && leaf.device().is_cpu())))
      << "TreeAccumulator sums f32 tensors (f64 on the host), got " << leaf.DebugString();
  if (!stack_.empty()) {
    const Tensor& first = stack_.front().value;
    SY_CHECK(leaf.shape() == first.shape() && leaf.dtype() == first.dtype() &&
             leaf.device() == first.device())
        << "TreeAccumulator: leaf " << leaf.DebugString() << " after " << first.DebugString();
  }
  Node node{0, TakeBuffer(leaf)};
  node.value.CopyFrom(leaf, ctx_);
  while (!stack_.empty() && stack_.back().level == node.level) {
    Node lower = std::move(stack_.back());
    stack_.pop_back();
    AddInto(lower.value, node.value, lower.value, ctx_);
    spare_.push_back(std::move(node.value));
    node = Node{lower.level + 1, std::move(lower.value)};
  }
  stack_.push_back(std::move(node));
  ++count_;
}

Tensor TreeAccumulator::Result() const {
  SY_CHECK(!stack_.empty()) << "TreeAccumulator::Result with no leaf";
  const Tensor& top = stack_.back().value;
  if (stack_.size() == 1) return top.Clone(ctx_);
  // Fold from the top: sum = node[k-1] + sum, right to left.
  Tensor sum = Tensor::Empty(top.shape(), top.dtype(), top.device());
  AddInto(stack_[stack_.size() - 2].value, top, sum, ctx_);
  for (size_t i = stack_.size() - 2; i-- > 0;) AddInto(stack_[i].value, sum, sum, ctx_);
  return sum;
}

void TreeAccumulator::Reset() {
  for (Node& node : stack_) spare_.push_back(std::move(node.value));
  stack_.clear();
  count_ = 0;
}

// ---- Over ranks -------------------------------------------------------------------------

void OrderedAllReduce(Communicator& comm, Tensor& t, DeviceContext* ctx) {
  OrderedAllReduceAsync(comm, t, ctx)->Wait();
}

std::unique_ptr<Work> OrderedAllReduceAsync(Communicator& comm, Tensor& t, DeviceContext* ctx) {
  internal::CheckTensor(t, comm.device(), "OrderedAllReduce");
  SY_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF64)
      << "OrderedAllReduce sums f32 or f64, got " << t.DebugString();
  if (comm.size() == 1 || t.numel() == 0) return CompletedWork();
  return std::make_unique<OrderedAllReduceWork>(comm, t, ctx != nullptr ? ctx : comm.context());
}

void OrderedReduceScatter(Communicator& comm, const Tensor& t, Tensor& out, DeviceContext* ctx,
                          bool accumulate) {
  OrderedReduceScatterAsync(comm, t, out, ctx, accumulate)->Wait();
}

std::unique_ptr<Work> OrderedReduceScatterAsync(Communicator& comm, const Tensor& t, Tensor& out,
                                                DeviceContext* ctx, bool accumulate) {
  internal::CheckTensor(t, comm.device(), "OrderedReduceScatter");
  internal::CheckTensor(out, comm.device(), "OrderedReduceScatter");
  SY_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF64)
      << "OrderedReduceScatter sums f32 or f64, got " << t.DebugString();
  SY_CHECK(out.dtype() == t.dtype() && out.numel() == OrderedChunks(t.numel(), comm.size())[comm.rank()])
      << "OrderedReduceScatter: out " << out.DebugString() << " is not rank " << comm.rank()
      << "'s chunk of " << t.DebugString();
  DeviceContext* on = ctx != nullptr ? ctx : comm.context();
  if (comm.size() == 1) {
    Tensor flat = t.Reshape({t.numel()});
    if (accumulate) {
      AddInto(out, flat, out, on);
    } else {
      out.CopyFrom(flat, on);
    }
    return CompletedWork();
  }
  if (t.numel() == 0) return CompletedWork();
  return std::make_unique<OrderedAllReduceWork>(comm, t, on, out.Reshape({out.numel()}), accumulate);
}

std::vector<double> AllReduceDoubles(Communicator& comm, std::span<const double> values) {
  std::vector<double> sums(values.begin(), values.end());
  if (comm.size() == 1 || sums.empty()) return sums;
  Tensor t = Tensor::FromVector(sums, {static_cast<int64_t>(sums.size())});
  if (comm.device().is_cpu()) {
    OrderedAllReduce(comm, t);
    return t.ToVector<double>();
  }
  Tensor on_device = t.To(comm.device(), comm.context());
  OrderedAllReduce(comm, on_device);
  return on_device.To(Device::Cpu(), comm.context()).ToVector<double>();
}

}  // namespace switchyard::dist
