// The process-wide table behind AllocateHostMemory (<kv/connector.h>): shared memory an engine
// builds its host KV cache views on, which RegisterKvCaches finds again by address so that kvd
// maps the same bytes. Thread-safe.
#pragma once

#include <cstdint>

#include "base/status.h"
#include "base/unique_fd.h"

namespace kv::connector {

// Where [base, base + bytes) lies inside one of AllocateHostMemory's allocations.
struct HostSlice {
  kv::UniqueFd fd;         // a duplicate of the allocation's memfd, for kvd
  uint64_t allocation_bytes = 0;  // the memfd's size
  uint64_t offset = 0;            // of `base` inside it
};

// kInvalidArgument naming the address when the range is not inside one live allocation (memory
// kvd cannot map: malloc'ed, a plain CPU tensor, or an allocation already freed).
Result<HostSlice> FindHostMemory(const void* base, uint64_t bytes);

// A close-on-exec duplicate of `fd`.
Result<kv::UniqueFd> DuplicateFd(int fd);

}  // namespace kv::connector
