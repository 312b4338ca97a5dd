// Process start-up and the world: InitProcess/FinalizeProcess bracket main(), and
// WorldCommunicator gives the communicator over every rank. Launch is
// `mpirun -np N switchyard ...`; a plain `switchyard ...` (or a build without MPI) is one
// rank whose communicators do no communication.
#pragma once

#include <memory>

#include "engine/core/device.h"
#include "engine/core/status.h"
#include "engine/dist/communicator.h"

namespace switchyard {
class DeviceContext;
}

namespace switchyard::dist {

// Initialises MPI (MPI_THREAD_FUNNELED: only the main thread calls MPI) when built with
// it, makes MPI errors return to SY_MPI_CHECK, and sets the rank printed by every log
// line. Without MPI: a single rank 0. Call once, first thing in main().
Status InitProcess(int* argc, char*** argv);

// Finalises MPI. Destroy every communicator before calling it. Idempotent.
void FinalizeProcess();

// This process's rank in the world and the number of ranks (0 and 1 before InitProcess
// or without MPI).
int WorldRank();
int WorldSize();
// Ranks per node of the MPI world as the launcher placed them: the size of this rank's
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) group, when every node holds the same number
// of ranks in a block (node of rank r = r / ranks_per_node, what Mesh assumes); else, and
// without MPI, the world size (one node). Collective over the MPI world.
int DetectRanksPerNode();

// Whether several threads may call MPI at the same time (MPI provided
// MPI_THREAD_MULTIPLE); false without MPI or before InitProcess.
bool MpiThreadMultiple();

// The communicator over all ranks, in world order: MPI for the CPU; for a CUDA device,
// NCCL bootstrapped over MPI, ordered on ctx's stream (ctx required, on `device`). A world
// of one rank gets a local communicator. Collective over the world.
std::unique_ptr<Communicator> WorldCommunicator(Device device = Device::Cpu(),
                                                DeviceContext* ctx = nullptr);

}  // namespace switchyard::dist
