#include "daemon/offload/page_mover.h"

#include <string>

namespace kv::offload {

Result<DeviceCopy> ParseDeviceCopy(std::string_view name) {
  if (name == "auto") return DeviceCopy::kAuto;
  if (name == "kernel") return DeviceCopy::kKernel;
  if (name == "copy-engine") return DeviceCopy::kCopyEngine;
  return Status::InvalidArgument("device copy '" + std::string(name) +
                                 "': expected auto, kernel or copy-engine");
}

}  // namespace kv::offload
