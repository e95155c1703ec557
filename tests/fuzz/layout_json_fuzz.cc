// libFuzzer target: kvctl's layout JSON reader (tools/kvctl/layout_json.h) on arbitrary bytes,
// and every layout it accepts through KvRegion::Create and its span. The reader takes a path: the
// input goes into a memfd read back through /proc/self/fd.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "layout/kv_region.h"
#include "tools/kvctl/layout_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = memfd_create("layout", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (write(fd, data, size) == static_cast<ssize_t>(size)) {
    auto spec = kv::tools::ReadLayoutFile("/proc/self/fd/" + std::to_string(fd));
    if (spec.ok()) {
      auto region = kv::KvRegion::Create(*spec);
      if (region.ok()) (void)region->span_bytes();
    }
  }
  close(fd);
  return 0;
}
