// The backends of the transport conformance suite (conformance_suite.h). An entry says how to
// make either side of a connected pair: the transport's name and settings, the memory a side
// registers, whether the two sides are threads of the test process or processes of their own, and
// what killing the target means there. Adding a backend to the suite is one entry in a list:
// HostBackends() below, GpuBackends() in tests/gpu/conformance_gpu_test.cc.
//
// Every entry is plain data plus function pointers, so a forked child can use its copy.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "transport/transport.h"

namespace kv::transport::conformance {

// The memory one side registers. Created by the thread or process that owns the side (after any
// fork: CUDA memory must be), and outlives that side's transport. Read() may run on the
// transport's progress thread (a notification handler's snapshot) while the owner waits.
class SideMemory {
 public:
  virtual ~SideMemory() = default;
  virtual void* base() = 0;
  virtual MemoryLocation location() const = 0;
  // Overwrites the whole memory with `bytes` (its length).
  virtual Status Write(const std::vector<uint8_t>& bytes) = 0;
  // The whole memory as it is now (what a completion or a notification said had landed).
  virtual Result<std::vector<uint8_t>> Read() = 0;
  // The memory object it lives in, for register_shared_memory (none by default).
  virtual Transport::SharedObject shared() const { return {}; }
};

// Allocates `bytes` of memory on `device` (-1: none named).
using MemoryFactory = Result<std::unique_ptr<SideMemory>> (*)(int device, uint64_t bytes);

// Host memory (malloc); ignores the device.
Result<std::unique_ptr<SideMemory>> HostMemory(int device, uint64_t bytes);
// Host memory in a sealed memfd (base/shared_memory.h), as kvd holds an engine's region; shared()
// names it. Ignores the device.
Result<std::unique_ptr<SideMemory>> SharedHostMemory(int device, uint64_t bytes);

enum class Hosting {
  // Both sides are threads of the test process (a backend that only reaches its own process,
  // "local"); killing the target destroys its transport: a closed endpoint.
  kThreads,
  // Each side is a forked child; killing the target is SIGKILL.
  kProcesses,
};

// Why a backend cannot run here (the cases skip with it), or empty when it can.
using Availability = std::string (*)();

struct Backend {
  std::string name = {};       // the instantiation's name, e.g. "ucx_tcp"
  std::string transport = {};  // what CreateTransport() is given
  std::vector<std::pair<std::string, std::string>> settings = {};
  Hosting hosting = Hosting::kProcesses;
  MemoryFactory memory = &HostMemory;
  // Passed as the "device" setting (and to `memory`) when ≥ 0.
  int initiator_device = -1;
  int target_device = -1;
  Availability unavailable = nullptr;  // null: always available
  // Whether a killed target is sure to leave some of a gigabyte of queued puts unwritten, so
  // that some of them must fail. False where the copies run on the device and may all be done
  // before the kill lands (cuda_ipc); the completions are still bounded and checked.
  bool kill_outpaces_data = true;
  // Whether the backend reports its steps per batch (TransportOptions::trace): nccl, cuda_ipc.
  bool traces_steps = false;
};

inline void PrintTo(const Backend& backend, std::ostream* out) {
  *out << backend.name;
}

// "ucx" entries skip where this build has no UCX.
inline std::string UnlessUcx() {
  for (const std::string& name : AvailableTransports()) {
    if (name == "ucx") return {};
  }
  return "this build has no ucx backend";
}

// The backends that run on a machine without a GPU, host memory on both sides.
inline std::vector<Backend> HostBackends() {
  return {
      // Its puts are memcpy on its progress thread (the same 4 MiB source each time), and a kill is
      // a round trip to the target thread: the gigabyte could land first (2 and 6 of 20 runs on
      // the quiet 2-core VM), so the kill is not sure to outpace it.
      {.name = "local",
       .transport = "local",
       .hosting = Hosting::kThreads,
       .kill_outpaces_data = false},
      {.name = "ucx_tcp",
       .transport = "ucx",
       .settings = {{"UCX_TLS", "tcp"}},
       .unavailable = &UnlessUcx},
      {.name = "ucx_shm",
       .transport = "ucx",
       .settings = {{"UCX_TLS", "shm"}},
       .unavailable = &UnlessUcx},
      // The staged decorator's whole protocol (slots, chunks, acks, held notifications) with
      // memcpy for the copies; 64 KiB slots so that batches take many chunks.
      {.name = "staged_host",
       .transport = "ucx",
       .settings = {{"UCX_TLS", "tcp"},
                    {"stage_host", "1"},
                    {"staging_bytes", "65536"},
                    {"staging_slots", "2"}},
       .unavailable = &UnlessUcx},
      // The peer's memfd mapped, one memcpy per run.
      {.name = "host_ipc", .transport = "host_ipc", .memory = &SharedHostMemory},
  };
}

}  // namespace kv::transport::conformance
