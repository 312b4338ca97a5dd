#include "engine/dist/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <deque>
#include <functional>

#include "engine/core/check.h"
#include "engine/dist/mpi_check.h"
#include "engine/dist/watchdog.h"

namespace switchyard::dist {
namespace {

using internal::CheckTensor;
using internal::Rows;

// The MPI type of one element; bf16 and f16 travel as 16-bit words (no reductions).
MPI_Datatype ElementType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return MPI_FLOAT;
    case DType::kI32: return MPI_INT32_T;
    case DType::kI64: return MPI_INT64_T;
    case DType::kU8: return MPI_UINT8_T;
    case DType::kF64: return MPI_DOUBLE;
    case DType::kBF16:
    case DType::kF16: return MPI_UINT16_T;
  }
  SY_LOG(FATAL) << "no MPI type for dtype " << static_cast<int>(dtype);
  return MPI_DATATYPE_NULL;
}

// The element type for a reduction; MPI has no bf16/f16 arithmetic.
MPI_Datatype ReduceType(const Tensor& t) {
  SY_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kF64 ||
           t.dtype() == DType::kI32 || t.dtype() == DType::kI64 || t.dtype() == DType::kU8)
      << "MPI reductions support f32, f64, i32, i64 and u8, got " << t.DebugString()
      << " (reduce host tensors in f32)";
  return ElementType(t.dtype());
}

MPI_Op MpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

// n as an MPI count, which is an int.
int ToCount(int64_t n, std::string_view what) {
  SY_CHECK(n >= 0 && n <= INT_MAX) << what << " of " << n << " does not fit an MPI count";
  return static_cast<int>(n);
}

// The kAvg division that follows the MPI sum (f32 and f64 are the floating reduce types).
template <typename T>
void DivideElements(Tensor& t, int size) {
  T* p = t.data<T>();
  const T divisor = static_cast<T>(size);
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] /= divisor;
}

void DivideBy(Tensor& t, int size) {
  if (t.dtype() == DType::kF64) {
    DivideElements<double>(t, size);
  } else {
    DivideElements<float>(t, size);
  }
}

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

}  // namespace

std::vector<int> MpiWorldRanks(MPI_Comm comm) {
  int size = 0;
  SY_MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Group group, world;
  SY_MPI_CHECK(MPI_Comm_group(comm, &group));
  SY_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> local(size), global(size);
  for (int i = 0; i < size; ++i) local[i] = i;
  SY_MPI_CHECK(MPI_Group_translate_ranks(group, size, local.data(), world, global.data()));
  SY_MPI_CHECK(MPI_Group_free(&group));
  SY_MPI_CHECK(MPI_Group_free(&world));
  return global;
}

// The MPI requests of one collective, the tensors and count arrays they use (kept alive
// until completion), and what runs once they complete (the kAvg division).
class MpiCommunicator::Request final : public Work {
 public:
  ~Request() override {
    if (!done_ && !MpiFinalized()) Wait();
  }

  void Wait() override {
    if (done_) return;
    if (!requests_.empty()) {
      const WatchdogScope watch(op_, seq_, group_, peers_);
      std::vector<MPI_Status> statuses(requests_.size());
      SY_MPI_CHECK(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(),
                               statuses.data()));
      for (const Receive& r : receives_) {
        int received = 0;
        SY_MPI_CHECK(MPI_Get_count(&statuses[r.index], r.type, &received));
        SY_CHECK_EQ(received, r.rows) << "Recv into " << r.tensor.DebugString()
                                      << " from rank " << r.peer
                                      << ": the message is shorter (or not whole rows)";
      }
    }
    if (finish_) finish_();
    done_ = true;
    requests_.clear();
    receives_.clear();
    tensors_.clear();
    counts_.clear();
    finish_ = nullptr;
  }

  // A slot for the next non-blocking call's request.
  MPI_Request* NewRequest() {
    requests_.push_back(MPI_REQUEST_NULL);
    return &requests_.back();
  }
  void Keep(const Tensor& t) { tensors_.push_back(t); }
  // The last request is a receive of `rows` rows of `type` into t: Wait checks its count.
  void ExpectRows(const Tensor& t, int rows, MPI_Datatype type, int peer) {
    receives_.push_back({requests_.size() - 1, rows, type, peer, t});
  }
  // An int array that must outlive the requests.
  std::vector<int>& Counts(size_t n) {
    counts_.emplace_back(n, 0);
    return counts_.back();
  }
  void OnDone(std::function<void()> finish) { finish_ = std::move(finish); }
  // What the watchdog names while Wait blocks.
  // peers: the world ranks a point-to-point request waits on (empty: the group).
  void Label(const char* op, uint64_t seq, const std::vector<int>& group,
             std::vector<int> peers = {}) {
    op_ = op;
    seq_ = seq;
    group_ = group;
    peers_ = std::move(peers);
  }

 private:
  struct Receive {
    size_t index;  // into requests_
    int rows;
    MPI_Datatype type;
    int peer;
    Tensor tensor;
  };

  bool done_ = false;
  const char* op_ = "request";
  uint64_t seq_ = 0;
  std::vector<int> group_;
  std::vector<int> peers_;
  std::vector<MPI_Request> requests_;
  std::vector<Receive> receives_;
  std::vector<Tensor> tensors_;
  std::deque<std::vector<int>> counts_;  // a deque: Counts() references stay valid
  std::function<void()> finish_;
};

std::unique_ptr<MpiCommunicator> MpiCommunicator::Duplicate(MPI_Comm comm) {
  MPI_Comm dup;
  SY_MPI_CHECK(MPI_Comm_dup(comm, &dup));
  return std::make_unique<MpiCommunicator>(dup, MpiWorldRanks(dup));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::vector<int> world_ranks)
    : comm_(comm), world_ranks_(std::move(world_ranks)) {
  SY_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  SY_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  SY_CHECK_EQ(static_cast<int>(world_ranks_.size()), size_);
}

MpiCommunicator::~MpiCommunicator() {
  if (MpiFinalized()) return;  // MPI_Finalize already released everything.
  for (auto& [key, type] : row_types_) MPI_Type_free(&type);
  MPI_Comm_free(&comm_);
}

MPI_Datatype MpiCommunicator::RowType(const Tensor& t) {
  const int64_t row_size = t.row_size();
  if (row_size == 1) return ElementType(t.dtype());
  auto key = std::make_pair(static_cast<int>(t.dtype()), row_size);
  auto it = row_types_.find(key);
  if (it != row_types_.end()) return it->second;
  MPI_Datatype type;
  SY_MPI_CHECK(MPI_Type_contiguous(ToCount(row_size, "row size"), ElementType(t.dtype()),
                                   &type));
  SY_MPI_CHECK(MPI_Type_commit(&type));
  row_types_.emplace(key, type);
  return type;
}

// ---- Reductions -------------------------------------------------------------------------

std::unique_ptr<MpiCommunicator::Request> MpiCommunicator::StartAllReduce(Tensor& t,
                                                                          ReduceOp op,
                                                                          bool async) {
  CheckTensor(t, device(), "AllReduce");
  internal::CheckReduce(t, op);
  const MPI_Datatype type = ReduceType(t);
  auto request = std::make_unique<Request>();
  request->Keep(t);
  // Predefined MPI ops need predefined types, so big tensors go in chunks of int counts.
  constexpr int64_t kChunk = int64_t{1} << 30;
  char* base = static_cast<char*>(t.raw_data());
  const size_t elem = SizeOf(t.dtype());
  for (int64_t begin = 0, n = t.numel(); begin < n; begin += kChunk) {
    const int count = static_cast<int>(std::min(kChunk, n - begin));
    void* p = base + begin * elem;
    if (async) {
      SY_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, p, count, type, MpiOp(op), comm_,
                                  request->NewRequest()));
    } else {
      SY_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, p, count, type, MpiOp(op), comm_));
    }
  }
  if (op == ReduceOp::kAvg) request->OnDone([t, size = size_]() mutable { DivideBy(t, size); });
  return request;
}

std::unique_ptr<MpiCommunicator::Request> MpiCommunicator::StartReduceScatter(
    const Tensor& in, Tensor& out, ReduceOp op, bool async) {
  CheckTensor(in, device(), "ReduceScatter");
  CheckTensor(out, device(), "ReduceScatter");
  internal::CheckReduceScatter(in, out, size_);
  internal::CheckReduce(in, op);
  const MPI_Datatype type = ReduceType(in);
  const int count = ToCount(out.numel(), "ReduceScatter block");
  auto request = std::make_unique<Request>();
  request->Keep(in);
  request->Keep(out);
  if (async) {
    SY_MPI_CHECK(MPI_Ireduce_scatter_block(in.raw_data(), out.raw_data(), count, type,
                                           MpiOp(op), comm_, request->NewRequest()));
  } else {
    SY_MPI_CHECK(MPI_Reduce_scatter_block(in.raw_data(), out.raw_data(), count, type,
                                          MpiOp(op), comm_));
  }
  if (op == ReduceOp::kAvg) {
    request->OnDone([out, size = size_]() mutable { DivideBy(out, size); });
  }
  return request;
}

void MpiCommunicator::AllReduce(Tensor& t, ReduceOp op) {
  const WatchdogScope watch("all_reduce", ++seq_, world_ranks_);
  StartAllReduce(t, op, false)->Wait();
}

void MpiCommunicator::ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) {
  const WatchdogScope watch("reduce_scatter", ++seq_, world_ranks_);
  StartReduceScatter(in, out, op, false)->Wait();
}

std::unique_ptr<Work> MpiCommunicator::AllReduceAsync(Tensor& t, ReduceOp op) {
  auto request = StartAllReduce(t, op, true);
  request->Label("all_reduce", ++seq_, world_ranks_);
  return request;
}

std::unique_ptr<Work> MpiCommunicator::ReduceScatterAsync(const Tensor& in, Tensor& out,
                                                          ReduceOp op) {
  auto request = StartReduceScatter(in, out, op, true);
  request->Label("reduce_scatter", ++seq_, world_ranks_);
  return request;
}

void MpiCommunicator::ReduceScatterV(const Tensor& in, Tensor& out,
                                     std::span<const int64_t> rows, ReduceOp op) {
  const WatchdogScope watch("reduce_scatter_v", ++seq_, world_ranks_);
  CheckTensor(in, device(), "ReduceScatterV");
  CheckTensor(out, device(), "ReduceScatterV");
  internal::CheckReduceScatterV(in, out, rows, size_, rank_);
  internal::CheckReduce(in, op);
  // Predefined ops need predefined types: counts of elements, not rows.
  const int64_t row = in.row_size();
  ToCount(in.numel(), "ReduceScatterV input elements");
  std::vector<int> counts(size_);
  for (int r = 0; r < size_; ++r) counts[r] = static_cast<int>(rows[r] * row);
  SY_MPI_CHECK(MPI_Reduce_scatter(in.raw_data(), out.raw_data(), counts.data(), ReduceType(in),
                                  MpiOp(op), comm_));
  if (op == ReduceOp::kAvg) DivideBy(out, size_);
}

// ---- Data movement ----------------------------------------------------------------------

std::unique_ptr<MpiCommunicator::Request> MpiCommunicator::StartAllGather(const Tensor& in,
                                                                          Tensor& out,
                                                                          bool async) {
  CheckTensor(in, device(), "AllGather");
  CheckTensor(out, device(), "AllGather");
  internal::CheckAllGather(in, out, size_);
  ToCount(out.dim(0), "AllGather output rows");
  const int rows = ToCount(in.dim(0), "AllGather rows");
  const MPI_Datatype type = RowType(in);
  auto request = std::make_unique<Request>();
  request->Keep(in);
  request->Keep(out);
  if (async) {
    SY_MPI_CHECK(MPI_Iallgather(in.raw_data(), rows, type, out.raw_data(), rows, type, comm_,
                                request->NewRequest()));
  } else {
    SY_MPI_CHECK(MPI_Allgather(in.raw_data(), rows, type, out.raw_data(), rows, type, comm_));
  }
  return request;
}

std::unique_ptr<MpiCommunicator::Request> MpiCommunicator::StartAllToAllV(
    const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
    std::span<const int64_t> recv_rows, bool async) {
  CheckTensor(in, device(), "AllToAllV");
  CheckTensor(out, device(), "AllToAllV");
  internal::CheckAllToAllV(in, send_rows, out, recv_rows, size_, rank_);
  // Displacements are int counts of rows too, so each side holds at most 2^31-1 rows.
  ToCount(in.dim(0), "AllToAllV input rows");
  ToCount(out.dim(0), "AllToAllV output rows");
  auto request = std::make_unique<Request>();
  request->Keep(in);
  request->Keep(out);
  std::vector<int>& send_counts = request->Counts(size_);
  std::vector<int>& send_displs = request->Counts(size_);
  std::vector<int>& recv_counts = request->Counts(size_);
  std::vector<int>& recv_displs = request->Counts(size_);
  int send_offset = 0, recv_offset = 0;
  for (int r = 0; r < size_; ++r) {
    send_counts[r] = static_cast<int>(send_rows[r]);
    recv_counts[r] = static_cast<int>(recv_rows[r]);
    send_displs[r] = send_offset;
    recv_displs[r] = recv_offset;
    send_offset += send_counts[r];
    recv_offset += recv_counts[r];
  }
  const MPI_Datatype type = RowType(in);
  if (async) {
    SY_MPI_CHECK(MPI_Ialltoallv(in.raw_data(), send_counts.data(), send_displs.data(), type,
                                out.raw_data(), recv_counts.data(), recv_displs.data(), type,
                                comm_, request->NewRequest()));
  } else {
    SY_MPI_CHECK(MPI_Alltoallv(in.raw_data(), send_counts.data(), send_displs.data(), type,
                               out.raw_data(), recv_counts.data(), recv_displs.data(), type,
                               comm_));
  }
  return request;
}

void MpiCommunicator::AllGather(const Tensor& in, Tensor& out) {
  const WatchdogScope watch("all_gather", ++seq_, world_ranks_);
  StartAllGather(in, out, false)->Wait();
}

void MpiCommunicator::AllGatherV(const Tensor& in, Tensor& out,
                                 std::span<const int64_t> rows) {
  const WatchdogScope watch("all_gather_v", ++seq_, world_ranks_);
  CheckTensor(in, device(), "AllGatherV");
  CheckTensor(out, device(), "AllGatherV");
  std::vector<int64_t> offsets = internal::CheckAllGatherV(in, out, rows, size_, rank_);
  ToCount(out.dim(0), "AllGatherV output rows");
  std::vector<int> counts(size_), displs(size_);
  for (int r = 0; r < size_; ++r) {
    counts[r] = static_cast<int>(rows[r]);
    displs[r] = static_cast<int>(offsets[r]);
  }
  const MPI_Datatype type = RowType(in);
  SY_MPI_CHECK(MPI_Allgatherv(in.raw_data(), counts[rank_], type, out.raw_data(), counts.data(),
                              displs.data(), type, comm_));
}

void MpiCommunicator::AllToAllV(const Tensor& in, std::span<const int64_t> send_rows,
                                Tensor& out, std::span<const int64_t> recv_rows) {
  const WatchdogScope watch("all_to_all_v", ++seq_, world_ranks_);
  StartAllToAllV(in, send_rows, out, recv_rows, false)->Wait();
}

std::unique_ptr<Work> MpiCommunicator::AllGatherAsync(const Tensor& in, Tensor& out) {
  auto request = StartAllGather(in, out, true);
  request->Label("all_gather", ++seq_, world_ranks_);
  return request;
}

std::unique_ptr<Work> MpiCommunicator::AllToAllVAsync(const Tensor& in,
                                                      std::span<const int64_t> send_rows,
                                                      Tensor& out,
                                                      std::span<const int64_t> recv_rows) {
  auto request = StartAllToAllV(in, send_rows, out, recv_rows, true);
  request->Label("all_to_all_v", ++seq_, world_ranks_);
  return request;
}

void MpiCommunicator::AllToAll(const Tensor& in, Tensor& out) {
  const WatchdogScope watch("all_to_all", ++seq_, world_ranks_);
  CheckTensor(in, device(), "AllToAll");
  CheckTensor(out, device(), "AllToAll");
  internal::CheckAllToAll(in, out, size_);
  const int rows = ToCount(in.dim(0) / size_, "AllToAll rows per rank");
  const MPI_Datatype type = RowType(in);
  SY_MPI_CHECK(MPI_Alltoall(in.raw_data(), rows, type, out.raw_data(), rows, type, comm_));
}

void MpiCommunicator::Broadcast(Tensor& t, int root) {
  const WatchdogScope watch("broadcast", ++seq_, world_ranks_);
  CheckTensor(t, device(), "Broadcast");
  SY_CHECK(root >= 0 && root < size_) << "Broadcast root " << root << " in a group of "
                                      << size_;
  SY_MPI_CHECK(MPI_Bcast(t.raw_data(), ToCount(Rows(t), "Broadcast rows"), RowType(t), root,
                         comm_));
}

void MpiCommunicator::Send(const Tensor& t, int peer, int tag) {
  const WatchdogScope watch("send", ++seq_, world_ranks_, PeerOf(peer));
  CheckTensor(t, device(), "Send");
  SY_CHECK(peer >= 0 && peer < size_ && peer != rank_)
      << "Send from rank " << rank_ << " to rank " << peer << " in a group of " << size_;
  SY_MPI_CHECK(MPI_Send(t.raw_data(), ToCount(Rows(t), "Send rows"), RowType(t), peer, tag,
                        comm_));
}

void MpiCommunicator::Recv(Tensor& t, int peer, int tag) {
  const WatchdogScope watch("recv", ++seq_, world_ranks_, PeerOf(peer));
  CheckTensor(t, device(), "Recv");
  SY_CHECK(peer >= 0 && peer < size_ && peer != rank_)
      << "Recv on rank " << rank_ << " from rank " << peer << " in a group of " << size_;
  const int rows = ToCount(Rows(t), "Recv rows");
  const MPI_Datatype type = RowType(t);
  MPI_Status status;
  SY_MPI_CHECK(MPI_Recv(t.raw_data(), rows, type, peer, tag, comm_, &status));
  int received = 0;
  SY_MPI_CHECK(MPI_Get_count(&status, type, &received));
  SY_CHECK_EQ(received, rows) << "Recv into " << t.DebugString() << " from rank " << peer
                              << ": the message is shorter (or not whole rows)";
}

void MpiCommunicator::PostP2P(const P2POp& op, Request& request) {
  const int rows = ToCount(Rows(op.tensor), "P2P rows");
  const MPI_Datatype type = RowType(op.tensor);
  request.Keep(op.tensor);
  if (op.kind == P2POp::kSend) {
    SY_MPI_CHECK(MPI_Isend(op.tensor.raw_data(), rows, type, op.peer, op.tag, comm_,
                           request.NewRequest()));
  } else {
    SY_MPI_CHECK(MPI_Irecv(op.tensor.raw_data(), rows, type, op.peer, op.tag, comm_,
                           request.NewRequest()));
    request.ExpectRows(op.tensor, rows, type, op.peer);
  }
}

std::unique_ptr<Work> MpiCommunicator::SendAsync(const Tensor& t, int peer, int tag) {
  CheckTensor(t, device(), "SendAsync");
  internal::CheckPeer(peer, size_, rank_, "SendAsync");
  SY_CHECK_GE(tag, 0) << "SendAsync tag";
  auto request = std::make_unique<Request>();
  request->Label("send", ++seq_, world_ranks_, PeerOf(peer));
  PostP2P({P2POp::kSend, t, peer, tag}, *request);
  return request;
}

std::unique_ptr<Work> MpiCommunicator::RecvAsync(Tensor& t, int peer, int tag) {
  CheckTensor(t, device(), "RecvAsync");
  internal::CheckPeer(peer, size_, rank_, "RecvAsync");
  SY_CHECK_GE(tag, 0) << "RecvAsync tag";
  auto request = std::make_unique<Request>();
  request->Label("recv", ++seq_, world_ranks_, PeerOf(peer));
  PostP2P({P2POp::kRecv, t, peer, tag}, *request);
  return request;
}

// Sends to self are ordinary MPI messages to self; the check only makes every backend
// accept the same batches.
std::unique_ptr<Work> MpiCommunicator::BatchSendRecv(std::span<const P2POp> ops) {
  internal::CheckBatch(ops, device(), size_, rank_);
  auto request = std::make_unique<Request>();
  std::vector<int> peers;
  for (const P2POp& op : ops) {
    const int r = world_ranks_[op.peer];
    if (op.peer != rank_ && std::find(peers.begin(), peers.end(), r) == peers.end()) peers.push_back(r);
  }
  std::sort(peers.begin(), peers.end());
  request->Label("send_recv", ++seq_, world_ranks_, std::move(peers));
  for (const P2POp& op : ops) PostP2P(op, *request);
  return request;
}

void MpiCommunicator::Barrier() {
  const WatchdogScope watch("barrier", ++seq_, world_ranks_);
  SY_MPI_CHECK(MPI_Barrier(comm_));
}

// ---- Groups -----------------------------------------------------------------------------

std::unique_ptr<Communicator> MpiCommunicator::Split(
    const std::vector<std::vector<int>>& groups) {
  const auto [color, key] = internal::CheckSplit(groups, size_, rank_);
  const std::vector<int>& members = groups[color];
  MPI_Comm sub;
  SY_MPI_CHECK(MPI_Comm_split(comm_, members.size() == 1 ? MPI_UNDEFINED : color, key, &sub));
  if (members.size() == 1) return MakeLocalCommunicator(Device::Cpu(), world_ranks_[rank_]);
  std::vector<int> world;
  world.reserve(members.size());
  for (int r : members) world.push_back(world_ranks_[r]);
  return std::make_unique<MpiCommunicator>(sub, std::move(world));
}

}  // namespace switchyard::dist
