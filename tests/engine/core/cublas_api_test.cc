// cuBLAS is opened when a CUDA device first needs it (engine/core/cublas_api.h), not at
// start-up: a process that uses no GPU never maps the library (linked, it cost every process
// 0.2 s and 210 MB before main), and loading resolves every entry point the engine calls from
// the library the build's headers describe. Runs without a GPU: nothing here touches one.
#include "engine/core/cublas_api.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard {
namespace {

// Whether a file whose name contains `name` is mapped into this process.
bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str().find(name) != std::string::npos;
}

// Read before main, when the loader has mapped everything the program links.
const bool kMappedAtStartUp = Mapped("libcublas");

TEST(CublasApiTest, OpenedOnFirstUseNotAtStartUp) {
  EXPECT_FALSE(kMappedAtStartUp) << "cuBLAS is mapped at start-up";
  // CPU work (a context, a tensor) asks nothing of cuBLAS. Loading is for the process's
  // life, so only the first run of this test (not a --gtest_repeat) sees it unloaded.
  static bool first_run = true;
  auto ctx = DeviceContext::Create(Device::Cpu());
  Tensor t = Tensor::Zeros({4, 4}, DType::kF32, Device::Cpu());
  ASSERT_TRUE(t.defined());
  if (std::exchange(first_run, false)) {
    EXPECT_FALSE(CublasLoaded());
    EXPECT_FALSE(Mapped("libcublas")) << "cuBLAS is mapped before anything asked for it";
  }

  const absl::StatusOr<const CublasApi*>& api = LoadCublas();
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_TRUE(CublasLoaded());
  const std::string major = std::to_string(CUBLAS_VER_MAJOR);
  EXPECT_TRUE(Mapped("libcublasLt.so." + major));
  EXPECT_TRUE(Mapped("libcublas.so." + major));
  // Entry points that need no device answer through the table: the library is the one the
  // headers describe, and a status names itself.
  EXPECT_EQ((*api)->LtGetVersion() / 10000, static_cast<size_t>(CUBLAS_VER_MAJOR));
  EXPECT_STREQ((*api)->GetStatusName(CUBLAS_STATUS_NOT_INITIALIZED),
               "CUBLAS_STATUS_NOT_INITIALIZED");
  // Loaded once: the same table after.
  EXPECT_EQ(&Cublas(), *api);
  EXPECT_EQ(&LoadCublas(), &api);
  // A directory without the library falls back to the loader's search path (the test's
  // runpath), which finds the one loaded: the same handle.
  const absl::StatusOr<void*> found = internal::OpenLibrary("libcublasLt", "/nonexistent");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, internal::OpenLibrary("libcublasLt", "").value());
}

// The error names the library, each path tried and what to do (nothing is loaded here).
TEST(CublasApiTest, OpenLibraryNamesWhatItTried) {
  const std::string major = std::to_string(CUBLAS_VER_MAJOR);
  const absl::StatusOr<void*> missing =
      internal::OpenLibrary("libswitchyard_absent", "/nonexistent/cuda/lib64");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(missing.status().message());
  EXPECT_NE(message.find("cannot load libswitchyard_absent.so." + major + " ("), std::string::npos)
      << message;
  EXPECT_NE(message.find("/nonexistent/cuda/lib64/libswitchyard_absent.so." + major + ": "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("; libswitchyard_absent.so." + major + ": "), std::string::npos)
      << message;
  EXPECT_NE(message.find("put its lib directory on LD_LIBRARY_PATH"), std::string::npos)
      << message;

}

}  // namespace
}  // namespace switchyard
