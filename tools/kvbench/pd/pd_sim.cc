#include "tools/kvbench/pd/pd_sim.h"

#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <latch>
#include <mutex>
#include <set>
#include <thread>

#include "kernels/strided_kv.h"
#include "protocol/kvd.pb.h"
#include "tools/kvbench/pd/pd_pattern.h"

namespace kv::connector {

namespace {

using Clock = std::chrono::steady_clock;

// One line of the engines' trace (PdConfig::trace): written as it happens, as kvd's are.
void EngineTrace(bool on, const char* event, const std::string& request, int layer) {
  if (!on) return;
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch())
          .count();
  std::fprintf(stderr, "trace %lld %s %s %d 0\n", static_cast<long long>(us), event,
               request.c_str(), layer);
}

// A random 128-bit transfer token, as a router mints one per request (getrandom(2): the
// kernel's CSPRNG).
Result<std::string> MintToken() {
  std::string token(kMinTransferTokenBytes, '\0');
  size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::Internal("getrandom failed: no transfer token");
    got += static_cast<size_t>(n);
  }
  return token;
}

int64_t BlocksFor(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
}

// splitmix64, so that the shuffle is the same with every standard library (std::shuffle's is not).
uint64_t Mix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The block ids of the `count` requests of wave `wave`, `per_request` each, all out of the
// wave's [0, window * per_request): the guard blocks past it are never handed out.
std::vector<std::vector<int64_t>> WaveBlocks(const PdConfig& c, int wave, int count,
                                             int64_t per_request, bool prefill) {
  std::vector<int64_t> pool(static_cast<size_t>(c.window * per_request));
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<int64_t>(i);
  if (c.block_ids == BlockIds::kRandom) {
    uint64_t state = c.block_seed ^ (static_cast<uint64_t>(wave) << 1 | (prefill ? 1 : 0));
    (void)Mix(state);
    for (size_t i = pool.size(); i > 1; --i) std::swap(pool[i - 1], pool[Mix(state) % i]);
  }
  std::vector<std::vector<int64_t>> blocks(count);
  for (int j = 0; j < count; ++j) {
    // Contiguous: the decode side takes the slots in reverse, so neither side's request order
    // matches the other's.
    const int slot = prefill || c.block_ids == BlockIds::kRandom ? j : c.window - 1 - j;
    const auto first = pool.begin() + slot * per_request;
    blocks[j].assign(first, first + per_request);
  }
  return blocks;
}

}  // namespace

Result<LayoutSpec> PdLayout(const PdConfig& c, bool prefill, int rank) {
  const int tp = prefill ? c.prefill_tp : c.decode_tp;
  const int64_t block_size = prefill ? c.prefill_block_size : c.decode_block_size;
  if (tp < 1 || rank < 0 || rank >= tp) return Status::InvalidArgument("bad TP rank");
  if (block_size < 1) return Status::InvalidArgument("block size must be positive");
  if (!c.mla && c.heads >= tp && c.heads % tp != 0) {
    return Status::InvalidArgument(std::to_string(c.heads) + " heads do not split over TP " +
                                   std::to_string(tp));
  }
  LayoutSpec spec;
  spec.order = prefill ? c.prefill_order : c.decode_order;
  spec.layers = c.layers;
  spec.block_size = block_size;
  spec.blocks = c.window * BlocksFor(c.tokens, block_size) + 2;  // + guard blocks
  const bool planes = spec.order.find('S') != std::string::npos;
  spec.content_bytes = (planes ? 1 : 2) * c.head_dim * kernels::kDTypeBytes;
  spec.tp_rank = rank;
  spec.tp_size = tp;
  if (c.mla) {
    spec.heads = 1;
    spec.total_heads = 1;
    spec.replicated = true;
  } else {
    spec.heads = std::max<int64_t>(1, c.heads / tp);
    spec.total_heads = c.heads;
  }
  return spec;
}

Result<PdResult> RunPd(const PdConfig& c, const ConnectorFactory& prefill_factory,
                       const ConnectorFactory& decode_factory,
                       const std::function<void(int, int)>& progress, PdEngines* engines) {
  if (c.requests < 1 || c.window < 1 || c.tokens < 1 || c.layers < 1 || c.head_dim < 1) {
    return Status::InvalidArgument("requests, window, tokens, layers and head_dim must be >= 1");
  }
  // Declared before the connectors, so the caches outlive their registrations.
  std::unique_ptr<PdEngines> host;
  if (engines == nullptr) host = HostPdEngines(c);
  PdEngines* const memory = engines ? engines : host.get();
  struct Engine {
    int rank;
    std::unique_ptr<Connector> connector;
    KvCache cache;
  };
  auto open_side = [&](bool prefill) -> Result<std::vector<Engine>> {
    std::vector<Engine> engines;
    const int tp = prefill ? c.prefill_tp : c.decode_tp;
    for (int r = 0; r < tp; ++r) {
      KV_ASSIGN_OR_RETURN(LayoutSpec spec, PdLayout(c, prefill, r));
      const std::string side = prefill ? "prefill" : "decode";
      ConnectorOptions options{.instance = c.tag.empty() ? side : c.tag + "-" + side,
                               .tp_rank = r,
                               .tp_size = tp,
                               .timeout = c.timeout,
                               .busy_poll = c.engine_busy_poll};
      auto connector = (prefill ? prefill_factory : decode_factory)(options);
      if (!connector.ok()) return connector.status();
      KV_ASSIGN_OR_RETURN(KvCache cache, memory->Register(**connector, spec, prefill));
      engines.push_back(Engine{r, std::move(*connector), cache});
    }
    return engines;
  };
  KV_ASSIGN_OR_RETURN(std::vector<Engine> prefill, open_side(true));
  KV_ASSIGN_OR_RETURN(std::vector<Engine> decode, open_side(false));
  KV_ASSIGN_OR_RETURN(proto::DaemonStatus source, DaemonStatusOf(*prefill.front().connector));

  const int64_t np = BlocksFor(c.tokens, c.prefill_block_size);
  const int64_t nd = BlocksFor(c.tokens, c.decode_block_size);
  uint64_t bytes_per_request = 0;
  for (const Engine& e : decode) {
    bytes_per_request +=
        static_cast<uint64_t>(c.layers * c.tokens * RegionOf(e.cache).size(Axis::kH) *
                              RegionOf(e.cache).logical_content_bytes());
  }

  PdResult result;
  std::mutex mu;
  auto note_error = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (result.first_error.empty()) result.first_error = s.ToString();
  };
  // The prefill kvd's (runs_sent, batches_posted).
  auto sent = [&]() -> std::pair<uint64_t, uint64_t> {
    auto status = DaemonStatusOf(*prefill.front().connector);
    if (!status.ok()) return {0, 0};
    return {status->runs_sent(), status->batches_posted()};
  };
  std::pair<uint64_t, uint64_t> sent_before{0, 0};
  double seconds = 0;
  for (int first = -c.warmup_waves * c.window; first < c.requests; first += c.window) {
    const bool warmup = first < 0;
    if (first == 0) sent_before = sent();
    const int count = std::min(c.window, c.requests - first);
    std::vector<std::string> ids(count), tokens(count);
    std::vector<uint64_t> seeds(count);
    const int wave = first / c.window;
    const auto src_blocks = WaveBlocks(c, wave, count, np, true);
    const auto dst_blocks = WaveBlocks(c, wave, count, nd, false);
    for (int j = 0; j < count; ++j) {
      ids[j] = (c.tag.empty() ? "" : c.tag + "-") +
               (warmup ? "warmup-" + std::to_string(first + j + c.warmup_waves * c.window)
                       : "req-" + std::to_string(first + j));
      seeds[j] = pattern::Seed(ids[j]);
      if (c.transfer_tokens) {
        KV_ASSIGN_OR_RETURN(tokens[j], MintToken());
      }
    }
    std::vector<std::atomic<bool>> failed(count);
    auto fail = [&](int j, const Status& s) {
      if (!s.ok() && !failed[j].exchange(true)) note_error(s);
      return s.ok();
    };
    std::vector<Clock::time_point> done_at(count, Clock::time_point::min());
    // steady_clock nanoseconds: last layer in place on every decode rank.
    std::vector<std::atomic<int64_t>> in_place_ns(count);
    std::latch prefill_finished(static_cast<ptrdiff_t>(prefill.size()));
    std::vector<std::thread> threads;
    auto write_layer = [&](const Engine& e, int64_t l, int j) {
      return fail(j, memory->Write(e.rank, j, seeds[j], l, src_blocks[j]));
    };
    if (c.prewrite) {
      for (const Engine& e : prefill) {
        threads.emplace_back([&, &e = e] {
          for (int64_t l = 0; l < c.layers; ++l) {
            if (Status s = memory->Forward(e.rank, c.layer_time); !s.ok()) note_error(s);
            for (int j = 0; j < count; ++j) write_layer(e, l, j);
          }
          if (Status s = memory->Flush(e.rank); !s.ok()) {
            for (int j = 0; j < count; ++j) fail(j, s);
          }
        });
      }
      for (auto& t : threads) t.join();
      threads.clear();
    }
    // The clock starts once every engine thread is up and waiting, so that it times the
    // engines' saves and loads and kvd, not std::thread's start-up (~0.3 ms of a 13 ms wave on the
    // H200 host before the first save reached kvd).
    std::latch ready(static_cast<ptrdiff_t>(prefill.size() + decode.size()));
    std::latch go(1);
    auto start_together = [&] {
      ready.count_down();
      go.wait();
    };

    for (Engine& e : prefill) {
      threads.emplace_back([&, &e = e] {
        start_together();
        struct CountDown {
          std::latch& latch;
          ~CountDown() { latch.count_down(); }
        } count_down{prefill_finished};
        // The router's tokens, fixed before the first save (one-way, like the saves): the
        // decode's Wants that present them stream at once, also where tokens are required.
        for (int j = 0; c.transfer_tokens && j < count; ++j) {
          fail(j, e.connector->SetTransferToken(ids[j], tokens[j]));
        }
        for (int64_t l = 0; l < c.layers; ++l) {
          if (!c.prewrite) {
            if (Status s = memory->Forward(e.rank, c.layer_time); !s.ok()) {
              for (int j = 0; j < count; ++j) fail(j, s);
            }
          }
          // The layer's saves in one call, as vLLM's worker saves a layer of its whole step.
          std::vector<SaveSpec> saves;
          std::vector<int> slots;
          for (int j = 0; j < count; ++j) {
            // A request whose K/V could not be written is not saved.
            if (c.prewrite ? failed[j].load() : !write_layer(e, l, j)) continue;
            saves.push_back(SaveSpec{ids[j], src_blocks[j]});
            slots.push_back(j);
          }
          if (saves.empty()) continue;
          if (l == 0) EngineTrace(c.trace, "esave", ids[0], 0);
          auto saved = memory->SaveLayers(e.rank, static_cast<int>(l), saves);
          for (size_t k = 0; k < slots.size(); ++k) {
            const int j = slots[k];
            if (!fail(j, saved.ok() ? (*saved)[k] : saved.status())) continue;
            if (l + 1 == c.layers) fail(j, memory->MarkSaved(e.rank, j));
          }
        }
        EngineTrace(c.trace, "esaved", ids[0], static_cast<int>(c.layers) - 1);
        // The wave's finishes in one round trip, as its loads: a pull's decode side waits for
        // them, and one round trip each put a kvd wake-up per request on the wave's clock.
        std::vector<FinishSpec> finishes;
        for (int j = 0; j < count; ++j) finishes.push_back({ids[j], ""});
        for (size_t begin = 0; begin < finishes.size(); begin += kMaxFinishesPerCall) {
          const size_t n = std::min(kMaxFinishesPerCall, finishes.size() - begin);
          auto finished = e.connector->RequestsFinished(std::span(finishes).subspan(begin, n));
          for (size_t k = 0; k < n; ++k) {
            const int j = static_cast<int>(begin + k);
            if (!finished.ok()) {
              fail(j, finished.status());
            } else if (!(*finished)[k].ok()) {
              fail(j, (*finished)[k].status());
            } else if (c.transfer_tokens && (*finished)[k]->transfer_token != tokens[j]) {
              fail(j, Status::Internal("request " + ids[j] +
                                       ": kvd finished it with another transfer token than the "
                                       "one its prefill ranks fixed"));
            }
          }
        }
      });
    }
    for (Engine& e : decode) {
      threads.emplace_back([&, &e = e] {
        start_together();
        if (c.mode == Mode::kPull) prefill_finished.wait();
        // The wave's loads in one round trip, as a worker's start_load_kv hands over a step's:
        // the source hears of every request at once, not one kvd round trip after the other.
        std::vector<LoadSpec> loads;
        for (int j = 0; j < count; ++j) {
          TransferParams params;
          params.peer_address = c.peer_by_name ? source.name() : source.listen_address();
          params.request_id = ids[j];
          params.tokens = c.tokens;
          params.mode = c.mode;
          params.transfer_token = tokens[j];  // empty without c.transfer_tokens
          loads.push_back(LoadSpec{ids[j], std::move(params), dst_blocks[j]});
        }
        for (size_t begin = 0; begin < loads.size(); begin += kMaxLoadsPerCall) {
          const size_t n = std::min(kMaxLoadsPerCall, loads.size() - begin);
          EngineTrace(c.trace, "eloads", ids[begin], -1);
          auto started = e.connector->StartLoads(std::span(loads).subspan(begin, n));
          EngineTrace(c.trace, "ereplied", ids[begin], -1);
          for (size_t k = 0; k < n; ++k) {
            fail(static_cast<int>(begin + k), started.ok() ? (*started)[k] : started.status());
          }
        }
        auto check = [&](int64_t l, int j) {
          return fail(j, memory->Check(e.rank, j, ids[j], seeds[j], l, dst_blocks[j]));
        };
        for (int64_t l = 0; l < c.layers; ++l) {
          for (int j = 0; j < count; ++j) {
            if (failed[j]) continue;
            if (!fail(j, e.connector->WaitLayer(ids[j], static_cast<int>(l)))) continue;
            const auto now = Clock::now();
            EngineTrace(c.trace, "einplace", ids[j], static_cast<int>(l));
            if (l + 1 == c.layers) StoreMax(in_place_ns[j], now.time_since_epoch().count());
            if (!c.prewrite && !check(l, j)) continue;
            std::lock_guard<std::mutex> lock(mu);
            done_at[j] = std::max(done_at[j], c.prewrite ? now : Clock::now());
          }
        }
        // With prewrite the clock stops when the last layer is in place; every byte is checked
        // all the same.
        for (int64_t l = 0; c.prewrite && l < c.layers; ++l) {
          for (int j = 0; j < count; ++j) {
            if (!failed[j]) check(l, j);
          }
        }
        (void)e.connector->GetFinished();
        (void)e.connector->GetFailedBlocks();
      });
    }
    ready.wait();
    const auto wave_start = Clock::now();
    EngineTrace(c.trace, "ewave", ids[0], -1);
    go.count_down();
    for (auto& t : threads) t.join();
    const PdEngines::WaveOutcome outcome = memory->FinishWave(ids);
    for (int j = 0; j < count; ++j) fail(j, outcome.checks[j]);

    // The sources release each request once the destination confirmed (or it failed): only then
    // may the next wave reuse the blocks.
    const auto deadline = Clock::now() + c.timeout;
    const bool any_failed = std::any_of(failed.begin(), failed.end(),
                                        [](const std::atomic<bool>& f) { return f.load(); });
    for (Engine& e : prefill) {
      // A source kvd that is gone releases nothing and writes nothing more.
      if (any_failed && !DaemonStatusOf(*e.connector).ok()) continue;
      if (any_failed && c.stop_at_failed_wave) continue;  // no next wave reuses them
      std::set<std::string> released;
      while (static_cast<int>(released.size()) < count && Clock::now() < deadline) {
        for (auto& id : e.connector->GetFinished().sent) released.insert(id);
        if (static_cast<int>(released.size()) < count) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      if (static_cast<int>(released.size()) < count) {
        note_error(Status::Timeout("the source did not release wave " + std::to_string(wave) +
                                   " in time"));
        for (int j = 0; j < count; ++j) failed[j] = failed[j] || !released.count(ids[j]);
      }
    }
    auto wave_end = Clock::now();
    if (c.prewrite) {
      wave_end = wave_start;
      for (const auto& t : done_at) wave_end = std::max(wave_end, t);
    }
    if (warmup) {
      for (int j = 0; j < count; ++j) {
        if (failed[j]) return Status::Aborted("warm-up wave failed: " + result.first_error);
      }
      result.warmup_seconds += std::chrono::duration<double>(wave_end - wave_start).count();
      result.warmup_bytes += static_cast<uint64_t>(count) * bytes_per_request;
      continue;
    }
    seconds += std::chrono::duration<double>(wave_end - wave_start).count();
    for (int j = 0; j < count; ++j) {
      ++result.requests;
      if (failed[j]) {
        ++result.failed;
        continue;
      }
      ++result.verified;
      result.bytes += bytes_per_request;
      result.latency_ms.push_back(
          std::chrono::duration<double, std::milli>(done_at[j] - wave_start).count());
      result.stream_ms.push_back(static_cast<double>(in_place_ns[j] - outcome.saved_ns[j]) / 1e6);
    }
    if (progress) progress(result.requests, c.requests);
    // kvbench pd stops at the first failed wave unless --keep-going: a dead kvd fails every
    // later wave too. A failed last wave ends the run as any other would.
    if (c.stop_at_failed_wave && first + c.window < c.requests &&
        std::any_of(failed.begin(), failed.end(),
                    [](const std::atomic<bool>& f) { return f.load(); })) {
      result.stopped_early = true;
      break;
    }
  }
  result.seconds = seconds;
  const auto sent_after = sent();
  result.runs = sent_after.first - sent_before.first;
  result.posts = sent_after.second - sent_before.second;
  for (const Engine& e : decode) {
    KV_ASSIGN_OR_RETURN(uint64_t written, memory->GuardBytes(e.rank, c.window * nd));
    result.guard_bytes_written += written;
  }
  if (c.copy_ceiling && result.verified > 0) {
    auto ceiling = memory->MeasureCeiling();
    if (ceiling.ok()) {
      result.ceiling = *ceiling;
    } else if (ceiling.status().code() != Code::kUnsupported) {
      note_error(ceiling.status().WithContext("the copy ceiling"));
    }
  }
  return result;
}

}  // namespace kv::connector
