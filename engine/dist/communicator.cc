// The parts of the Communicator interface every backend shares (argument checks,
// ToString) and the size-1 local communicator.
#include "engine/dist/communicator.h"

#include <map>
#include <numeric>
#include <sstream>

#include "engine/core/check.h"
#include "engine/core/device_context.h"

namespace switchyard::dist {

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

Work::~Work() = default;

namespace {

class CompletedWorkImpl final : public Work {
 public:
  void Wait() override {}
  bool Test() override { return true; }
};

}  // namespace

std::unique_ptr<Work> CompletedWork() { return std::make_unique<CompletedWorkImpl>(); }

Communicator::~Communicator() = default;

std::string Communicator::ToString() const {
  std::ostringstream out;
  out << backend() << "(rank " << rank() << " of " << size() << ", world [";
  std::vector<int> world = world_ranks();
  for (size_t i = 0; i < world.size(); ++i) out << (i ? ", " : "") << world[i];
  out << "], " << device().ToString() << ")";
  return out.str();
}

// ---- Argument checks -------------------------------------------------------------------

namespace internal {
namespace {

// The shape without dim 0: "(4, 8)" for (6, 4, 8).
Shape RowShape(const Tensor& t) { return Shape(t.shape().begin() + 1, t.shape().end()); }

void CheckSameDType(const Tensor& a, const Tensor& b, std::string_view op) {
  SY_CHECK(a.dtype() == b.dtype()) << op << ": in is " << a.DebugString() << " but out is "
                                   << b.DebugString();
}

void CheckAtLeast1d(const Tensor& t, std::string_view op) {
  SY_CHECK_GE(t.ndim(), 1) << op << " needs tensors with a dim 0, got " << t.DebugString();
}

std::string CountsString(std::span<const int64_t> counts) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < counts.size(); ++i) out << (i ? ", " : "") << counts[i];
  out << ']';
  return out.str();
}

}  // namespace

int64_t Rows(const Tensor& t) { return t.ndim() == 0 ? 1 : t.dim(0); }

void CheckTensor(const Tensor& t, Device device, std::string_view op) {
  SY_CHECK(t.defined()) << op << ": undefined tensor";
  SY_CHECK(t.device() == device) << op << ": tensor " << t.DebugString()
                                 << " on a communicator of " << device.ToString();
}

void CheckReduce(const Tensor& t, ReduceOp op) {
  SY_CHECK(op != ReduceOp::kAvg || IsFloating(t.dtype()))
      << "ReduceOp::kAvg needs a floating dtype, got " << t.DebugString();
}

void CheckAllGather(const Tensor& in, const Tensor& out, int size) {
  CheckAtLeast1d(in, "AllGather");
  CheckSameDType(in, out, "AllGather");
  SY_CHECK(out.ndim() == in.ndim() && out.dim(0) == size * in.dim(0) &&
           RowShape(out) == RowShape(in))
      << "AllGather over " << size << " ranks: in " << ShapeString(in.shape())
      << " needs out (" << size << "*" << in.dim(0) << ", ...), got "
      << ShapeString(out.shape());
}

void CheckReduceScatter(const Tensor& in, const Tensor& out, int size) {
  CheckAtLeast1d(out, "ReduceScatter");
  CheckSameDType(in, out, "ReduceScatter");
  SY_CHECK(out.ndim() == in.ndim() && in.dim(0) == size * out.dim(0) &&
           RowShape(out) == RowShape(in))
      << "ReduceScatter over " << size << " ranks: in " << ShapeString(in.shape())
      << " needs out (" << in.dim(0) << "/" << size << ", ...), got "
      << ShapeString(out.shape());
}

void CheckAllToAll(const Tensor& in, const Tensor& out, int size) {
  CheckAtLeast1d(in, "AllToAll");
  CheckSameDType(in, out, "AllToAll");
  SY_CHECK(in.shape() == out.shape() && in.dim(0) % size == 0)
      << "AllToAll over " << size << " ranks needs in and out of one shape (" << size
      << "*n, ...), got in " << ShapeString(in.shape()) << " and out "
      << ShapeString(out.shape());
}

void CheckAllToAllV(const Tensor& in, std::span<const int64_t> send_rows, const Tensor& out,
                    std::span<const int64_t> recv_rows, int size, int rank) {
  CheckAtLeast1d(in, "AllToAllV");
  CheckAtLeast1d(out, "AllToAllV");
  CheckSameDType(in, out, "AllToAllV");
  SY_CHECK(out.ndim() == in.ndim() && RowShape(out) == RowShape(in))
      << "AllToAllV: rows of in " << ShapeString(in.shape()) << " and out "
      << ShapeString(out.shape()) << " differ";
  SY_CHECK(static_cast<int>(send_rows.size()) == size &&
           static_cast<int>(recv_rows.size()) == size)
      << "AllToAllV over " << size << " ranks: send_rows " << CountsString(send_rows)
      << ", recv_rows " << CountsString(recv_rows) << " need " << size << " entries each";
  for (int i = 0; i < size; ++i) {
    SY_CHECK(send_rows[i] >= 0 && recv_rows[i] >= 0)
        << "AllToAllV: negative count in send_rows " << CountsString(send_rows)
        << " or recv_rows " << CountsString(recv_rows);
  }
  const int64_t sent = std::accumulate(send_rows.begin(), send_rows.end(), int64_t{0});
  const int64_t received = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
  SY_CHECK(sent == in.dim(0)) << "AllToAllV: send_rows " << CountsString(send_rows)
                              << " sum to " << sent << " but in is "
                              << ShapeString(in.shape());
  SY_CHECK(received == out.dim(0)) << "AllToAllV: recv_rows " << CountsString(recv_rows)
                                   << " sum to " << received << " but out is "
                                   << ShapeString(out.shape());
  SY_CHECK(send_rows[rank] == recv_rows[rank])
      << "AllToAllV: rank " << rank << " sends itself " << send_rows[rank]
      << " rows but receives " << recv_rows[rank] << " from itself";
}

std::vector<int64_t> CheckRowCounts(std::span<const int64_t> rows, int size,
                                    std::string_view op) {
  SY_CHECK(static_cast<int>(rows.size()) == size)
      << op << " over " << size << " ranks: rows " << CountsString(rows) << " need " << size
      << " entries";
  std::vector<int64_t> offsets(size + 1, 0);
  for (int r = 0; r < size; ++r) {
    SY_CHECK(rows[r] >= 0) << op << ": negative count in rows " << CountsString(rows);
    offsets[r + 1] = offsets[r] + rows[r];
  }
  return offsets;
}

std::vector<int64_t> CheckAllGatherV(const Tensor& in, const Tensor& out,
                                     std::span<const int64_t> rows, int size, int rank) {
  CheckAtLeast1d(in, "AllGatherV");
  CheckAtLeast1d(out, "AllGatherV");
  CheckSameDType(in, out, "AllGatherV");
  std::vector<int64_t> offsets = CheckRowCounts(rows, size, "AllGatherV");
  SY_CHECK(out.ndim() == in.ndim() && RowShape(out) == RowShape(in) &&
           in.dim(0) == rows[rank] && out.dim(0) == offsets[size])
      << "AllGatherV with rows " << CountsString(rows) << " on rank " << rank << " needs in ("
      << rows[rank] << ", ...) and out (" << offsets[size] << ", ...) of equal rows, got in "
      << ShapeString(in.shape()) << " and out " << ShapeString(out.shape());
  return offsets;
}

std::vector<int64_t> CheckReduceScatterV(const Tensor& in, const Tensor& out,
                                         std::span<const int64_t> rows, int size, int rank) {
  CheckAtLeast1d(in, "ReduceScatterV");
  CheckAtLeast1d(out, "ReduceScatterV");
  CheckSameDType(in, out, "ReduceScatterV");
  std::vector<int64_t> offsets = CheckRowCounts(rows, size, "ReduceScatterV");
  SY_CHECK(out.ndim() == in.ndim() && RowShape(out) == RowShape(in) &&
           in.dim(0) == offsets[size] && out.dim(0) == rows[rank])
      << "ReduceScatterV with rows " << CountsString(rows) << " on rank " << rank
      << " needs in (" << offsets[size] << ", ...) and out (" << rows[rank]
      << ", ...) of equal rows, got in " << ShapeString(in.shape()) << " and out "
      << ShapeString(out.shape());
  return offsets;
}

void CheckPeer(int peer, int size, int rank, std::string_view op) {
  SY_CHECK(peer >= 0 && peer < size && peer != rank)
      << op << " between rank " << rank << " and rank " << peer << " in a group of " << size;
}

std::vector<std::pair<size_t, size_t>> CheckBatch(std::span<const P2POp> ops, Device device,
                                                  int size, int rank) {
  // Per tag, the indices of the sends to self and of the receives from self, in order.
  std::map<int, std::pair<std::vector<size_t>, std::vector<size_t>>> self;
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const char* what = op.kind == P2POp::kSend ? "BatchSendRecv send" : "BatchSendRecv recv";
    CheckTensor(op.tensor, device, what);
    SY_CHECK(op.peer >= 0 && op.peer < size)
        << what << " " << i << " with rank " << op.peer << " in a group of " << size;
    SY_CHECK(op.tag >= 0) << what << " " << i << " has a negative tag " << op.tag;
    if (op.peer != rank) continue;
    auto& [sends, recvs] = self[op.tag];
    (op.kind == P2POp::kSend ? sends : recvs).push_back(i);
  }
  std::vector<std::pair<size_t, size_t>> pairs;
  for (const auto& [tag, lists] : self) {
    const auto& [sends, recvs] = lists;
    SY_CHECK(sends.size() == recvs.size())
        << "BatchSendRecv: rank " << rank << " sends itself " << sends.size()
        << " messages of tag " << tag << " but receives " << recvs.size();
    for (size_t k = 0; k < sends.size(); ++k) {
      const Tensor& from = ops[sends[k]].tensor;
      const Tensor& to = ops[recvs[k]].tensor;
      SY_CHECK(from.dtype() == to.dtype() && from.numel() == to.numel())
          << "BatchSendRecv: rank " << rank << " sends itself " << from.DebugString()
          << " into " << to.DebugString();
      pairs.emplace_back(sends[k], recvs[k]);
    }
  }
  return pairs;
}

std::pair<int, int> CheckSplit(const std::vector<std::vector<int>>& groups, int size,
                               int rank) {
  std::vector<int> seen(size, 0);
  std::pair<int, int> mine{-1, -1};
  for (size_t g = 0; g < groups.size(); ++g) {
    SY_CHECK(!groups[g].empty()) << "Split: group " << g << " is empty";
    for (size_t i = 0; i < groups[g].size(); ++i) {
      const int r = groups[g][i];
      SY_CHECK(r >= 0 && r < size) << "Split: rank " << r << " in group " << g
                                   << " is outside a communicator of size " << size;
      SY_CHECK(seen[r] == 0) << "Split: rank " << r << " is in more than one group";
      seen[r] = 1;
      if (r == rank) mine = {static_cast<int>(g), static_cast<int>(i)};
    }
  }
  SY_CHECK(mine.first >= 0) << "Split: rank " << rank << " is in no group";
  return mine;
}

void CopyIfDistinct(const Tensor& in, Tensor& out, DeviceContext* ctx) {
  if (in.numel() == 0 || in.raw_data() == out.raw_data()) return;
  out.CopyFrom(in, ctx);
}

}  // namespace internal

// ---- LocalCommunicator -----------------------------------------------------------------

namespace {

using internal::CheckTensor;

// A group of one process: collectives are copies. For device tensors the copies are
// ordered on ctx's stream.
class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(Device device, int world_rank, DeviceContext* ctx)
      : device_(device), world_rank_(world_rank), ctx_(ctx) {
    SY_CHECK(device.is_cpu() || (ctx != nullptr && ctx->device() == device))
        << "a local communicator on " << device.ToString()
        << " needs that device's DeviceContext";
  }

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<int> world_ranks() const override { return {world_rank_}; }
  Device device() const override { return device_; }
  std::string_view backend() const override { return "local"; }
  DeviceContext* context() const override { return ctx_; }

  void AllReduce(Tensor& t, ReduceOp op) override {
    CheckTensor(t, device_, "AllReduce");
    internal::CheckReduce(t, op);
  }
  void AllGather(const Tensor& in, Tensor& out) override {
    CheckTensor(in, device_, "AllGather");
    CheckTensor(out, device_, "AllGather");
    internal::CheckAllGather(in, out, 1);
    internal::CopyIfDistinct(in, out, ctx_);
  }
  void ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    CheckTensor(in, device_, "ReduceScatter");
    CheckTensor(out, device_, "ReduceScatter");
    internal::CheckReduceScatter(in, out, 1);
    internal::CheckReduce(in, op);
    internal::CopyIfDistinct(in, out, ctx_);
  }
  void AllToAll(const Tensor& in, Tensor& out) override {
    CheckTensor(in, device_, "AllToAll");
    CheckTensor(out, device_, "AllToAll");
    internal::CheckAllToAll(in, out, 1);
    internal::CopyIfDistinct(in, out, ctx_);
  }
  void AllToAllV(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                 std::span<const int64_t> recv_rows) override {
    CheckTensor(in, device_, "AllToAllV");
    CheckTensor(out, device_, "AllToAllV");
    internal::CheckAllToAllV(in, send_rows, out, recv_rows, 1, 0);
    internal::CopyIfDistinct(in, out, ctx_);
  }
  void AllGatherV(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override {
    CheckTensor(in, device_, "AllGatherV");
    CheckTensor(out, device_, "AllGatherV");
    internal::CheckAllGatherV(in, out, rows, 1, 0);
    internal::CopyIfDistinct(in, out, ctx_);
  }
  void ReduceScatterV(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                      ReduceOp op) override {
    CheckTensor(in, device_, "ReduceScatterV");
    CheckTensor(out, device_, "ReduceScatterV");
    internal::CheckReduceScatterV(in, out, rows, 1, 0);
    internal::CheckReduce(in, op);
    internal::CopyIfDistinct(in, out, ctx_);
  }
  void Broadcast(Tensor& t, int root) override {
    CheckTensor(t, device_, "Broadcast");
    SY_CHECK_EQ(root, 0) << "Broadcast root outside a group of size 1";
  }
  void Send(const Tensor& t, int peer, int tag) override {
    SY_LOG(FATAL) << "Send to rank " << peer << " in a group of size 1";
  }
  void Recv(Tensor& t, int peer, int tag) override {
    SY_LOG(FATAL) << "Recv from rank " << peer << " in a group of size 1";
  }
  std::unique_ptr<Work> SendAsync(const Tensor& t, int peer, int tag) override {
    SY_LOG(FATAL) << "SendAsync to rank " << peer << " in a group of size 1";
    return nullptr;
  }
  std::unique_ptr<Work> RecvAsync(Tensor& t, int peer, int tag) override {
    SY_LOG(FATAL) << "RecvAsync from rank " << peer << " in a group of size 1";
    return nullptr;
  }
  // Only sends to self, each copied into its matching receive.
  std::unique_ptr<Work> BatchSendRecv(std::span<const P2POp> ops) override {
    for (const auto& [send, recv] : internal::CheckBatch(ops, device_, 1, 0)) {
      Tensor to = ops[recv].tensor;
      internal::CopyIfDistinct(ops[send].tensor, to, ctx_);
    }
    return CompletedWork();
  }
  void Barrier() override {
    if (ctx_ != nullptr) ctx_->Synchronize();
  }

  std::unique_ptr<Work> AllReduceAsync(Tensor& t, ReduceOp op) override {
    AllReduce(t, op);
    return CompletedWork();
  }
  std::unique_ptr<Work> AllGatherAsync(const Tensor& in, Tensor& out) override {
    AllGather(in, out);
    return CompletedWork();
  }
  std::unique_ptr<Work> ReduceScatterAsync(const Tensor& in, Tensor& out,
                                           ReduceOp op) override {
    ReduceScatter(in, out, op);
    return CompletedWork();
  }
  std::unique_ptr<Work> AllToAllVAsync(const Tensor& in, std::span<const int64_t> send_rows,
                                       Tensor& out,
                                       std::span<const int64_t> recv_rows) override {
    AllToAllV(in, send_rows, out, recv_rows);
    return CompletedWork();
  }

  std::unique_ptr<Communicator> Split(const std::vector<std::vector<int>>& groups) override {
    internal::CheckSplit(groups, 1, 0);
    return std::make_unique<LocalCommunicator>(device_, world_rank_, ctx_);
  }

 private:
  Device device_;
  int world_rank_;
  DeviceContext* ctx_;  // null for host tensors
};

}  // namespace

std::unique_ptr<Communicator> MakeLocalCommunicator(Device device, int world_rank,
                                                    DeviceContext* ctx) {
  return std::make_unique<LocalCommunicator>(device, world_rank, ctx);
}

}  // namespace switchyard::dist
