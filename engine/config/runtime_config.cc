#include "engine/config/runtime_config.h"

#include "engine/config/config.h"

namespace switchyard::config {

StatusOr<RuntimeDevice> ParseRuntimeDevice(std::string_view text) {
  if (FindByName(kDeviceTypeNames, text) == DeviceType::kCUDA) {
    return RuntimeDevice{DeviceType::kCUDA, -1};
  }
  auto device = ParseDevice(text);
  if (!device.ok()) {
    return InvalidArgument("runtime.device='", text, "' is not one of ", JoinNames(kDeviceTypeNames),
                           ", cuda:N");
  }
  return RuntimeDevice{device->type, device->is_cpu() ? -1 : device->index};
}

std::string RuntimeDeviceName(const RuntimeDevice& device) {
  const std::string name = NameOf(kDeviceTypeNames, device.type);
  return device.index < 0 ? name : name + ":" + std::to_string(device.index);
}

Status RuntimeConfig::Validate() const {
  if (device.index < -1 || (device.is_cpu() && device.index != -1)) {
    return InvalidArgument("runtime.device='", device, "' is not one of ",
                           JoinNames(kDeviceTypeNames), ", cuda:N");
  }
  if (activation_dtype == ActivationDtype::kBf16 && !bf16_products()) {
    return InvalidArgument("runtime.activation_dtype=bf16 needs bf16 matrix products, but "
                           "runtime.precision=", NameOf(kPrecisionNames, precision),
                           " resolves to fp32 on ", device,
                           "; set runtime.precision=bf16 or runtime.activation_dtype=fp32");
  }
  return OkStatus();
}

// config.h declares it (it reads the moe section too).
Status CheckCudaGraphs(const Config& c, int world) {
  if (!c.runtime.cuda_graphs) return OkStatus();
  // A replay repeats the captured kernels with their arguments: the step may not wait for
  // the device (one rank: the exchanges' sizes, ZeRO and the pipeline are host-driven). The
  // router's per-step random keys are read from device memory (moe::RouterRngValues).
  if (world > 1) {
    return InvalidArgument("runtime.cuda_graphs=true runs on one rank (this world has ", world,
                           "); set runtime.cuda_graphs=false");
  }
  if (c.moe.num_experts > 0) {
    if (c.moe.dispatch_counts != moe::DispatchCounts::kDevice) {
      return InvalidArgument("runtime.cuda_graphs=true needs moe.dispatch_counts=device (host "
                             "counts are read back in the step)");
    }
    if (c.moe.overlap_chunks > 1) {
      return InvalidArgument("runtime.cuda_graphs=true needs moe.overlap_chunks=1");
    }
  }
  return OkStatus();
}

}  // namespace switchyard::config
