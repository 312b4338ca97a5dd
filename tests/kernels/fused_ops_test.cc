// The fused elementwise ops on the CPU: bit-identical to the unfused sequences they replace
// (tests/kernels/fused_ops_check.h). The forward twins run one row at a time (bias add,
// then the activation or the norm, on the row while it is in cache); these tests are what
// keeps dense::Mlp, the experts and the decoder block bit-for-bit now that they call them.
#include <gtest/gtest.h>

#include "tests/kernels/fused_ops_check.h"

namespace switchyard::kernels {
namespace {

TEST(FusedOpsTest, BiasActivationsEqualTheUnfusedSequence) {
  fused_check::CheckBiasActivations(Device::Cpu(), nullptr);
}

TEST(FusedOpsTest, GroupedBiasActivationsEqualTheUnfusedSequence) {
  fused_check::CheckGroupedBiasActivations(Device::Cpu(), nullptr);
}

TEST(FusedOpsTest, ResidualAddNormEqualsAddThenNorm) {
  fused_check::CheckAddNorms(Device::Cpu(), nullptr);
}

}  // namespace
}  // namespace switchyard::kernels
