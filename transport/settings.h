// Reading TransportOptions::settings: the numeric parse the backends with integer settings
// (cuda_ipc, nccl) share.
#pragma once

#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "transport/transport.h"

namespace kv::transport {

// The value of the first setting named `key`, or `fallback` when there is none. kInvalidArgument,
// prefixed with `backend`, for anything but a whole decimal integer in [min, max] (no overflow:
// a value past int64 is refused, not clamped).
inline Result<int64_t> IntSetting(const TransportOptions& options, std::string_view backend,
                                  std::string_view key, int64_t fallback, int64_t min,
                                  int64_t max = std::numeric_limits<int64_t>::max()) {
  for (const auto& [k, v] : options.settings) {
    if (k != key) continue;
    int64_t value = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), value);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || value < min ||
        value > max) {
      return Status::InvalidArgument(std::string(backend) + " setting " + std::string(key) + "='" +
                                     v + "' must be an integer in [" + std::to_string(min) + ", " +
                                     std::to_string(max) + "]");
    }
    return value;
  }
  return fallback;
}

// Timeouts in milliseconds are capped at a day: Clock::now() + the timeout must not overflow.
inline constexpr int64_t kMaxTimeoutMs = 24ll * 3600 * 1000;

}  // namespace kv::transport
