// Byte counts for people: "640.0 KiB".
#pragma once

#include <cstdint>
#include <string>

namespace kv::tools {

// Powers of 1024, one decimal above a KiB ("512 B", "1.5 MiB").
std::string HumanBytes(uint64_t bytes);

}  // namespace kv::tools
