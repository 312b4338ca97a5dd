// A hardware file of round numbers, for the planner's hand calculations (planner_test.cc)
// and the hardware file checks (hardware_test.cc).
#pragma once

namespace switchyard::plan {

inline constexpr char kRoundHardware[] = R"(
name: round
peak_flops: {bf16: 1e12, fp32: 1e11}
memory_bytes: 1e10
memory_bandwidth: 1e11
gpus_per_node: 8
intra_node: {bandwidth: 1e10, latency: 1e-5}
inter_node: {bandwidth: 1e9, latency: 1e-4}
gemm: {efficiency: 0.5, half_flops: 1e6}
attention_efficiency: 0.25
)";

}  // namespace switchyard::plan
