#include "engine/dist/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <span>
#include <vector>

#include "engine/core/check.h"
#include "engine/core/cuda_check.h"
#include "engine/core/device_context.h"
#include "engine/dist/mpi_check.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/dist/nccl_work.h"

namespace switchyard::dist {
namespace {

using internal::CheckTensor;
using nccl_internal::EventFired;
using nccl_internal::NcclWork;
using nccl_internal::NewEvent;
using nccl_internal::P2PBatch;
using nccl_internal::StreamOf;

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF16: return ncclFloat16;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU8: return ncclUint8;
    case DType::kF64: return ncclFloat64;
  }
  SY_LOG(FATAL) << "no NCCL type for dtype " << static_cast<int>(dtype);
  return ncclFloat32;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator;

// The Work of posted point-to-point ops: Wait launches their batch if it is still pending,
// then orders the caller's stream after it.
class NcclP2PWork final : public Work {
 public:
  NcclP2PWork(NcclCommunicator* comm, int device, cudaStream_t compute,
              std::shared_ptr<P2PBatch> batch)
      : comm_(comm), device_(device), compute_(compute), batch_(std::move(batch)) {}
  ~NcclP2PWork() override { Wait(); }
  void Wait() override;
  // False while the batch is not launched (Test launches nothing); then its event.
  bool Test() override;

 private:
  NcclCommunicator* comm_;  // launches a pending batch; a launched one needs no communicator
  int device_;
  cudaStream_t compute_;
  std::shared_ptr<P2PBatch> batch_;
  bool waited_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of comm.
  NcclCommunicator(ncclComm_t comm, DeviceContext* ctx, std::vector<int> world_ranks)
      : comm_(comm), ctx_(ctx), world_ranks_(std::move(world_ranks)) {
    SY_CHECK(ctx_ != nullptr && ctx_->device().is_cuda())
        << "a NCCL communicator needs a CUDA DeviceContext";
    SY_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    SY_NCCL_CHECK(ncclCommCount(comm_, &size_));
    SY_CHECK_EQ(static_cast<int>(world_ranks_.size()), size_);
    SY_CUDA_CHECK(cudaSetDevice(ctx_->device().index));
    int least = 0, greatest = 0;
    SY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    SY_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
    ready_ = NewEvent();
    done_ = NewEvent();
    barrier_ = Tensor::Zeros({1}, DType::kF32, ctx_->device(), ctx_);
  }

  ~NcclCommunicator() override {
    LaunchPending();  // a Work outliving the communicator then needs only its event
    cudaSetDevice(ctx_->device().index);
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(done_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<int> world_ranks() const override { return world_ranks_; }
  Device device() const override { return ctx_->device(); }
  std::string_view backend() const override { return "nccl"; }
  DeviceContext* context() const override { return ctx_; }

  void AllReduce(Tensor& t, ReduceOp op) override { Finish(LaunchAllReduce(t, op), false); }
  void AllGather(const Tensor& in, Tensor& out) override {
    Finish(LaunchAllGather(in, out), false);
  }
  void ReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) override {
    Finish(LaunchReduceScatter(in, out, op), false);
  }
  void AllToAll(const Tensor& in, Tensor& out) override {
    CheckTensor(in, device(), "AllToAll");
    CheckTensor(out, device(), "AllToAll");
    internal::CheckAllToAll(in, out, size_);
    std::vector<int64_t> rows(size_, in.dim(0) / size_);
    Finish(LaunchAllToAllV(in, rows, out, rows), false);
  }
  void AllToAllV(const Tensor& in, std::span<const int64_t> send_rows, Tensor& out,
                 std::span<const int64_t> recv_rows) override {
    Finish(LaunchAllToAllV(in, send_rows, out, recv_rows), false);
  }

  // One ncclBroadcast per rank that has rows, rooted there, in one group.
  void AllGatherV(const Tensor& in, Tensor& out, std::span<const int64_t> rows) override {
    CheckTensor(in, device(), "AllGatherV");
    CheckTensor(out, device(), "AllGatherV");
    const std::vector<int64_t> offsets =
        internal::CheckAllGatherV(in, out, rows, size_, rank_);
    cudaStream_t stream = Begin();
    const int64_t row = in.row_size();
    const size_t elem = SizeOf(in.dtype());
    char* recv = static_cast<char*>(out.raw_data());
    SY_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      if (rows[r] == 0) continue;
      char* dst = recv + offsets[r] * row * elem;
      const void* src = r == rank_ ? in.raw_data() : dst;  // only read on the root
      SY_NCCL_CHECK(ncclBroadcast(src, dst, rows[r] * row, NcclType(in.dtype()), r, comm_,
                                  stream));
    }
    SY_NCCL_CHECK(ncclGroupEnd());
    Finish({in, out}, false);
  }

  // One ncclReduce per rank that has rows, rooted there, in one group.
  void ReduceScatterV(const Tensor& in, Tensor& out, std::span<const int64_t> rows,
                      ReduceOp op) override {
    CheckTensor(in, device(), "ReduceScatterV");
    CheckTensor(out, device(), "ReduceScatterV");
    const std::vector<int64_t> offsets =
        internal::CheckReduceScatterV(in, out, rows, size_, rank_);
    internal::CheckReduce(in, op);
    cudaStream_t stream = Begin();
    const int64_t row = in.row_size();
    const size_t elem = SizeOf(in.dtype());
    const char* send = static_cast<const char*>(in.raw_data());
    SY_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      if (rows[r] == 0) continue;
      const char* src = send + offsets[r] * row * elem;
      // recvbuff is only written on the root; elsewhere it is a valid pointer of the size.
      void* dst = r == rank_ ? out.raw_data() : const_cast<char*>(src);
      SY_NCCL_CHECK(ncclReduce(src, dst, rows[r] * row, NcclType(in.dtype()), NcclOp(op), r,
                               comm_, stream));
    }
    SY_NCCL_CHECK(ncclGroupEnd());
    Finish({in, out}, false);
  }

  void Broadcast(Tensor& t, int root) override {
    CheckTensor(t, device(), "Broadcast");
    SY_CHECK(root >= 0 && root < size_) << "Broadcast root " << root << " in a group of "
                                        << size_;
    cudaStream_t stream = Begin();
    if (t.numel() > 0) {
      SY_NCCL_CHECK(ncclBroadcast(t.raw_data(), t.raw_data(), t.numel(), NcclType(t.dtype()),
                                  root, comm_, stream));
    }
    Finish({t}, false);
  }

  void Send(const Tensor& t, int peer, int tag) override {
    CheckTensor(t, device(), "Send");
    CheckPeer(peer, "Send");
    cudaStream_t stream = Begin();
    SY_NCCL_CHECK(ncclSend(t.raw_data(), t.numel(), NcclType(t.dtype()), peer, comm_, stream));
    Finish({t}, false);
  }

  void Recv(Tensor& t, int peer, int tag) override {
    CheckTensor(t, device(), "Recv");
    CheckPeer(peer, "Recv");
    cudaStream_t stream = Begin();
    SY_NCCL_CHECK(ncclRecv(t.raw_data(), t.numel(), NcclType(t.dtype()), peer, comm_, stream));
    Finish({t}, false);
  }

  // Queued until a Wait or the next other op launches the pending batch: a lone ncclSend
  // would block the communication stream, and the receive queued behind it, until the
  // peer's receive runs.
  std::unique_ptr<Work> SendAsync(const Tensor& t, int peer, int tag) override {
    CheckTensor(t, device(), "SendAsync");
    internal::CheckPeer(peer, size_, rank_, "SendAsync");
    const P2POp op{P2POp::kSend, t, peer, tag};
    return Post(std::span<const P2POp>(&op, 1));
  }
  std::unique_ptr<Work> RecvAsync(Tensor& t, int peer, int tag) override {
    CheckTensor(t, device(), "RecvAsync");
    internal::CheckPeer(peer, size_, rank_, "RecvAsync");
    const P2POp op{P2POp::kRecv, t, peer, tag};
    return Post(std::span<const P2POp>(&op, 1));
  }
  // The ops join the pending batch, which is launched at once.
  std::unique_ptr<Work> BatchSendRecv(std::span<const P2POp> ops) override {
    internal::CheckBatch(ops, device(), size_, rank_);
    std::unique_ptr<Work> work = Post(ops);
    LaunchPending();
    return work;
  }

  // Launches the pending point-to-point ops, if any, as one group on the communication
  // stream (ordered after the caller's stream) and records their event.
  void LaunchPending() {
    if (pending_ == nullptr) return;
    std::shared_ptr<P2PBatch> batch = std::move(pending_);  // pending_ is now null
    cudaStream_t stream = BeginStream();
    SY_NCCL_CHECK(ncclGroupStart());
    for (const P2POp& op : batch->ops) {
      const int64_t n = op.tensor.numel();
      if (n == 0) continue;  // both sides have the same (empty) shape
      if (op.kind == P2POp::kSend) {
        SY_NCCL_CHECK(ncclSend(op.tensor.raw_data(), n, NcclType(op.tensor.dtype()), op.peer,
                               comm_, stream));
      } else {
        SY_NCCL_CHECK(ncclRecv(op.tensor.raw_data(), n, NcclType(op.tensor.dtype()), op.peer,
                               comm_, stream));
      }
    }
    SY_NCCL_CHECK(ncclGroupEnd());
    batch->done = NewEvent();
    SY_CUDA_CHECK(cudaEventRecord(batch->done, stream));
    batch->launched = true;
  }

  void Barrier() override {
    cudaStream_t stream = Begin();
    SY_NCCL_CHECK(ncclAllReduce(barrier_.raw_data(), barrier_.raw_data(), 1, ncclFloat32,
                                ncclSum, comm_, stream));
    SY_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  std::unique_ptr<Work> AllReduceAsync(Tensor& t, ReduceOp op) override {
    return Finish(LaunchAllReduce(t, op), true);
  }
  std::unique_ptr<Work> AllGatherAsync(const Tensor& in, Tensor& out) override {
    return Finish(LaunchAllGather(in, out), true);
  }
  std::unique_ptr<Work> ReduceScatterAsync(const Tensor& in, Tensor& out,
                                           ReduceOp op) override {
    return Finish(LaunchReduceScatter(in, out, op), true);
  }
  std::unique_ptr<Work> AllToAllVAsync(const Tensor& in, std::span<const int64_t> send_rows,
                                       Tensor& out,
                                       std::span<const int64_t> recv_rows) override {
    return Finish(LaunchAllToAllV(in, send_rows, out, recv_rows), true);
  }

  std::unique_ptr<Communicator> Split(const std::vector<std::vector<int>>& groups) override {
    const auto [color, key] = internal::CheckSplit(groups, size_, rank_);
    const std::vector<int>& members = groups[color];
    SY_CUDA_CHECK(cudaSetDevice(ctx_->device().index));
    ncclComm_t sub = nullptr;
    SY_NCCL_CHECK(ncclCommSplit(comm_, members.size() == 1 ? NCCL_SPLIT_NOCOLOR : color, key,
                                &sub, nullptr));
    if (members.size() == 1) {
      return MakeLocalCommunicator(device(), world_ranks_[rank_], ctx_);
    }
    std::vector<int> world;
    world.reserve(members.size());
    for (int r : members) world.push_back(world_ranks_[r]);
    return std::make_unique<NcclCommunicator>(sub, ctx_, std::move(world));
  }

 private:
  // Adds ops to the pending batch; the Work shares the batch.
  std::unique_ptr<Work> Post(std::span<const P2POp> ops) {
    if (pending_ == nullptr) pending_ = std::make_shared<P2PBatch>();
    pending_->ops.insert(pending_->ops.end(), ops.begin(), ops.end());
    return std::make_unique<NcclP2PWork>(this, ctx_->device().index, StreamOf(ctx_), pending_);
  }

  // Launches the pending point-to-point ops (so every rank issues NCCL ops in the order it
  // posted them), then orders the communication stream after the caller's stream.
  cudaStream_t Begin() {
    LaunchPending();
    return BeginStream();
  }

  // Orders the communication stream after the work queued so far on the caller's stream.
  cudaStream_t BeginStream() {
    SY_CUDA_CHECK(cudaSetDevice(ctx_->device().index));
    SY_CUDA_CHECK(cudaEventRecord(ready_, StreamOf(ctx_)));
    SY_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    return stream_;
  }

  // Orders the caller's stream after the op just launched: now (returns null), or at
  // Work::Wait when async (the Work keeps `tensors` alive until then).
  std::unique_ptr<Work> Finish(std::vector<Tensor> tensors, bool async) {
    if (!async) {
      SY_CUDA_CHECK(cudaEventRecord(done_, stream_));
      SY_CUDA_CHECK(cudaStreamWaitEvent(StreamOf(ctx_), done_, 0));
      return nullptr;
    }
    cudaEvent_t done = NewEvent();
    SY_CUDA_CHECK(cudaEventRecord(done, stream_));
    return std::make_unique<NcclWork>(ctx_->device().index, StreamOf(ctx_), done,
                                      std::move(tensors));
  }

  void CheckPeer(int peer, std::string_view op) const {
    SY_CHECK(peer >= 0 && peer < size_ && peer != rank_)
        << op << " between rank " << rank_ << " and rank " << peer << " in a group of "
        << size_;
  }

  // Each checks its arguments, launches one op on the communication stream and returns
  // the tensors it uses.
  std::vector<Tensor> LaunchAllReduce(Tensor& t, ReduceOp op) {
    CheckTensor(t, device(), "AllReduce");
    internal::CheckReduce(t, op);
    cudaStream_t stream = Begin();
    if (t.numel() > 0) {
      SY_NCCL_CHECK(ncclAllReduce(t.raw_data(), t.raw_data(), t.numel(), NcclType(t.dtype()),
                                  NcclOp(op), comm_, stream));
    }
    return {t};
  }

  std::vector<Tensor> LaunchAllGather(const Tensor& in, Tensor& out) {
    CheckTensor(in, device(), "AllGather");
    CheckTensor(out, device(), "AllGather");
    internal::CheckAllGather(in, out, size_);
    cudaStream_t stream = Begin();
    if (in.numel() > 0) {
      SY_NCCL_CHECK(ncclAllGather(in.raw_data(), out.raw_data(), in.numel(),
                                  NcclType(in.dtype()), comm_, stream));
    }
    return {in, out};
  }

  std::vector<Tensor> LaunchReduceScatter(const Tensor& in, Tensor& out, ReduceOp op) {
    CheckTensor(in, device(), "ReduceScatter");
    CheckTensor(out, device(), "ReduceScatter");
    internal::CheckReduceScatter(in, out, size_);
    internal::CheckReduce(in, op);
    cudaStream_t stream = Begin();
    if (out.numel() > 0) {
      SY_NCCL_CHECK(ncclReduceScatter(in.raw_data(), out.raw_data(), out.numel(),
                                      NcclType(in.dtype()), NcclOp(op), comm_, stream));
    }
    return {in, out};
  }

  // Grouped ncclSend/ncclRecv per peer; this rank's own rows are a device copy. Zero
  // counts are skipped on both sides (recv_rows[s] here == send_rows[me] on s).
  std::vector<Tensor> LaunchAllToAllV(const Tensor& in, std::span<const int64_t> send_rows,
                                      Tensor& out, std::span<const int64_t> recv_rows) {
    CheckTensor(in, device(), "AllToAllV");
    CheckTensor(out, device(), "AllToAllV");
    internal::CheckAllToAllV(in, send_rows, out, recv_rows, size_, rank_);
    cudaStream_t stream = Begin();
    const int64_t row = in.row_size();
    const size_t elem = SizeOf(in.dtype());
    const ncclDataType_t type = NcclType(in.dtype());
    const char* send = static_cast<const char*>(in.raw_data());
    char* recv = static_cast<char*>(out.raw_data());
    std::vector<int64_t> send_offset(size_ + 1, 0), recv_offset(size_ + 1, 0);
    for (int r = 0; r < size_; ++r) {
      send_offset[r + 1] = send_offset[r] + send_rows[r] * row;
      recv_offset[r + 1] = recv_offset[r] + recv_rows[r] * row;
    }
    if (send_rows[rank_] > 0) {
      SY_CUDA_CHECK(cudaMemcpyAsync(recv + recv_offset[rank_] * elem,
                                    send + send_offset[rank_] * elem,
                                    send_rows[rank_] * row * elem, cudaMemcpyDeviceToDevice,
                                    stream));
    }
    SY_NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      if (send_rows[r] > 0) {
        SY_NCCL_CHECK(ncclSend(send + send_offset[r] * elem, send_rows[r] * row, type, r,
                               comm_, stream));
      }
      if (recv_rows[r] > 0) {
        SY_NCCL_CHECK(ncclRecv(recv + recv_offset[r] * elem, recv_rows[r] * row, type, r,
                               comm_, stream));
      }
    }
    SY_NCCL_CHECK(ncclGroupEnd());
    return {in, out};
  }

  ncclComm_t comm_;
  DeviceContext* ctx_;  // not owned; its stream orders every op
  std::vector<int> world_ranks_;
  int rank_ = 0;
  int size_ = 1;
  cudaStream_t stream_ = nullptr;  // the communication stream
  cudaEvent_t ready_ = nullptr;    // caller's stream -> communication stream
  cudaEvent_t done_ = nullptr;     // communication stream -> caller's stream (sync ops)
  Tensor barrier_;                 // (1,) f32 scratch for Barrier
  std::shared_ptr<P2PBatch> pending_;  // posted point-to-point ops not yet launched
};

void NcclP2PWork::Wait() {
  if (waited_) return;
  if (!batch_->launched) comm_->LaunchPending();
  SY_CUDA_CHECK(cudaSetDevice(device_));
  SY_CUDA_CHECK(cudaStreamWaitEvent(compute_, batch_->done, 0));
  batch_.reset();
  waited_ = true;
}

bool NcclP2PWork::Test() {
  if (waited_) return true;
  if (!batch_->launched) return false;
  SY_CUDA_CHECK(cudaSetDevice(device_));
  if (!EventFired(batch_->done)) return false;
  Wait();
  return true;
}

}  // namespace

std::unique_ptr<Communicator> CreateNcclCommunicator(MPI_Comm comm, DeviceContext* ctx) {
  SY_CHECK(ctx != nullptr && ctx->device().is_cuda())
      << "CreateNcclCommunicator needs a CUDA DeviceContext";
  int rank = 0, size = 0;
  SY_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  SY_MPI_CHECK(MPI_Comm_size(comm, &size));
  ncclUniqueId id;
  if (rank == 0) SY_NCCL_CHECK(ncclGetUniqueId(&id));
  SY_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm));
  SY_CUDA_CHECK(cudaSetDevice(ctx->device().index));
  ncclComm_t nccl = nullptr;
  SY_NCCL_CHECK(ncclCommInitRank(&nccl, size, id, rank));
  return std::make_unique<NcclCommunicator>(nccl, ctx, MpiWorldRanks(comm));
}

}  // namespace switchyard::dist
