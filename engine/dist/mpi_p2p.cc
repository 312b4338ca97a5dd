// Point-to-point messages of the MPI backend (mpi_communicator.h): blocking Send and Recv,
// and posted sends, receives and batches completed by a Request.
#include <algorithm>
#include <memory>
#include <span>

#include "engine/core/check.h"
#include "engine/dist/mpi_check.h"
#include "engine/dist/mpi_communicator.h"
#include "engine/dist/mpi_request.h"
#include "engine/dist/watchdog.h"

namespace switchyard::dist {

using internal::CheckTensor;
using internal::Rows;
using internal::ToCount;

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

}  // namespace switchyard::dist
