// When dist::InitProcess starts MPI (engine/dist/process.h): the launcher detection, the
// SWITCHYARD_MPI override and its error, and a plain process that stays one rank without
// MPI (run outside mpirun, label unit: the switchyard commands' start-up).
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "engine/dist/process.h"

namespace switchyard::dist {
namespace {

// A getenv over a fixed map.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  const char* operator()(const char* name) const {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  }
};

TEST(ProcessStartTest, EachLauncherIsRecognised) {
  EXPECT_FALSE(LaunchedByMpiLauncher(FakeEnv{{{"HOME", "/root"}, {"OMPI_MCA_x", "1"}}}));
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD",
                           "MPI_LOCALNRANKS", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"}) {
    EXPECT_TRUE(LaunchedByMpiLauncher(FakeEnv{{{name, "0"}}})) << name;
  }
}

TEST(ProcessStartTest, StartsMpiWhenLaunchedOrAskedTo) {
  const FakeEnv plain;
  const FakeEnv launched{{{"OMPI_COMM_WORLD_SIZE", "2"}}};
  EXPECT_TRUE(*ShouldStartMpi(MpiStart::kAlways, plain));
  EXPECT_FALSE(*ShouldStartMpi(MpiStart::kIfLaunched, plain));
  EXPECT_TRUE(*ShouldStartMpi(MpiStart::kIfLaunched, launched));
  // SWITCHYARD_MPI overrides both ways.
  EXPECT_TRUE(*ShouldStartMpi(MpiStart::kIfLaunched, FakeEnv{{{"SWITCHYARD_MPI", "1"}}}));
  EXPECT_FALSE(*ShouldStartMpi(MpiStart::kAlways, FakeEnv{{{"SWITCHYARD_MPI", "0"}}}));
  const FakeEnv forced_off{{{"OMPI_COMM_WORLD_SIZE", "2"}, {"SWITCHYARD_MPI", "0"}}};
  EXPECT_FALSE(*ShouldStartMpi(MpiStart::kIfLaunched, forced_off));
}

TEST(ProcessStartTest, BadOverrideIsOneClearError) {
  for (const char* value : {"yes", "", "2", "true"}) {
    StatusOr<bool> s = ShouldStartMpi(MpiStart::kIfLaunched, FakeEnv{{{"SWITCHYARD_MPI", value}}});
    ASSERT_FALSE(s.ok()) << value;
    EXPECT_NE(std::string(s.status().message()).find("SWITCHYARD_MPI=" + std::string(value) +
                                                     ": takes 1"),
              std::string::npos)
        << s.status().message();
  }
}

// What `switchyard train` without mpirun does: no MPI, one rank whose world communicator is
// local and still sums.
TEST(ProcessStartTest, PlainProcessIsOneRankWithoutMpi) {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD",
                           "MPI_LOCALNRANKS", "MV2_COMM_WORLD_RANK", "SLURM_PROCID",
                           "SWITCHYARD_MPI"}) {
    unsetenv(name);
  }
  ASSERT_TRUE(InitProcess(nullptr, nullptr, MpiStart::kIfLaunched).ok());
  EXPECT_FALSE(MpiStarted());
  EXPECT_EQ(WorldRank(), 0);
  EXPECT_EQ(WorldSize(), 1);
  EXPECT_EQ(DetectRanksPerNode(), 1);
  std::unique_ptr<Communicator> world = WorldCommunicator();
  EXPECT_EQ(world->backend(), "local");
  Tensor t = Tensor::FromVector<float>({1.5f, -2.0f}, {2});
  world->AllReduce(t, ReduceOp::kSum);
  EXPECT_EQ(t.ToVector<float>(), (std::vector<float>{1.5f, -2.0f}));
  world.reset();
  FinalizeProcess();
  EXPECT_FALSE(MpiStarted());
}

}  // namespace
}  // namespace switchyard::dist
