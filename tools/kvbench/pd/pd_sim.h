// The P/D engine simulator: prefill and decode engines, one thread per TP rank, each with its
// own Connector, moving deterministic K/V through two kvds and verifying every byte. Shared by
// `kvbench pd` (kvds as processes) and the tests (kvds embedded or as processes).
//
// Requests run in waves of `window`: every prefill rank writes K/V of each layer of the wave's
// requests with the token-writing kernel and saves the layer (a batched forward pass,
// layer by layer); every decode rank loads them, waits per layer and verifies its heads of that
// layer. A wave ends when the sources released every request, so its blocks can be reused.
// Blocks past the wave's are guard blocks, never handed out: they must still be zero at the end.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "connector/connector.h"
#include "tools/kvbench/pd/pd_engines.h"

namespace kv::connector {

// The block ids a wave hands its requests, on each side.
//   kContiguous: request j of a wave holds blocks j*n .. j*n+n-1 (the decode side lays the
//     wave's requests out in reverse order), so one layer of a request is one run on LBNHC.
//   kRandom: each side's wave blocks in a seeded shuffle, the two sides' independent, as a real
//     engine's block allocator hands them out after some churn: one run per block and layer.
enum class BlockIds { kContiguous, kRandom };

struct PdConfig {
  int requests = 16;
  int64_t tokens = 256;
  int64_t layers = 8;
  int64_t heads = 8;  // total KV heads of the model
  int64_t head_dim = 64;
  int64_t prefill_block_size = 16;
  int64_t decode_block_size = 16;
  std::string prefill_order = "LBNHC";
  std::string decode_order = "LBNHC";
  int prefill_tp = 1;
  int decode_tp = 1;
  bool mla = false;  // one latent "head" replicated on every rank
  Mode mode = Mode::kPush;
  int window = 4;  // requests in flight per wave
  BlockIds block_ids = BlockIds::kContiguous;
  uint64_t block_seed = 1;  // kRandom: the shuffles derive from it; every run gets the same ids
  // Prefill ranks write every layer of a wave before its clock starts and save the layers back
  // to back; the clock stops when the last layer is in place and decode ranks verify after it:
  // the figures time kvd alone, as behind an engine whose forward pass outruns the link. Off:
  // writing and verifying K/V (the simulated forward passes) are on the clock, layer by layer.
  bool prewrite = false;
  // Waves of `window` requests run first and verified like the rest, but left out of every
  // figure: the first wave pays what a serving kvd pays once per peer (the peer session, opening
  // the peer's memory: ~12 ms of a 10 ms wave on the H200s).
  int warmup_waves = 0;
  // The forward pass of one layer on the prefill ranks, before they write it (0: none).
  std::chrono::microseconds layer_time{0};
  std::chrono::milliseconds timeout{20000};
  // The engines' connectors spin on their kvd's socket and in their waits
  // (ConnectorOptions::busy_poll), as the kvds do with `kvd --busy-poll`.
  bool engine_busy_poll = false;
  // Security issue 19: end the run after the first wave with a failed request (kvbench pd
  // without --keep-going) instead of starting more waves against a dead kvd; that wave does not
  // wait for the sources to release its requests.
  bool stop_at_failed_wave = false;
  // Prefixes the engines' instance names and the request ids ("TAG-prefill", "TAG-req-0"), so
  // that several runs share the same kvds at once (tests/cluster: one prefill kvd feeding two
  // decode hosts). Empty: "prefill", "decode", "req-N" as before.
  std::string tag;
  // The decode engines' transfer params name the prefill kvd by its daemon name instead of its
  // address (a decode kvd with --etcd resolves it).
  bool peer_by_name = false;
  // Transfer tokens (SECURITY.md): as a router that knows each request ahead, the driver mints a
  // random 128-bit token per request; every prefill rank fixes it with SetTransferToken before
  // its first save and the decode ranks present it, so layers stream while the prefill runs
  // also where kvd requires tokens (a kvd with a secret). False: no tokens (kvds must run
  // --transfer-token optional).
  bool transfer_tokens = true;
  // After the last wave, the engines' copy ceiling of it (PdEngines::MeasureCeiling; host
  // engines only).
  bool copy_ceiling = false;
  // The engines' side of kvd's per-layer trace on stderr, in its format ("trace <us> <event>
  // <request> <layer> 0", steady clock): ewave (the wave's clock starts), esave (a prefill rank's
  // first save of the wave), eloads / ereplied (a decode rank's StartLoads sent / answered),
  // einplace (WaitLayer returned), for tools/pd_timeline.py beside the kvds' debug logs.
  bool trace = false;
};

struct PdResult {
  int requests = 0;
  int verified = 0;
  int failed = 0;
  uint64_t bytes = 0;  // bytes the decode ranks should hold, summed over verified requests
  double seconds = 0;  // on the clock: every wave, less prewriting
  // The warm-up waves' (config.warmup_waves), left out of bytes and seconds: what a peer's first
  // requests see (connecting, opening the peer's memory), measured the same way.
  uint64_t warmup_bytes = 0;
  double warmup_seconds = 0;
  std::vector<double> latency_ms;  // per verified request: load start to last layer verified
                                   // (prewrite: to last layer in place)
  // Per verified request: from its last layer saved (written, on every prefill rank) to its last
  // layer in place (WaitLayer returned on every decode rank): what per-layer streaming leaves
  // after the prefill.
  std::vector<double> stream_ms;
  uint64_t guard_bytes_written = 0;  // non-zero bytes found in decode guard blocks
  uint64_t runs = 0;   // byte runs the prefill kvd posted for the counted waves (its runs_sent)
  uint64_t posts = 0;  // transport posts they went out in (its batches_posted)
  std::string first_error;
  bool stopped_early = false;  // stop_at_failed_wave ended the run before every request ran
  CopyCeiling ceiling;         // config.copy_ceiling: the last wave's; gbps 0 when not measured
};

// Opens one engine's connector: (instance, tp_rank, tp_size) → connector.
using ConnectorFactory =
    std::function<Result<std::unique_ptr<Connector>>(const ConnectorOptions& options)>;

// The layouts of rank `rank` of `tp` for this config's prefill (or decode) side.
Result<LayoutSpec> PdLayout(const PdConfig& config, bool prefill, int rank);

// Runs the simulation; `progress(done, total)` is called from the driver thread after every wave.
// `engines` (null: HostPdEngines(config)) is the caller's, fresh, and outlives the call.
Result<PdResult> RunPd(const PdConfig& config, const ConnectorFactory& prefill,
                       const ConnectorFactory& decode,
                       const std::function<void(int, int)>& progress = nullptr,
                       PdEngines* engines = nullptr);

}  // namespace kv::connector
