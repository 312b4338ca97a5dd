// Process-wide counts of the work the host hands to the device, the same on every device
// (`switchyard train --profile` prints them per step): kernel dispatches (every call through
// kernels/dispatch.h, and the tensors' own memsets and copies, Tensor::SetZero and
// Tensor::CopyFrom, which are device operations too, where no op dispatched them),
// device->host readbacks (every point where the host waits for a
// device result: a kernel that returns a host value, Tensor::ToHost, DeviceContext::Synchronize),
// dtype conversions by (from, to) pair (calls and elements), and on CUDA the cudaMalloc calls
// of the caching allocator. Dispatches are also counted by op (the kernels/<family>.cc
// wrapper that dispatched: "Gemm", "Cast", ...), so a profile says which ops a step launches.
//
// Readbacks are counted at the logical points, not where a CUDA stream is synchronised, so a
// CPU run counts the readbacks a GPU run of the same config does: a kernel that returns a
// host value counts one in its device-independent wrapper (kernels/<family>.cc) whichever
// backend runs it, and host code reads device values through Tensor::ToHost, which counts
// one even when the tensor is already on the host. Each readback names its site, so a
// profile says which ones a step has.
//
// Conversions are those the device performs: a matrix product in bf16 mode converts each
// f32 operand to bf16 (kernels/gemm.cc counts them; the CPU's widening of bf16 operands to
// f32 for sgemm is its emulation and not counted); kernels::Cast counts its own.
// Conversions of registered weights (engine/core/weight_shadows.h) are also counted apart.
//
// Counting is always on (relaxed atomics; the readback sites under a mutex, a few dozen a
// step); Snapshot() and the difference of two snapshots give a step's counts.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "engine/core/dtype.h"

namespace switchyard {

inline constexpr int kNumDTypes = 7;  // DType's values

struct DeviceCounts {
  int64_t dispatches = 0;   // kernel dispatches
  int64_t readbacks = 0;    // device->host readbacks (host waits for a device result)
  int64_t cuda_mallocs = 0; // cudaMalloc calls (the caching allocator's misses)
  // Conversions by [from][to]: calls and elements.
  int64_t conversion_calls[kNumDTypes][kNumDTypes] = {};
  int64_t conversion_elements[kNumDTypes][kNumDTypes] = {};
  // Conversions of registered weights (engine/core/weight_shadows.h) among the above: the shadow
  // writes, or each product's own conversion of a weight when there is no shadow.
  int64_t weight_conversion_calls = 0;
  int64_t weight_conversion_elements = 0;
  // Readbacks by site name.
  std::map<std::string, int64_t> readback_sites;
  // Dispatches by op name (they sum to `dispatches`).
  std::map<std::string, int64_t> dispatch_ops;

  int64_t conversions() const;           // calls over every pair
  int64_t conversion_element_total() const;
  // this - earlier, field by field (sites absent from the difference are dropped).
  DeviceCounts Minus(const DeviceCounts& earlier) const;
  // this + other.
  void Add(const DeviceCounts& other);
  // {"dispatches": n, "dispatch_ops": {...}, "readbacks": n, "readback_sites": {...},
  //  "cuda_mallocs": n,
  //  "conversions": {"f32->bf16": {"calls": n, "elements": n}, ...}, "weight_conversions":
  //  {"calls": n, "elements": n}}, each value divided by `divide_by` (a per-step mean when
  //  > 1; integers when 1).
  std::string Json(int64_t divide_by = 1) const;
};

namespace counters {

// The counts since the process started.
DeviceCounts Snapshot();

// `op`: a string literal (or __func__) naming the op dispatched.
void CountDispatch(const char* op);
// Marks the running of one dispatched op (kernels/dispatch.h), on this thread: the tensors'
// memsets and copies inside it (a CPU twin's scratch copy, a CUDA wrapper's memset) are the
// op's own work, not dispatches of their own, so a CPU run and a GPU run count alike.
class DispatchScope {
 public:
  DispatchScope();
  ~DispatchScope();
  DispatchScope(const DispatchScope&) = delete;
  DispatchScope& operator=(const DispatchScope&) = delete;
};
// A Tensor::SetZero or CopyFrom that moves bytes: a dispatch named `op`, unless inside a
// dispatched op (DispatchScope).
void CountTensorOp(const char* op);
// `site`: a string literal naming the readback ("cross_entropy", "moe.admission", ...).
void CountReadback(const char* site);
void CountConversion(DType from, DType to, int64_t elements);
// Of the conversions counted, one was of a registered weight (engine/core/weight_shadows.h).
void CountWeightConversion(int64_t elements);
void CountCudaMalloc();

}  // namespace counters
}  // namespace switchyard
