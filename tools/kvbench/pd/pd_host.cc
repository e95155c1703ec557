// The P/D simulator's host engines: caches in the shared memory RegisterKvCaches allocates,
// K/V written with the token-writing kernel's CPU reference and checked byte by byte.
#include <algorithm>
#include <cstring>
#include <mutex>
#include <thread>

#include "kernels/strided_kv.h"
#include "kernels/write_tokens.h"
#include "tools/kvbench/pd/pd_engines.h"
#include "tools/kvbench/pd/pd_pattern.h"
#include "tools/kvbench/pd/pd_sim.h"

namespace kv::connector {
namespace {

using pattern::Element;
using pattern::Row;

class HostEngines final : public PdEngines {
 public:
  explicit HostEngines(const PdConfig& config)
      : head_dim_(config.head_dim),
        tokens_(config.tokens),
        saved_ns_(config.window, 0),
        written_(config.window),
        checked_(config.window) {}

  Result<KvCache> Register(Connector& connector, const LayoutSpec& spec, bool prefill) override {
    KV_ASSIGN_OR_RETURN(auto caches, connector.RegisterKvCaches(HostCaches({&spec, 1})));
    (prefill ? prefill_ : decode_).push_back(Rank{&connector, caches.front()});
    return caches.front();
  }

  Status Forward(int, std::chrono::microseconds time) override {
    if (time.count() > 0) std::this_thread::sleep_for(time);
    return Status::Ok();
  }

  Status Write(int rank, int slot, uint64_t seed, int64_t layer,
               std::span<const int64_t> blocks) override {
    if (rank == 0) Note(written_, slot, blocks);
    const KvCache& cache = prefill_[rank].cache;
    const KvRegion region = RegionOf(cache);
    const int64_t heads = region.size(Axis::kH);
    const int64_t n = region.size(Axis::kN);
    std::vector<uint16_t> k(tokens_ * heads * head_dim_), v(k.size());
    std::vector<int64_t> slots(tokens_);
    for (int64_t t = 0; t < tokens_; ++t) {
      slots[t] = blocks[t / n] * n + t % n;
      for (int64_t h = 0; h < heads; ++h) {
        const uint64_t row = Row(seed, layer, region.global_head(h), t);
        for (int64_t d = 0; d < head_dim_; ++d) {
          k[(t * heads + h) * head_dim_ + d] = Element(row, d, 0);
          v[(t * heads + h) * head_dim_ + d] = Element(row, d, 1);
        }
      }
    }
    const kernels::StridedKv strided = kernels::DescribeRegion(region);
    KV_ASSIGN_OR_RETURN(kernels::PagedKv paged,
                        kernels::SplitKv(strided, head_dim_, kernels::DType::kFloat16));
    kernels::NewTokens input;
    input.key = k.data();
    input.value = v.data();
    input.slots = slots.data();
    input.tokens = tokens_;
    return kernels::WriteTokensHost(
        paged, static_cast<char*>(cache.base) + layer * strided.layer_stride, input);
  }

  Result<std::vector<Status>> SaveLayers(int rank, int layer,
                                         std::span<const SaveSpec> saves) override {
    return prefill_[rank].connector->SaveLayers(layer, saves);
  }

  Status MarkSaved(int, int slot) override {
    std::lock_guard<std::mutex> lock(mu_);
    saved_ns_[slot] = std::chrono::steady_clock::now().time_since_epoch().count();
    return Status::Ok();
  }

  Status Flush(int) override { return Status::Ok(); }

  Status Check(int rank, int slot, const std::string& id, uint64_t seed, int64_t layer,
               std::span<const int64_t> blocks) override {
    if (rank == 0) Note(checked_, slot, blocks);
    const KvCache& cache = decode_[rank].cache;
    const KvRegion region = RegionOf(cache);
    const int64_t n = region.size(Axis::kN);
    const auto* base = static_cast<const char*>(cache.base);
    for (int64_t t = 0; t < tokens_; ++t) {
      for (int64_t h = 0; h < region.size(Axis::kH); ++h) {
        const int64_t g = region.global_head(h);
        const auto loc = region.kv(layer, blocks[t / n], h, t % n);
        const uint64_t row = Row(seed, layer, g, t);
        for (int64_t d = 0; d < head_dim_; ++d) {
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

  WaveOutcome FinishWave(const std::vector<std::string>& ids) override {
    std::lock_guard<std::mutex> lock(mu_);
    WaveOutcome outcome{std::vector<Status>(ids.size()),
                        std::vector<int64_t>(saved_ns_.begin(), saved_ns_.begin() + ids.size())};
    std::fill(saved_ns_.begin(), saved_ns_.end(), 0);
    last_wave_ = ids.size();
    return outcome;
  }

  Result<uint64_t> GuardBytes(int rank, int64_t first_block) override {
    const KvRegion region = RegionOf(decode_[rank].cache);
    const auto* base = static_cast<const unsigned char*>(decode_[rank].cache.base);
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

  Result<CopyCeiling> MeasureCeiling() override {
    std::vector<KvCache> prefill, decode;
    for (const Rank& r : prefill_) prefill.push_back(r.cache);
    for (const Rank& r : decode_) decode.push_back(r.cache);
    std::vector<std::vector<int64_t>> from, to;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t j = 0; j < last_wave_; ++j) {
        from.push_back(written_[j]);
        to.push_back(checked_[j]);
      }
    }
    return MeasureCopyCeiling(prefill, decode, from, to, tokens_);
  }

 private:
  // Keeps the blocks of the request in wave slot `slot`, for the copy ceiling.
  void Note(std::vector<std::vector<int64_t>>& lists, int slot, std::span<const int64_t> blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& list = lists[slot];
    if (!std::equal(list.begin(), list.end(), blocks.begin(), blocks.end()))
      list.assign(blocks.begin(), blocks.end());
  }

  struct Rank {
    Connector* connector;
    KvCache cache;
  };
  const int64_t head_dim_;
  const int64_t tokens_;
  std::vector<Rank> prefill_, decode_;
  std::mutex mu_;
  std::vector<int64_t> saved_ns_;  // per wave slot; every prefill rank's thread marks it
  // Per wave slot, the blocks of its latest request on each side (rank 0's; every rank's are the
  // same), for MeasureCeiling.
  std::vector<std::vector<int64_t>> written_, checked_;
  size_t last_wave_ = 0;  // requests in the last wave
};

}  // namespace

std::unique_ptr<PdEngines> HostPdEngines(const PdConfig& config) {
  return std::make_unique<HostEngines>(config);
}

}  // namespace kv::connector
