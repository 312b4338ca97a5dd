// The NCCL backend of Communicator: device tensors of every dtype (bf16 and f16 reduce in
// NCCL), bootstrapped over MPI. Collectives run on a communication stream of their own,
// ordered after the caller's DeviceContext stream by events; the caller's stream then
// waits for them (synchronous ops at once, asynchronous ones at Work::Wait). NCCL and
// CUDA stay out of this header. Only built with CUDA, NCCL and MPI (SY_HAVE_NCCL).
#pragma once

#include <mpi.h>

#include <memory>

#include "engine/dist/communicator.h"

namespace switchyard {
class DeviceContext;
}

namespace switchyard::dist {

// A NCCL communicator over the ranks of `comm` (same rank order). Rank 0 makes the NCCL
// unique id and broadcasts it over `comm`; collective over `comm`. ctx: the CUDA device
// context whose stream orders every op; it must outlive the communicator.
std::unique_ptr<Communicator> CreateNcclCommunicator(MPI_Comm comm, DeviceContext* ctx);

}  // namespace switchyard::dist
