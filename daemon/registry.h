// Registry: the engines connected to this kvd, the KV regions each registered (host or GPU
// memory alike) and a GPU engine's layer events. Owned by Daemon::Core (core.h).
//
// Threading: io thread only. A Region is shared: batches and offload copies in flight hold it
// past its engine's disconnect.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/shared_memory.h"
#include "daemon/connection.h"
#include "daemon/setup_worker.h"
#include "gpu/ipc_memory.h"
#include "gpu/layer_events.h"
#include "layout/kv_region.h"
#include "transport/transport.h"

namespace kv::daemon {

// One registered KV region, host or GPU memory alike (engine_session.cc, StartRegister,
// OpenRegion): its shape, the memory object that holds its bytes and keeps them mapped here, where
// that object lives, and the transport registration. A host region is the engine's memfd mapped
// into kvd; a GPU region is the engine's allocation opened through CUDA IPC, or through its fd for
// a VMM allocation. Shared: batches and offload copies in flight hold it, so the mapping outlives
// an engine's disconnect until they finish.
struct Region {
  KvRegion layout;       // the shape only: where the bytes are is `where`
  void* base = nullptr;  // kvd's address of the region's byte 0: host memory, or device memory
  uint64_t bytes = 0;    // of where.device (CUDA IPC mappings are device pointers in kvd too)
  // The memory object's location: host for `host`, the device `gpu` was opened on for `gpu`.
  MemoryLocation where;
  SharedMemory host;                        // host regions: the engine's memfd
  std::shared_ptr<kv::gpu::IpcMemory> gpu;  // GPU regions: the opened allocation
  // Declared last so it is released first, while the memory it names is still mapped.
  std::unique_ptr<transport::MemoryRegistration> registration;
};

// A region opened and registered on the setup worker (OpenRegion), for the io thread.
struct OpenedRegion {
  std::shared_ptr<Region> region;
  std::shared_ptr<kv::gpu::ImportedLayerEvents> events;  // with a GPU engine's first region
  bool vmm = false;
};

struct Engine {
  uint64_t id = 0;
  std::shared_ptr<Connection> conn;
  bool hello = false;
  std::string instance;
  std::string offload_namespace;  // the pool's key namespace: EngineHello's, else instance
  int tp_rank = 0;
  int tp_size = 1;
  std::vector<std::shared_ptr<Region>> regions;
  // GPU engines: the engine's per-layer events, opened with its first region. A copy of
  // layer l out of this engine's regions waits in the event gate until event(l) fired.
  std::shared_ptr<kv::gpu::ImportedLayerEvents> layer_events;
  int offload_in_flight = 0;  // stores and loads accepted and not yet completed
  HeldMessages held;          // while its registration is opened off the io thread
};

class Registry {
 public:
  // A new engine `id` (unique, from Core::next_id_), before its hello.
  Engine& Add(uint64_t id);
  Engine* Find(uint64_t id);
  // Its regions stay alive while batches hold them.
  void Remove(uint64_t id);
  void Clear() { engines_.clear(); }
  // An engine of `instance` rank `tp_rank` already said hello.
  bool HasRank(const std::string& instance, int tp_rank) const;

  struct Totals {
    uint32_t engines = 0;  // that said hello (not kvctl's connections)
    uint32_t regions = 0;
    uint64_t region_bytes = 0;
  };
  Totals totals() const;

  // Every engine, by id, for what walks them all (the hello to peers, shutdown).
  const std::map<uint64_t, Engine>& engines() const { return engines_; }

 private:
  std::map<uint64_t, Engine> engines_;
};

}  // namespace kv::daemon
