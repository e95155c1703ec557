#include "connector/pd_sim.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <latch>
#include <mutex>
#include <set>
#include <thread>

#include "kernels/strided_kv.h"
#include "kernels/write_tokens.h"

namespace kv::connector {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t Mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t Seed(const std::string& id) {
  uint64_t h = 1469598103934665603ull;
  for (char c : id) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

// The value of element d of K (kv = 0) or V (kv = 1) of (layer, global head, token): what every
// rank holding that head must end up with, whatever its layout. One hash per row keeps writing
// and verifying cheap next to the transfer being measured; rows differ in every element.
uint64_t Row(uint64_t seed, int64_t layer, int64_t head, int64_t token) {
  return Mix(seed ^ Mix((static_cast<uint64_t>(layer) << 44) ^ (static_cast<uint64_t>(head) << 28) ^
                        static_cast<uint64_t>(token)));
}

uint16_t Element(uint64_t row, int64_t d, int kv) {
  return static_cast<uint16_t>((row >> (kv * 16)) + static_cast<uint64_t>(d) * 0x9e37u + kv);
}

struct Engine {
  std::unique_ptr<Connector> connector;
  KvCache cache;
};

Status WriteLayer(const Engine& e, uint64_t seed, int64_t layer, const std::vector<int64_t>& blocks,
                  int64_t tokens, int64_t head_dim) {
  const KvRegion& region = e.cache.layout;
  const int64_t heads = region.size(Axis::kH);
  const int64_t n = region.size(Axis::kN);
  std::vector<uint16_t> k(tokens * heads * head_dim), v(k.size());
  std::vector<int64_t> slots(tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    slots[t] = blocks[t / n] * n + t % n;
    for (int64_t h = 0; h < heads; ++h) {
      const uint64_t row = Row(seed, layer, region.global_head(h), t);
      for (int64_t d = 0; d < head_dim; ++d) {
        k[(t * heads + h) * head_dim + d] = Element(row, d, 0);
        v[(t * heads + h) * head_dim + d] = Element(row, d, 1);
      }
    }
  }
  const kernels::StridedKv strided = kernels::DescribeRegion(region);
  KV_ASSIGN_OR_RETURN(kernels::PagedKv paged,
                      kernels::SplitKv(strided, head_dim, kernels::DType::kFloat16));
  kernels::NewTokens input;
  input.key = k.data();
  input.value = v.data();
  input.slots = slots.data();
  input.tokens = tokens;
  return kernels::WriteTokensHost(
      paged, static_cast<char*>(e.cache.base) + layer * strided.layer_stride, input);
}

Status VerifyLayer(const Engine& e, const std::string& id, uint64_t seed, int64_t layer,
                   const std::vector<int64_t>& blocks, int64_t tokens, int64_t head_dim) {
  const KvRegion& region = e.cache.layout;
  const int64_t n = region.size(Axis::kN);
  const auto* base = static_cast<const char*>(e.cache.base);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < region.size(Axis::kH); ++h) {
      const int64_t g = region.global_head(h);
      const auto loc = region.kv(layer, blocks[t / n], h, t % n);
      const uint64_t row = Row(seed, layer, g, t);
      for (int64_t d = 0; d < head_dim; ++d) {
        uint16_t got[2];
        std::memcpy(&got[0], base + loc.k_offset + 2 * d, 2);
        std::memcpy(&got[1], base + loc.v_offset + 2 * d, 2);
        for (int kv = 0; kv < 2; ++kv) {
          if (got[kv] != Element(row, d, kv)) {
            return Status::Internal("request " + id + ": " + (kv ? "V" : "K") + " of layer " +
                                    std::to_string(layer) + " head " + std::to_string(g) +
                                    " token " + std::to_string(t) + " element " +
                                    std::to_string(d) + " differs");
          }
        }
      }
    }
  }
  return Status::Ok();
}

uint64_t NonZeroBytesFrom(const Engine& e, int64_t first_block) {
  const KvRegion& region = e.cache.layout;
  const auto* base = static_cast<const unsigned char*>(e.cache.base);
  uint64_t count = 0;
  for (int64_t l = 0; l < region.size(Axis::kL); ++l) {
    for (int64_t b = first_block; b < region.size(Axis::kB); ++b) {
      for (int64_t h = 0; h < region.size(Axis::kH); ++h) {
        for (int64_t n = 0; n < region.size(Axis::kN); ++n) {
          const auto loc = region.kv(l, b, h, n);
          for (uint64_t i = 0; i < loc.bytes; ++i) {
            count += (base[loc.k_offset + i] != 0) + (base[loc.v_offset + i] != 0);
          }
        }
      }
    }
  }
  return count;
}

int64_t BlocksFor(int64_t tokens, int64_t block_size) {
  return (tokens + block_size - 1) / block_size;
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
                       const std::function<void(int, int)>& progress) {
  if (c.requests < 1 || c.window < 1 || c.tokens < 1 || c.layers < 1 || c.head_dim < 1) {
    return Status::InvalidArgument("requests, window, tokens, layers and head_dim must be >= 1");
  }
  auto open_side = [&](bool prefill) -> Result<std::vector<Engine>> {
    std::vector<Engine> engines;
    const int tp = prefill ? c.prefill_tp : c.decode_tp;
    for (int r = 0; r < tp; ++r) {
      KV_ASSIGN_OR_RETURN(LayoutSpec spec, PdLayout(c, prefill, r));
      ConnectorOptions options{prefill ? "prefill" : "decode", r, tp, c.timeout};
      auto connector = (prefill ? prefill_factory : decode_factory)(options);
      if (!connector.ok()) return connector.status();
      KV_ASSIGN_OR_RETURN(auto caches, (*connector)->RegisterKvCaches({&spec, 1}));
      engines.push_back(Engine{std::move(*connector), caches.front()});
    }
    return engines;
  };
  KV_ASSIGN_OR_RETURN(std::vector<Engine> prefill, open_side(true));
  KV_ASSIGN_OR_RETURN(std::vector<Engine> decode, open_side(false));
  KV_ASSIGN_OR_RETURN(proto::DaemonStatus source, prefill.front().connector->DaemonStatus());

  const int64_t np = BlocksFor(c.tokens, c.prefill_block_size);
  const int64_t nd = BlocksFor(c.tokens, c.decode_block_size);
  uint64_t bytes_per_request = 0;
  for (const Engine& e : decode) {
    bytes_per_request += static_cast<uint64_t>(c.layers * c.tokens * e.cache.layout.size(Axis::kH) *
                                               e.cache.layout.logical_content_bytes());
  }

  PdResult result;
  std::mutex mu;
  auto note_error = [&](const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (result.first_error.empty()) result.first_error = s.ToString();
  };
  double seconds = 0;
  for (int first = 0; first < c.requests; first += c.window) {
    const int count = std::min(c.window, c.requests - first);
    std::vector<std::string> ids(count);
    std::vector<std::vector<int64_t>> src_blocks(count), dst_blocks(count);
    for (int j = 0; j < count; ++j) {
      ids[j] = "req-" + std::to_string(first + j);
      for (int64_t k = 0; k < np; ++k) src_blocks[j].push_back(j * np + k);
      for (int64_t k = 0; k < nd; ++k) dst_blocks[j].push_back((c.window - 1 - j) * nd + k);
    }
    std::vector<std::atomic<bool>> failed(count);
    std::vector<Clock::time_point> done_at(count, Clock::time_point::min());
    std::latch prefill_finished(static_cast<ptrdiff_t>(prefill.size()));
    std::vector<std::thread> threads;
    auto write_layer = [&](const Engine& e, int64_t l, int j) {
      Status s = WriteLayer(e, Seed(ids[j]), l, src_blocks[j], c.tokens, c.head_dim);
      if (!s.ok() && !failed[j].exchange(true)) note_error(s);
      return s.ok();
    };
    if (c.prewrite) {
      for (const Engine& e : prefill) {
        threads.emplace_back([&, &e = e] {
          for (int64_t l = 0; l < c.layers; ++l) {
            for (int j = 0; j < count; ++j) write_layer(e, l, j);
          }
        });
      }
      for (auto& t : threads) t.join();
      threads.clear();
    }
    const auto wave_start = Clock::now();

    for (Engine& e : prefill) {
      threads.emplace_back([&, &e = e] {
        struct CountDown {
          std::latch& latch;
          ~CountDown() { latch.count_down(); }
        } count_down{prefill_finished};
        for (int64_t l = 0; l < c.layers; ++l) {
          for (int j = 0; j < count; ++j) {
            // A request whose K/V could not be written is not saved.
            if (c.prewrite ? failed[j].load() : !write_layer(e, l, j)) continue;
            Status s = e.connector->SaveLayer(ids[j], static_cast<int>(l), src_blocks[j]);
            if (!s.ok() && !failed[j].exchange(true)) note_error(s);
          }
        }
        for (int j = 0; j < count; ++j) {
          auto params = e.connector->RequestFinished(ids[j]);
          if (!params.ok() && !failed[j].exchange(true)) note_error(params.status());
        }
      });
    }
    for (Engine& e : decode) {
      threads.emplace_back([&, &e = e] {
        if (c.mode == Mode::kPull) prefill_finished.wait();
        for (int j = 0; j < count; ++j) {
          TransferParams params;
          params.peer_address = source.listen_address();
          params.request_id = ids[j];
          params.tokens = c.tokens;
          params.mode = c.mode;
          Status s = e.connector->StartLoad(ids[j], params, dst_blocks[j]);
          if (!s.ok() && !failed[j].exchange(true)) note_error(s);
        }
        auto verify = [&](int64_t l, int j) {
          Status s = VerifyLayer(e, ids[j], Seed(ids[j]), l, dst_blocks[j], c.tokens, c.head_dim);
          if (!s.ok() && !failed[j].exchange(true)) note_error(s);
          return s.ok();
        };
        for (int64_t l = 0; l < c.layers; ++l) {
          for (int j = 0; j < count; ++j) {
            if (failed[j]) continue;
            Status s = e.connector->WaitLayer(ids[j], static_cast<int>(l));
            if (!s.ok()) {
              if (!failed[j].exchange(true)) note_error(s);
              continue;
            }
            if (!c.prewrite && !verify(l, j)) continue;
            std::lock_guard<std::mutex> lock(mu);
            done_at[j] = std::max(done_at[j], Clock::now());
          }
        }
        // With prewrite the clock stops when the last layer is in place; every byte is checked
        // all the same.
        for (int64_t l = 0; c.prewrite && l < c.layers; ++l) {
          for (int j = 0; j < count; ++j) {
            if (!failed[j]) verify(l, j);
          }
        }
        (void)e.connector->GetFinished();
        (void)e.connector->GetFailedBlocks();
      });
    }
    for (auto& t : threads) t.join();

    // The sources release each request once the destination confirmed (or it failed): only then
    // may the next wave reuse the blocks.
    const auto deadline = Clock::now() + c.timeout;
    const bool any_failed = std::any_of(failed.begin(), failed.end(),
                                        [](const std::atomic<bool>& f) { return f.load(); });
    for (Engine& e : prefill) {
      // A source kvd that is gone releases nothing and writes nothing more.
      if (any_failed && !e.connector->DaemonStatus().ok()) continue;
      std::set<std::string> released;
      while (static_cast<int>(released.size()) < count && Clock::now() < deadline) {
        for (auto& id : e.connector->GetFinished().sent) released.insert(id);
        if (static_cast<int>(released.size()) < count) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      if (static_cast<int>(released.size()) < count) {
        note_error(Status::Timeout("the source did not release wave " +
                                   std::to_string(first / c.window) + " in time"));
        for (int j = 0; j < count; ++j) failed[j] = failed[j] || !released.count(ids[j]);
      }
    }
    auto wave_end = Clock::now();
    if (c.prewrite) {
      wave_end = wave_start;
      for (const auto& t : done_at) wave_end = std::max(wave_end, t);
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
    }
    if (progress) progress(result.requests, c.requests);
  }
  result.seconds = seconds;
  for (const Engine& e : decode) result.guard_bytes_written += NonZeroBytesFrom(e, c.window * nd);
  return result;
}

}  // namespace kv::connector
