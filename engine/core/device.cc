#include "engine/core/device.h"

#include <charconv>

#ifdef SY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace switchyard {

std::string Device::ToString() const {
  const std::string name = NameOf(kDeviceTypeNames, type);
  return is_cpu() ? name : name + ":" + std::to_string(index);
}

StatusOr<Device> ParseDevice(std::string_view text) {
  const size_t colon = text.find(':');
  const std::optional<DeviceType> type = FindByName(kDeviceTypeNames, text.substr(0, colon));
  if (type == DeviceType::kCPU && colon == std::string_view::npos) return Device::Cpu();
  if (type == DeviceType::kCUDA) {
    if (colon == std::string_view::npos) return Device::Cuda(0);
    int index = -1;
    auto digits = text.substr(colon + 1);
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && end == digits.data() + digits.size() && index >= 0) {
      return Device::Cuda(index);
    }
  }
  return InvalidArgument("unknown device '", text, "' (expected cpu, cuda or cuda:N)");
}

int CudaDeviceCount() {
#ifdef SY_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

bool CudaAvailable() { return CudaDeviceCount() > 0; }

}  // namespace switchyard
