#include "engine/core/device.h"

#include <charconv>

#ifdef SY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace switchyard {

std::string Device::ToString() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

StatusOr<Device> ParseDevice(std::string_view text) {
  if (text == "cpu") return Device::Cpu();
  if (text == "cuda") return Device::Cuda(0);
  if (text.substr(0, 5) == "cuda:") {
    int index = -1;
    auto digits = text.substr(5);
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
