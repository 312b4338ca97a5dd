// Where a tensor lives: the host or one CUDA device.
#pragma once

#include <ostream>
#include <string>

#include "engine/core/enum_names.h"
#include "engine/core/status.h"

namespace switchyard {

enum class DeviceType : uint8_t { kCPU, kCUDA };

// "cpu", "cuda": the names before a device's ":N".
inline constexpr EnumName<DeviceType> kDeviceTypeNames[] = {{DeviceType::kCPU, "cpu"},
                                                             {DeviceType::kCUDA, "cuda"}};

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;  // CUDA ordinal; 0 for the CPU.

  static Device Cpu() { return {DeviceType::kCPU, 0}; }
  static Device Cuda(int index = 0) { return {DeviceType::kCUDA, index}; }
  bool is_cpu() const { return type == DeviceType::kCPU; }
  bool is_cuda() const { return type == DeviceType::kCUDA; }
  bool operator==(const Device&) const = default;
  // "cpu" or "cuda:0".
  std::string ToString() const;
};

inline std::ostream& operator<<(std::ostream& out, const Device& device) {
  return out << device.ToString();
}

// Parses "cpu", "cuda" or "cuda:N".
StatusOr<Device> ParseDevice(std::string_view text);

// Whether this build has the CUDA backend and at least one device is visible.
bool CudaAvailable();
// Number of visible CUDA devices (0 without the CUDA backend or a GPU).
int CudaDeviceCount();

}  // namespace switchyard
