#include "engine/config/runtime_config.h"

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

}  // namespace switchyard::config
