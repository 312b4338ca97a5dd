#include "engine/dist/process.h"

#include <cstdlib>

#include "engine/core/check.h"
#include "engine/core/device_context.h"
#include "engine/core/logging.h"
#include "engine/dist/watchdog.h"

#ifdef SY_HAVE_MPI
#include "engine/dist/mpi_check.h"
#include "engine/dist/mpi_communicator.h"
#endif
#ifdef SY_HAVE_NCCL
#include "engine/dist/nccl_communicator.h"
#endif

namespace switchyard::dist {

bool LaunchedByMpiLauncher(const std::function<const char*(const char*)>& getenv) {
  static constexpr const char* kNames[] = {
      "OMPI_COMM_WORLD_SIZE", "PMIX_RANK",           "PMI_RANK",     "PMI_SIZE", "PMI_FD",
      "MPI_LOCALNRANKS",      "MV2_COMM_WORLD_RANK", "SLURM_PROCID",
  };
  for (const char* name : kNames) {
    if (getenv(name) != nullptr) return true;
  }
  return false;
}

StatusOr<bool> ShouldStartMpi(MpiStart start,
                              const std::function<const char*(const char*)>& getenv) {
  const char* forced = getenv("SWITCHYARD_MPI");
  if (forced != nullptr) {
    const std::string value = forced;
    if (value == "1") return true;
    if (value == "0") return false;
    return InvalidArgument("SWITCHYARD_MPI=", value,
                           ": takes 1 (start MPI) or 0 (one rank without MPI)");
  }
  return start == MpiStart::kAlways || LaunchedByMpiLauncher(getenv);
}

namespace {

const char* ProcessEnv(const char* name) { return std::getenv(name); }

}  // namespace

#ifdef SY_HAVE_MPI

bool MpiStarted() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

Status InitProcess(int* argc, char*** argv, MpiStart start) {
  SY_ASSIGN_OR_RETURN(const bool start_mpi, ShouldStartMpi(start, ProcessEnv));
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized && !start_mpi) {
    SetLogRank(0);
    return OkStatus();
  }
  if (!initialized) {
    int provided = 0;
    // MPI_THREAD_MULTIPLE where offered: the collective watchdog's thread (watchdog.h)
    // asks the other ranks what they wait for while the main thread is blocked in MPI.
    const int err = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (err != MPI_SUCCESS) {
      return Internal("MPI_Init_thread failed: ", internal::MpiErrorString(err));
    }
    if (provided < MPI_THREAD_FUNNELED) {
      return FailedPrecondition("MPI provides thread level ", provided,
                                ", below MPI_THREAD_FUNNELED");
    }
  }
  // Errors come back to SY_MPI_CHECK, which prints rank, file:line and the call before
  // aborting; communicators duplicated or split from the world inherit the handler.
  SY_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  SetLogRank(WorldRank());
  return OkStatus();
}

void FinalizeProcess() {
  StopCollectiveWatchdog();
  if (MpiStarted()) MPI_Finalize();
}

int WorldRank() {
  if (!MpiStarted()) return 0;
  int rank = 0;
  SY_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return rank;
}

int WorldSize() {
  if (!MpiStarted()) return 1;
  int size = 1;
  SY_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  return size;
}

int DetectRanksPerNode() {
  const int world = WorldSize();
  if (!MpiStarted() || world == 1) return world;
  MPI_Comm node;
  SY_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, WorldRank(),
                                   MPI_INFO_NULL, &node));
  int local_rank = 0, local_size = 1;
  SY_MPI_CHECK(MPI_Comm_rank(node, &local_rank));
  SY_MPI_CHECK(MPI_Comm_size(node, &local_size));
  SY_MPI_CHECK(MPI_Comm_free(&node));
  // Block placement: every node the same size, this rank at r % size of node r / size.
  const int rank = WorldRank();
  int fits[2] = {local_size, local_rank == rank % local_size ? 1 : 0}, low[2], high[2];
  SY_MPI_CHECK(MPI_Allreduce(fits, low, 2, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  SY_MPI_CHECK(MPI_Allreduce(fits, high, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  const bool block = low[0] == high[0] && low[1] == 1 && world % low[0] == 0;
  return block ? local_size : world;
}

bool MpiThreadMultiple() {
  if (!MpiStarted()) return false;
  int level = 0;
  SY_MPI_CHECK(MPI_Query_thread(&level));
  return level >= MPI_THREAD_MULTIPLE;
}

#else  // !SY_HAVE_MPI

Status InitProcess(int* argc, char*** argv, MpiStart start) {
  SY_ASSIGN_OR_RETURN(const bool start_mpi, ShouldStartMpi(start, ProcessEnv));
  (void)start_mpi;  // nothing to start in a build without MPI
  SetLogRank(0);
  return OkStatus();
}

bool MpiStarted() { return false; }

void FinalizeProcess() {}
int WorldRank() { return 0; }
int WorldSize() { return 1; }
int DetectRanksPerNode() { return 1; }
bool MpiThreadMultiple() { return false; }

#endif  // SY_HAVE_MPI

std::unique_ptr<Communicator> WorldCommunicator(Device device, DeviceContext* ctx) {
  SY_CHECK(device.is_cpu() || (ctx != nullptr && ctx->device() == device))
      << "WorldCommunicator on " << device.ToString() << " needs that device's DeviceContext";
  if (WorldSize() == 1) return MakeLocalCommunicator(device, 0, ctx);
#ifdef SY_HAVE_MPI
  if (device.is_cpu()) return MpiCommunicator::Duplicate(MPI_COMM_WORLD);
#ifdef SY_HAVE_NCCL
  return CreateNcclCommunicator(MPI_COMM_WORLD, ctx);
#else
  SY_LOG(FATAL) << "WorldCommunicator on " << device.ToString()
                << " needs NCCL; this build has none";
#endif
#endif
  return nullptr;  // unreachable: WorldSize() is 1 without MPI
}

}  // namespace switchyard::dist
