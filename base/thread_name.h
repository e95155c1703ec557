// Names the calling thread as `top -H`, `ps -L`, gdb and perf show it ("kvd-io", "nccl-send").
// Linux keeps 15 bytes; a longer name is cut there. Best effort: a failure is ignored, since a
// name only helps a person reading a profile. Thread-safe (names only the calling thread).
#pragma once

#include <string_view>

namespace kv {

void NameThisThread(std::string_view name);

}  // namespace kv
