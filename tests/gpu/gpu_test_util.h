// Shared by the GPU tests: skip with the reason when no CUDA device can run them.
#pragma once

#include <gtest/gtest.h>

#include "engine/core/device.h"

#ifdef SY_HAVE_CUDA
#define SY_REQUIRE_GPU()                                                          \
  do {                                                                            \
    if (!::switchyard::CudaAvailable())                                           \
      GTEST_SKIP() << "no CUDA device visible on this machine; the CUDA code is " \
                      "compiled but this test needs a GPU to run";                \
  } while (0)
#else
#define SY_REQUIRE_GPU() \
  GTEST_SKIP() << "this build has no CUDA backend (SWITCHYARD_CUDA=OFF or no nvcc)"
#endif
