// Process start-up and the world: InitProcess/FinalizeProcess bracket main(), and
// WorldCommunicator gives the communicator over every rank. Launch is
// `mpirun -np N switchyard ...`; a plain `switchyard ...` (or a build without MPI) is one
// rank whose communicators do no communication.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/core/device.h"
#include "engine/core/status.h"
#include "engine/dist/communicator.h"

namespace switchyard {
class DeviceContext;
}

namespace switchyard::dist {

// When InitProcess starts MPI. kAlways: every time (the test and benchmark programs, whose
// one-process runs are MPI singletons on purpose). kIfLaunched: only when an MPI launcher
// started this process (LaunchedByMpiLauncher) or SWITCHYARD_MPI=1 asks; a plain
// `switchyard train` is then one rank without MPI, so it never depends on Open MPI's
// singleton start-up (which spawns a daemon and, on a loaded machine, can abort "before
// MPI_INIT completed"). SWITCHYARD_MPI=0 never starts it.
enum class MpiStart { kAlways, kIfLaunched };

// Whether the environment (`getenv`, absent names give nullptr) is that of a rank an MPI
// launcher started: Open MPI's mpirun/prterun (OMPI_COMM_WORLD_SIZE, PMIX_RANK), MPICH's
// and Intel MPI's Hydra (PMI_RANK, PMI_SIZE, PMI_FD, MPI_LOCALNRANKS), MVAPICH
// (MV2_COMM_WORLD_RANK) and Slurm (SLURM_PROCID, also set in a batch script: a plain run
// there starts MPI as before). Any of them set counts.
bool LaunchedByMpiLauncher(const std::function<const char*(const char*)>& getenv);

// Whether `start` and the environment ask InitProcess to start MPI; an error names a bad
// SWITCHYARD_MPI (it takes 0 or 1).
StatusOr<bool> ShouldStartMpi(MpiStart start,
                              const std::function<const char*(const char*)>& getenv);

// Initialises MPI (MPI_THREAD_FUNNELED: only the main thread calls MPI) when built with
// it and `start` says so, makes MPI errors return to SY_MPI_CHECK, and sets the rank
// printed by every log line. Without MPI (not built, or not started): a single rank 0.
// Call once, first thing in main().
Status InitProcess(int* argc, char*** argv, MpiStart start = MpiStart::kAlways);

// Whether MPI is initialised and not yet finalised in this process.
bool MpiStarted();

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
