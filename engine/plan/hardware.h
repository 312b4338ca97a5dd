// A machine as the planner (planner.h) sees it: peak arithmetic, memory, and the two kinds of
// link between ranks, read from a small YAML file (configs/hardware/*.yaml, docs/plan.md):
//
//   name: h100
//   source: "NVIDIA H100 datasheet (SXM5) ..."     # where the numbers come from
//   peak_flops: {bf16: 989e12, fp32: 67e12, fp8: 1979e12}   # dense, per device
//   memory_bytes: 85899345920       # HBM (or host memory) per device
//   memory_bandwidth: 3.35e12       # bytes/s
//   gpus_per_node: 8
//   intra_node: {bandwidth: 450e9, latency: 3e-6}    # per device, one direction, bytes/s, s
//   inter_node: {bandwidth: 50e9, latency: 10e-6}
//   gemm: {efficiency: 0.75, half_flops: 2e9}        # fitted: see GemmEfficiency
//   attention_efficiency: 0.45                       # share of the peak attention's core reaches
//   grouped_gemm_efficiency: 0.25  # optional: the engine's device-sized expert products
//   elementwise_efficiency: 0.4  # optional: the engine's memory-bound kernels (default 1)
//   cores_per_node: 2     # CPU machines only: the node's cores, which its ranks share
//   op_latency: 4e-6      # optional: fixed seconds per operation (launch, bookkeeping)
//   graph_op_latency: 1e-6  # optional: the same inside a replayed CUDA graph
//
// Every key is required except fp8, source, cores_per_node, op_latency, graph_op_latency,
// grouped_gemm_efficiency and elementwise_efficiency; an unknown or missing key, a value that is
// not a positive number, is one error line naming the file and the key.
#pragma once

#include <string>

#include "engine/core/status.h"

namespace switchyard::plan {

struct Link {
  double bandwidth = 0;  // bytes/s one device sends (and receives) at once, one direction
  double latency = 0;    // seconds per message (alpha)
};

struct Hardware {
  std::string name, source;
  double peak_bf16 = 0, peak_fp32 = 0, peak_fp8 = 0;  // dense FLOP/s per device
  double memory_bytes = 0;
  double memory_bandwidth = 0;
  int gpus_per_node = 1;
  Link intra_node, inter_node;
  // A matrix product of F = 2 m n k FLOPs reaches gemm_efficiency * F / (F + gemm_half_flops)
  // of the peak (and no more than the memory bandwidth allows: roofline).
  double gemm_efficiency = 0, gemm_half_flops = 0;
  double attention_efficiency = 0;
  // The experts' products when the dispatch keeps its counts on the device
  // (MoEConfig::DeviceDispatchCounts: this engine's own grouped kernels,
  // kernels/cuda/grouped_gemm.cu) reach grouped_gemm_efficiency in place of gemm_efficiency
  // (the same F / (F + gemm_half_flops) shape); 0 when the file gives none, and the expert
  // products then cost what dense ones of their shape do. plan_calibrate_gpu measures it.
  double grouped_gemm_efficiency = 0;
  // The engine's memory-bound kernels (norms, activations, casts, residual adds, the
  // dispatch's row moves) pass 2 bytes per element the cost model counts at
  // elementwise_efficiency * memory_bandwidth: 1 when the file gives none (a datasheet's
  // bandwidth, bf16 activations). plan_calibrate_gpu measures it from those kernels as
  // training runs them (f32 where they keep f32), against its device copy's bandwidth.
  double elementwise_efficiency = 1;
  // 0 (devices): each rank has a device of its own. > 0 (a CPU node): peak_flops and
  // memory_bandwidth are one core's, and the ranks on a node share its cores evenly, so a
  // rank computes at ComputeShare times them (threads when the ranks are fewer than the
  // cores, time slices when they are more).
  int cores_per_node = 0;
  // Fixed seconds every operation costs besides its work (a kernel launch; on a CPU the
  // engine's per-operation bookkeeping); 0 when the file gives none. Time-sliced ranks
  // (ComputeShare < 1) pay it 1 / ComputeShare times.
  double op_latency = 0;
  // The fixed seconds of an operation inside a replayed CUDA graph (runtime.cuda_graphs on
  // one rank: one launch for the micro-batches, each kernel still a node the GPU schedules);
  // < 0 when the file gives none, and op_latency stands in.
  double graph_op_latency = -1;

  // cores_per_node / ranks on a node (min(world, gpus_per_node)); 1 without cores_per_node.
  double ComputeShare(int world) const;

  // The dense peak of the matrix products' input type: "bf16", "fp32" or "fp8" / "fp8-cs" (fp8 falls
  // back to bf16 when the file gives none).
  double Peak(const std::string& precision) const;
};

// Parses a hardware file's text; `source` names it in errors.
StatusOr<Hardware> ParseHardware(const std::string& yaml, const std::string& source);
// `name_or_path`: a file path, or a name of a file in `dir` ("h100" -> dir/h100.yaml).
StatusOr<Hardware> LoadHardware(const std::string& name_or_path, const std::string& dir);

}  // namespace switchyard::plan
