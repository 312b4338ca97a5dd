// The `runtime` section of a config: where the step runs (runtime.device) and the element
// type of its matrix products (runtime.precision). Names and values are bound in one table
// per choice (engine/core/enum_names.h): parsing, errors and the resolved YAML read it.
#pragma once

#include <ostream>
#include <string>
#include <string_view>

#include "engine/core/device.h"
#include "engine/core/enum_names.h"
#include "engine/core/status.h"

namespace switchyard::config {

// runtime.activation_dtype: what layers keep for backward (MODEL.md "Activation storage"):
// fp32, or bf16 (products' inputs kept as the bf16 operands they read, pre-activations rounded
// to bf16); bf16 needs bf16 matrix products. The forward's values are the same either way.
enum class ActivationDtype { kFp32, kBf16 };
inline constexpr EnumName<ActivationDtype> kActivationDtypeNames[] = {
    {ActivationDtype::kFp32, "fp32"}, {ActivationDtype::kBf16, "bf16"}};

// runtime.precision: the matrix products' input type (f32 accumulation, f32 master weights
// and optimizer state); auto is bf16 on a GPU and fp32 on the CPU.
enum class Precision { kAuto, kFp32, kBf16 };
inline constexpr EnumName<Precision> kPrecisionNames[] = {
    {Precision::kAuto, "auto"}, {Precision::kFp32, "fp32"}, {Precision::kBf16, "bf16"}};

// runtime.device: "cpu", "cuda" (each rank takes GPU local_rank % GPUs) or "cuda:N" (GPU N).
struct RuntimeDevice {
  DeviceType type = DeviceType::kCPU;  // named by kDeviceTypeNames
  int index = -1;                      // N of cuda:N; -1 for cpu and for plain cuda

  bool is_cpu() const { return type == DeviceType::kCPU; }
  // Plain "cuda": the rank's local GPU.
  bool is_local_cuda() const { return type == DeviceType::kCUDA && index < 0; }
  bool operator==(const RuntimeDevice&) const = default;
};

// "cpu", "cuda", "cuda:N"; anything else names the key runtime.device and the allowed forms.
StatusOr<RuntimeDevice> ParseRuntimeDevice(std::string_view text);
// The inverse: "cpu", "cuda", "cuda:1".
std::string RuntimeDeviceName(const RuntimeDevice& device);
inline std::ostream& operator<<(std::ostream& out, const RuntimeDevice& device) {
  return out << RuntimeDeviceName(device);
}

// runtime: where the step runs, the element type of its matrix products and of the
// activations kept for backward.
struct RuntimeConfig {
  RuntimeDevice device;                    // cpu | cuda | cuda:N
  Precision precision = Precision::kAuto;  // auto | fp32 | bf16
  ActivationDtype activation_dtype = ActivationDtype::kFp32;  // fp32 | bf16
  // The micro-batches' forward and backward captured once and replayed as a CUDA graph
  // (docs/gpu.md, "CUDA graphs"); on the CPU the capture is emulated (the same numbers).
  // Config::Validate says which layouts and routings can be captured.
  bool cuda_graphs = false;
  // Before building the model, training compares the dry-run's predicted peak of the ranks
  // that share this rank's memory with what that memory has available, and stops with one
  // error when it does not fit (engine/plan/device_fit.h, CheckMemoryFits).
  bool memory_check = true;

  // Whether the products run in bf16: precision bf16, or auto on a GPU.
  bool bf16_products() const {
    return precision == Precision::kBf16 || (precision == Precision::kAuto && !device.is_cpu());
  }

  // Names the key and the value it rejects: a device ParseRuntimeDevice cannot produce
  // (cpu with an index, an index below -1); activation_dtype bf16 with fp32 products.
  Status Validate() const;
};

}  // namespace switchyard::config
