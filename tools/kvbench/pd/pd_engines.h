// PdEngines: where the P/D simulator's engines keep their KV caches and how they write and check
// K/V in them. RunPd (pd_sim.h) drives the protocol (save, load, wait per layer) and asks its
// PdEngines for everything that touches the caches' memory:
//   HostPdEngines (pd_host.cc): shared host memory, the kernels' CPU references, every call
//     finished when it returns;
//   CudaPdEngines (pd_gpu.h): cudaMalloc'd caches, the CUDA kernels on one stream per rank, so
//     writes and checks are only queued and FinishWave reports them.
//
// Threading: the rank methods (Forward .. Check) of rank r of one side are called from that
// rank's thread only; Register, FinishWave and GuardBytes from the driver while no rank thread
// runs. One PdEngines serves one RunPd.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "connector/connector.h"
#include "tools/kvbench/pd/pd_ceiling.h"

namespace kv::connector {

struct PdConfig;

class PdEngines {
 public:
  virtual ~PdEngines() = default;

  // Allocates the cache of rank spec.tp_rank of the prefill (or decode) side and registers it
  // with `connector`, which the rank methods then use. Ranks are registered in order, prefill
  // side first; the connector outlives every later call.
  virtual Result<KvCache> Register(Connector& connector, const LayoutSpec& spec, bool prefill) = 0;

  // ---- prefill rank ----
  // One layer's forward pass, `time` long (host: sleeps; CUDA: a kernel queued on the stream).
  virtual Status Forward(int rank, std::chrono::microseconds time) = 0;
  // Writes K/V of `layer` of the request in wave slot `slot` (seed pattern::Seed(id)) into
  // `blocks`, token t at blocks[t / block_size].
  virtual Status Write(int rank, int slot, uint64_t seed, int64_t layer,
                       std::span<const int64_t> blocks) = 0;
  // Connector::SaveLayers of `layer` for `saves` once what Write queued before it is written: a
  // step's saves in one call, as vLLM's worker hands them over.
  virtual Result<std::vector<Status>> SaveLayers(int rank, int layer,
                                                 std::span<const SaveSpec> saves) = 0;
  // Notes, for `slot`, the time everything this rank saved so far is written (FinishWave
  // reports the latest over the ranks).
  virtual Status MarkSaved(int rank, int slot) = 0;
  // Waits until everything this rank queued has run, or its error.
  virtual Status Flush(int rank) = 0;

  // ---- decode rank ----
  // Checks every byte of `layer` of the request in `slot` (loaded into `blocks`). Host: the
  // outcome. CUDA: an error of queuing only; the bytes' outcome comes from FinishWave.
  virtual Status Check(int rank, int slot, const std::string& id, uint64_t seed, int64_t layer,
                       std::span<const int64_t> blocks) = 0;

  // ---- driver ----
  // After a wave of the requests `ids` (slot j holds ids[j]): waits for every rank's queued
  // work and reports per slot.
  struct WaveOutcome {
    std::vector<Status> checks;     // the first error its queued checks found (bytes, decode
                                    // attention against the prefill side's)
    std::vector<int64_t> saved_ns;  // MarkSaved's latest time, steady_clock ns; 0: none
  };
  virtual WaveOutcome FinishWave(const std::vector<std::string>& ids) = 0;
  // Non-zero bytes in decode rank `rank`'s blocks [first_block, blocks): guard blocks no request
  // may touch.
  virtual Result<uint64_t> GuardBytes(int rank, int64_t first_block) = 0;
  // The copy ceiling of the last wave written and checked (pd_ceiling.h); after the last wave.
  // kUnsupported where the engines cannot copy between the caches themselves (CUDA: the GPU
  // ceilings of gpu_ceiling.h are measured instead).
  virtual Result<CopyCeiling> MeasureCeiling() {
    return Status::Unsupported("these engines have no copy ceiling");
  }
};

// Engines on shared host memory: what RunPd uses when given none.
std::unique_ptr<PdEngines> HostPdEngines(const PdConfig& config);

// Raises `latest` to `value`.
inline void StoreMax(std::atomic<int64_t>& latest, int64_t value) {
  int64_t seen = latest.load();
  while (seen < value && !latest.compare_exchange_weak(seen, value)) {
  }
}

}  // namespace kv::connector
