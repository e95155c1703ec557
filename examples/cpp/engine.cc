// A tiny C++ engine built against the installed kvd (find_package(kvd) -> kvd::connector).
//
// Two kvd cores run inside this process (embedded mode) so that the example needs no daemon:
// a prefill engine writes one request's K/V into its host cache and saves it layer by layer;
// a decode engine loads it into other blocks of its own cache, waits per layer and checks every
// byte. A real engine opens its node's kvd instead: Connector::Open("/run/kvd.sock", options).
#include <kv/connector.h>

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

using kv::connector::Connector;

int Fail(const char* what, const kv::Status& s) {
  std::fprintf(stderr, "engine: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main() {
  std::printf("kvd connector %s\n", kv::connector::Version());
  // 4 layers × 16 blocks × 2 heads × 16 tokens × 256 bytes (K+V of head_dim 64 in bf16), LBNHC.
  kv::LayoutSpec layout{.order = "LBNHC",
                        .layers = 4,
                        .blocks = 16,
                        .heads = 2,
                        .block_size = 16,
                        .content_bytes = 256};
  auto p = kv::connector::StartEmbeddedDaemon({.name = "prefill-node"});
  auto d = kv::connector::StartEmbeddedDaemon({.name = "decode-node"});
  if (!p.ok()) return Fail("start prefill kvd", p.status());
  if (!d.ok()) return Fail("start decode kvd", d.status());
  auto prefill = Connector::OpenEmbedded(*p, {.instance = "prefill"});
  auto decode = Connector::OpenEmbedded(*d, {.instance = "decode"});
  if (!prefill.ok()) return Fail("open prefill", prefill.status());
  if (!decode.ok()) return Fail("open decode", decode.status());

  const kv::connector::KvCacheDesc desc{layout};  // host memory the library allocates
  auto src = (*prefill)->RegisterKvCaches({&desc, 1});
  auto dst = (*decode)->RegisterKvCaches({&desc, 1});
  if (!src.ok()) return Fail("register prefill cache", src.status());
  if (!dst.ok()) return Fail("register decode cache", dst.status());
  const kv::LayoutSpec& s = (*src)[0].layout;  // normalised: every stride filled in
  const int64_t page = s.strides[static_cast<int>(kv::Axis::kB)];
  const int64_t layer_bytes = s.strides[static_cast<int>(kv::Axis::kL)];

  // One request of 32 tokens: prefill blocks {3, 7}, decode blocks {10, 2}.
  const std::vector<int64_t> src_blocks{3, 7}, dst_blocks{10, 2};
  kv::connector::TransferParams params;
  params.peer_address = kv::connector::EmbeddedDaemonAddress(**p);
  params.tokens = 32;
  if (auto st = (*decode)->StartLoad("req-1", params, dst_blocks); !st.ok()) {
    return Fail("start load", st);
  }
  auto* src_base = static_cast<unsigned char*>((*src)[0].base);
  for (int l = 0; l < layout.layers; ++l) {
    for (int64_t b : src_blocks) std::memset(src_base + l * layer_bytes + b * page, 0x10 + l, page);
    if (auto st = (*prefill)->SaveLayer("req-1", l, src_blocks); !st.ok()) {
      return Fail("save layer", st);
    }
  }
  if (auto r = (*prefill)->RequestFinished("req-1"); !r.ok()) {
    return Fail("request finished", r.status());
  }
  const auto* dst_base = static_cast<const unsigned char*>((*dst)[0].base);
  for (int l = 0; l < layout.layers; ++l) {
    if (auto st = (*decode)->WaitLayer("req-1", l); !st.ok()) return Fail("wait layer", st);
    for (int64_t b : dst_blocks) {
      for (int64_t i = 0; i < page; ++i) {
        if (dst_base[l * layer_bytes + b * page + i] != 0x10 + l) {
          std::fprintf(stderr, "engine: layer %d block %ld byte %ld differs\n", l,
                       static_cast<long>(b), static_cast<long>(i));
          return 1;
        }
      }
    }
  }
  std::printf("engine: request req-1 moved, %d layers verified\n", static_cast<int>(layout.layers));
  return 0;
}
