// CudaPdEngines: the P/D simulator's engines on GPUs (`kvbench pd --memory cuda`).
//
// Every rank cudaMallocs its cache on its side's device (prefill ranks on one GPU, decode ranks
// on another, or the same one) and registers it with RegisterKvCaches. Everything a rank does
// is queued on its own stream, with no host synchronisation between layers:
//   prefill: Forward (a kernel that waits layer_time), Write (K/V generated on the device from
//     connector/pd_pattern.h as finite bf16, stored by the token-writing kernel, then the decode
//     attention of a query of (request, layer) over the cache), SaveLayers (with the stream:
//     kvd's copy waits for its event), MarkSaved (a host function on the stream);
//   decode: Check after WaitLayer (a kernel comparing every element of the rank's heads with the
//     pattern, then the same decode attention over the decode cache).
// FinishWave synchronises (bounded by the config's timeout), and fails a request whose bytes
// differ or whose decode attention differs from the prefill side's for the same query by more
// than 2 bf16 ulps (|a - b| <= 2^-7 |b| + 2^-10; both sides run the same kernel, so they agree
// exactly unless TP changes its partitioning).
//
// Builds without CUDA compile pd_gpu_stub.cc instead: Create says that --memory cuda needs a
// CUDA build.
#pragma once

#include <cstdint>
#include <memory>

#include "tools/kvbench/pd/pd_engines.h"
#include "tools/kvbench/pd/pd_sim.h"
#include "base/status.h"

namespace kv::connector {

// CUDA devices this process can use: 0 without CUDA, without a driver or without a device.
int CudaDeviceCount();

class CudaPdEngines : public PdEngines {
 public:
  // Query heads per KV head of the decode attention check (Llama-3-8B's 32 / 8).
  static constexpr int64_t kQueryHeadsPerKvHead = 4;

  // kUnsupported: no CUDA in this build, or a head_dim the attention kernel lacks (64, 128,
  // 256). kUnavailable: no CUDA device, or an ordinal this process does not see.
  static Result<std::unique_ptr<CudaPdEngines>> Create(const PdConfig& config, int prefill_device,
                                                       int decode_device);

  struct AttentionCheck {
    uint64_t values = 0;  // output elements compared, over every verified request and layer
    uint64_t exact = 0;   // of them bit-identical
    double max_abs_diff = 0;
  };
  // What the decode attention comparisons of the waves finished so far found.
  virtual AttentionCheck attention() const = 0;
};

}  // namespace kv::connector
