// GPU engines through kvd end to end: two kvd processes (prefill on device 0, decode on device 1)
// and engines in this process that register cudaMalloc'ed caches over the kvds' unix sockets.
// Over cuda_ipc and nccl: a push gated behind the engine's stream (kvd must wait on the layer
// events), LBNHC → BLHNC with TP 1 → 2; a SIGKILLed prefill kvd; memory kvd must refuse. Over
// cuda_ipc also with every cache a CUDA VMM allocation (cuMemCreate), shared by its POSIX fd.
//
// Bytes are checked by copying every cache back to the host and comparing with the transfer's
// definition (layout/kv_region.h offsets), untouched bytes included. Every wait is bounded.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "connector/connector.h"
#include "protocol/kvd.pb.h"
#include "tools/testing/kvd_process.h"
#include "transport/transport.h"

namespace kv {
namespace {

using namespace std::chrono_literals;
using connector::Connector;

using connector::TransferParams;
using Clock = std::chrono::steady_clock;

constexpr int kLayers = 4;
constexpr int kHeads = 4;  // global KV heads
constexpr int64_t kBlockSize = 16;
constexpr int64_t kTokens = 40;  // three blocks, the last one partial
constexpr uint8_t kUntouched = 0xEE;
const std::vector<int64_t> kSrcBlocks = {5, 2, 9};
const std::vector<std::vector<int64_t>> kDstBlocks = {{1, 7, 3}, {4, 0, 11}};  // per decode rank

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

LayoutSpec PrefillSpec() {
  LayoutSpec s;
  s.order = "LBNHC";
  s.layers = kLayers;
  s.blocks = 16;
  s.heads = kHeads;
  s.block_size = kBlockSize;
  s.content_bytes = 256;  // K and V of head_dim 64, bf16
  return s;
}

LayoutSpec DecodeSpec(int rank) {
  LayoutSpec s = PrefillSpec();
  s.order = "BLHNC";
  s.heads = kHeads / 2;
  s.tp_rank = rank;
  s.tp_size = 2;
  s.total_heads = kHeads;
  return s;
}

uint8_t PatternA(uint64_t i) {
  return static_cast<uint8_t>(i * 31 + 7);
}
uint8_t PatternB(uint64_t i) {
  return static_cast<uint8_t>(i * 17 + 3);
}

// How a test engine allocates its cache: cudaMalloc, or the VMM API as PyTorch's expandable
// segments and some engines' allocators do (cuMemCreate, cuMemAddressReserve, cuMemMap), with or
// without the POSIX fd handle type kvd needs to open it.
enum class Alloc { kCudaMalloc, kVmm, kVmmWithoutFd };

// A driver entry point, resolved through the runtime: linking libcuda would keep this test from
// loading (and skipping) where no driver is installed.
template <typename Fn>
Fn DriverFn(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}
#define KV_DRIVER(fn) DriverFn<decltype(&::fn)>(#fn)

// Device memory of one device, freed on destruction.
class DeviceMemory {
 public:
  DeviceMemory(int device, uint64_t bytes, Alloc alloc = Alloc::kCudaMalloc)
      : device_(device), bytes_(bytes) {
    cudaSetDevice(device);
    if (alloc == Alloc::kCudaMalloc) {
      if (cudaMalloc(&ptr_, bytes) != cudaSuccess) ptr_ = nullptr;
    } else {
      vmm_ = true;
      MapVmm(alloc == Alloc::kVmm);
    }
  }
  ~DeviceMemory() {
    cudaSetDevice(device_);
    if (vmm_ && ptr_ != nullptr) KV_DRIVER(cuMemUnmap)(va_, mapped_);
    if (va_ != 0) KV_DRIVER(cuMemAddressFree)(va_, mapped_);
    if (vmm_handle_ != 0) KV_DRIVER(cuMemRelease)(vmm_handle_);
    if (!vmm_ && ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  void* get() const { return ptr_; }
  uint64_t bytes() const { return bytes_; }
  bool Upload(const std::vector<uint8_t>& host) const {
    cudaSetDevice(device_);
    return host.size() == bytes_ &&
           cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> host(bytes_);
    cudaSetDevice(device_);
    if (cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost) != cudaSuccess) host.clear();
    return host;
  }

 private:
  // Sets ptr_ once every step succeeded; the destructor undoes the steps that did.
  void MapVmm(bool shareable) {
    cudaFree(nullptr);  // the driver calls below need the device's primary context current
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    prop.requestedHandleTypes =
        shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    size_t granularity = 0;
    if (KV_DRIVER(cuMemGetAllocationGranularity)(
            &granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS) {
      return;
    }
    mapped_ = (bytes_ + granularity - 1) / granularity * granularity;
    if (KV_DRIVER(cuMemCreate)(&vmm_handle_, mapped_, &prop, 0) != CUDA_SUCCESS) {
      vmm_handle_ = 0;
      return;
    }
    if (KV_DRIVER(cuMemAddressReserve)(&va_, mapped_, 0, 0, 0) != CUDA_SUCCESS) {
      va_ = 0;
      return;
    }
    if (KV_DRIVER(cuMemMap)(va_, mapped_, 0, vmm_handle_, 0) != CUDA_SUCCESS) return;
    ptr_ = reinterpret_cast<void*>(va_);  // mapped: unmapped on destruction from here on
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (KV_DRIVER(cuMemSetAccess)(va_, mapped_, &access, 1) != CUDA_SUCCESS) {
      KV_DRIVER(cuMemUnmap)(va_, mapped_);
      ptr_ = nullptr;
    }
  }

  int device_;
  uint64_t bytes_;
  void* ptr_ = nullptr;
  bool vmm_ = false;
  CUmemGenericAllocationHandle vmm_handle_ = 0;
  CUdeviceptr va_ = 0;   // the reserved range
  uint64_t mapped_ = 0;  // bytes_ rounded up to the granularity
};

// Whether cudaIpcGetMemHandle refuses `ptr`: VMM memory is only shareable through its handle.
bool LegacyIpcRefuses(void* ptr) {
  cudaIpcMemHandle_t handle{};
  const bool refused = cudaIpcGetMemHandle(&handle, ptr) != cudaSuccess;
  cudaGetLastError();
  return refused;
}

std::vector<uint8_t> Filled(uint64_t bytes, uint8_t (*pattern)(uint64_t)) {
  std::vector<uint8_t> v(bytes);
  for (uint64_t i = 0; i < bytes; ++i) v[i] = pattern(i);
  return v;
}

// A stream's host callback that holds it until `flag` is set (at most 30 s): the engine's writes
// queued behind it, and the layer events recorded after them, stay pending until the test says.
void CUDART_CB Hold(void* flag) {
  const auto until = Clock::now() + 30s;
  while (!static_cast<std::atomic<bool>*>(flag)->load() && Clock::now() < until) {
    std::this_thread::sleep_for(1ms);
  }
}

// Decode rank r's cache as it must be after `src` (prefill bytes) moved kTokens tokens of
// kSrcBlocks into kDstBlocks[r], starting from kUntouched: every layer, the rank's heads.
std::vector<uint8_t> Expected(const KvRegion& src_layout, const std::vector<uint8_t>& src,
                              const KvRegion& dst_layout, int rank) {
  std::vector<uint8_t> out(dst_layout.span_bytes(), kUntouched);
  const int64_t content = src_layout.spec().content_bytes;
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int64_t t = 0; t < kTokens; ++t) {
      for (int64_t h = 0; h < dst_layout.size(Axis::kH); ++h) {
        const int64_t global = dst_layout.global_head(h);
        const uint64_t from = src_layout.offset(l, kSrcBlocks[t / kBlockSize],
                                                src_layout.local_head(global), t % kBlockSize);
        const uint64_t to =
            dst_layout.offset(l, kDstBlocks[rank][t / kBlockSize], h, t % kBlockSize);
        std::copy_n(src.begin() + from, content, out.begin() + to);
      }
    }
  }
  return out;
}

int64_t Mismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  if (got.size() != want.size()) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < got.size(); ++i) n += got[i] != want[i];
  return n;
}

class KvdGpuTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (DeviceCount() < 2) GTEST_SKIP() << "needs two CUDA devices";
    dir_ = std::filesystem::temp_directory_path() /
           ("kvd-gpu-" + std::to_string(getpid()) + "-" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
            std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    decode_.clear();
    prefill_.reset();
    for (auto& k : kvds_) k.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // heartbeat_ms: 5 missed declare a peer dead; short, so a killed kvd is noticed quickly.
  std::unique_ptr<kv::harness::KvdProcess> StartKvd(const std::string& name, int device,
                                                    const std::string& transport,
                                                    const std::string& heartbeat_ms = "200") {
    kv::harness::KvdProcess::Options o;
    o.binary = kv::harness::KvdBesideSelf();
    o.name = name;
    o.socket_path = (dir_ / (name + ".sock")).string();
    o.transport = transport;
    o.extra_args = {"--device", std::to_string(device), "--log-level", "warn", "--lease-ms",
                    "15000",    "--heartbeat-ms",       heartbeat_ms};
    if (auto info = kv::transport::DescribeTransport(transport);
        info.ok() && info->takes("socket_dir")) {
      // Its side-channel sockets in the test's directory: a killed kvd cannot unlink them.
      o.extra_args.insert(o.extra_args.end(), {"--transport-opt", "socket_dir=" + dir_.string()});
    }
    auto p = kv::harness::KvdProcess::Start(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(*p) : nullptr;
  }

  static std::unique_ptr<Connector> OpenEngine(const kv::harness::KvdProcess& kvd,
                                               const std::string& instance, int rank, int size) {
    connector::ConnectorOptions o;
    o.instance = instance;
    o.tp_rank = rank;
    o.tp_size = size;
    o.timeout = 20s;
    auto c = Connector::Open(kvd.socket_path(), o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // The prefill engine (device 0) on `kvd`, its cache filled with PatternA.
  void OpenPrefill(const kv::harness::KvdProcess& kvd) {
    prefill_.reset();
    prefill_ = OpenEngine(kvd, "prefill", 0, 1);
    ASSERT_NE(nullptr, prefill_);
    if (!src_) {
      src_layout_ = *KvRegion::Create(PrefillSpec());
      src_ = std::make_unique<DeviceMemory>(0, src_layout_.span_bytes(), alloc_);
      ASSERT_NE(nullptr, src_->get());
    }
    ASSERT_TRUE(src_->Upload(Filled(src_->bytes(), PatternA)));
    connector::KvCacheDesc cache = connector::GpuCache(src_->get(), 0, PrefillSpec());
    auto caches = prefill_->RegisterKvCaches({&cache, 1});
    ASSERT_TRUE(caches.ok()) << caches.status().ToString();
    EXPECT_EQ(src_->get(), caches->front().base);
  }

  // Two decode ranks (device 1) on `kvd`, their caches kUntouched.
  void OpenDecode(const kv::harness::KvdProcess& kvd) {
    for (int r = 0; r < 2; ++r) {
      dst_layouts_.push_back(*KvRegion::Create(DecodeSpec(r)));
      dst_.push_back(std::make_unique<DeviceMemory>(1, dst_layouts_[r].span_bytes(), alloc_));
      ASSERT_NE(nullptr, dst_[r]->get());
      decode_.push_back(OpenEngine(kvd, "decode", r, 2));
      ASSERT_NE(nullptr, decode_[r]);
      connector::KvCacheDesc cache = connector::GpuCache(dst_[r]->get(), 1, DecodeSpec(r));
      auto caches = decode_[r]->RegisterKvCaches({&cache, 1});
      ASSERT_TRUE(caches.ok()) << caches.status().ToString();
    }
    ResetDecode();
  }

  void ResetDecode() {
    for (auto& d : dst_) ASSERT_TRUE(d->Upload(std::vector<uint8_t>(d->bytes(), kUntouched)));
  }

  void StartLoads(const std::string& request, const kv::harness::KvdProcess& source) {
    TransferParams params;
    params.peer_address = source.listen_address();
    params.tokens = kTokens;
    for (int r = 0; r < 2; ++r) {
      Status s = decode_[r]->StartLoad(request, params, kDstBlocks[r]);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }

  // Every layer on both decode ranks, then the bytes of both ranks against `src`.
  void ExpectLoaded(const std::string& request, const std::vector<uint8_t>& src) {
    for (int r = 0; r < 2; ++r) {
      for (int l = 0; l < kLayers; ++l) {
        Status s = decode_[r]->WaitLayer(request, l);
        ASSERT_TRUE(s.ok()) << "rank " << r << " layer " << l << ": " << s.ToString();
      }
      EXPECT_EQ(0, Mismatches(dst_[r]->Download(), Expected(src_layout_, src, dst_layouts_[r], r)))
          << "decode rank " << r;
    }
  }

  static inline int counter_ = 0;
  Alloc alloc_ = Alloc::kCudaMalloc;  // how OpenPrefill and OpenDecode allocate their caches
  std::filesystem::path dir_;
  std::unique_ptr<kv::harness::KvdProcess> kvds_[3];
  std::unique_ptr<Connector> prefill_;
  std::vector<std::unique_ptr<Connector>> decode_;
  KvRegion src_layout_ = *KvRegion::Create(PrefillSpec());
  std::unique_ptr<DeviceMemory> src_;
  std::vector<KvRegion> dst_layouts_;
  std::vector<std::unique_ptr<DeviceMemory>> dst_;
};

// The engine's stream is held before it writes PatternB over every layer and saves them: kvd
// posts each layer at once (it knows the destination) but its copies must wait for the layer
// events, so the decode caches stay untouched until the release and then hold PatternB, never
// the PatternA that was in the cache while the stream was held.
//
// The transports' bounded copy staging can hold kvd's io thread in the post of a later batch until
// earlier gated copies ran (with every layer gated here, the fifth batch): the prefill kvd then
// sends no heartbeat until the release, so these kvds allow 5 s of silence, more than the hold.
TEST_P(KvdGpuTest, PushWaitsForTheEnginesLayerEventsAndConvertsLayoutAndTp) {
  kvds_[0] = StartKvd("prefill", 0, GetParam(), "1000");
  kvds_[1] = StartKvd("decode", 1, GetParam(), "1000");
  ASSERT_TRUE(kvds_[0] && kvds_[1]);
  ASSERT_NO_FATAL_FAILURE(OpenPrefill(*kvds_[0]));
  ASSERT_NO_FATAL_FAILURE(OpenDecode(*kvds_[1]));
  ASSERT_NO_FATAL_FAILURE(StartLoads("gated", *kvds_[0]));

  const std::vector<uint8_t> pattern_b = Filled(src_->bytes(), PatternB);
  DeviceMemory staged(0, src_->bytes());
  ASSERT_TRUE(staged.Upload(pattern_b));
  cudaSetDevice(0);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaSuccess, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::atomic<bool> released{false};
  // The release comes from its own thread: a transport may hold kvd's post of a later batch
  // until earlier gated copies ran (bounded staging), and so this thread's SaveLayer with it.
  // Before releasing, it checks that nothing reached the decode GPU while the stream was held
  // (kvd posts each layer within milliseconds of its save, or of the destination's want).
  std::vector<int64_t> early(2, -1);
  ASSERT_EQ(cudaSuccess, cudaLaunchHostFunc(stream, &Hold, &released));
  std::thread releaser([&] {
    std::this_thread::sleep_for(1500ms);
    for (int r = 0; r < 2; ++r) {
      early[r] =
          Mismatches(dst_[r]->Download(), std::vector<uint8_t>(dst_[r]->bytes(), kUntouched));
    }
    released = true;
  });
  const uint64_t layer_bytes = static_cast<uint64_t>(src_layout_.stride(Axis::kL));
  std::vector<Status> saved;
  for (int l = 0; l < kLayers; ++l) {
    const uint64_t at = l * layer_bytes;
    EXPECT_EQ(cudaSuccess, cudaMemcpyAsync(static_cast<char*>(src_->get()) + at,
                                           static_cast<char*>(staged.get()) + at, layer_bytes,
                                           cudaMemcpyDeviceToDevice, stream));
    saved.push_back(prefill_->SaveLayer("gated", l, kSrcBlocks, stream));
  }
  releaser.join();
  for (const Status& s : saved) EXPECT_TRUE(s.ok()) << s.ToString();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(0, early[r]) << "decode rank " << r << " changed before the engine's events fired";
  }
  ASSERT_EQ(cudaSuccess, cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("gated", pattern_b));

  // Both sides hear the request finished: the decode ranks received it, the prefill rank's
  // blocks are released once it finished the request.
  auto params = prefill_->RequestFinished("gated");
  ASSERT_TRUE(params.ok()) << params.status().ToString();
  bool sent = false, received = false;
  for (auto deadline = Clock::now() + 10s; Clock::now() < deadline && !(sent && received);) {
    for (const auto& id : prefill_->GetFinished().sent) sent = sent || id == "gated";
    for (const auto& id : decode_[0]->GetFinished().received) received = received || id == "gated";
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_TRUE(sent);
  EXPECT_TRUE(received);
}

// A prefill kvd SIGKILLed mid-request: the decode load fails within its deadline (from kvd, not
// the connector's timeout), its blocks are reported, and the decode kvd serves the next request
// from a new prefill kvd.
TEST_P(KvdGpuTest, KilledPrefillKvdFailsTheLoadAndDecodeServesTheNext) {
  kvds_[0] = StartKvd("prefill", 0, GetParam());
  kvds_[1] = StartKvd("decode", 1, GetParam());
  ASSERT_TRUE(kvds_[0] && kvds_[1]);
  ASSERT_NO_FATAL_FAILURE(OpenPrefill(*kvds_[0]));
  ASSERT_NO_FATAL_FAILURE(OpenDecode(*kvds_[1]));
  ASSERT_NO_FATAL_FAILURE(StartLoads("doomed", *kvds_[0]));
  ASSERT_TRUE(prefill_->SaveLayer("doomed", 0, kSrcBlocks, nullptr).ok());
  kvds_[0]->Kill();

  const auto start = Clock::now();
  Status s = decode_[0]->WaitLayer("doomed", kLayers - 1);
  const auto waited = Clock::now() - start;
  EXPECT_FALSE(s.ok());
  EXPECT_NE(Code::kTimeout, s.code()) << s.ToString();  // kvd reported it, not the connector
  EXPECT_LT(waited, 15s);
  std::vector<int64_t> failed;
  for (auto deadline = Clock::now() + 10s; Clock::now() < deadline && failed.empty();) {
    failed = decode_[0]->GetFailedBlocks();
    if (failed.empty()) std::this_thread::sleep_for(5ms);
  }
  std::sort(failed.begin(), failed.end());
  std::vector<int64_t> mine = kDstBlocks[0];
  std::sort(mine.begin(), mine.end());
  EXPECT_EQ(mine, failed);

  kvds_[2] = StartKvd("prefill2", 0, GetParam());
  ASSERT_TRUE(kvds_[2]);
  ASSERT_NO_FATAL_FAILURE(OpenPrefill(*kvds_[2]));
  ASSERT_NO_FATAL_FAILURE(ResetDecode());
  ASSERT_NO_FATAL_FAILURE(StartLoads("next", *kvds_[2]));
  for (int l = 0; l < kLayers; ++l) ASSERT_TRUE(prefill_->SaveLayer("next", l, kSrcBlocks).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectLoaded("next", Filled(src_->bytes(), PatternA)));
}

INSTANTIATE_TEST_SUITE_P(Transports, KvdGpuTest, ::testing::Values("ipc", "nccl"),
                         [](const auto& info) { return info.param; });

// Every cache a VMM allocation: kvd opens the engines' caches through their fds, and the prefill
// kvd opens the decode engines' caches through the decode kvd's fd server (cuda_ipc). A push of
// every layer lands every byte, untouched ones included, and a second request reuses the
// imported regions.
using KvdGpuVmmTest = KvdGpuTest;

TEST_P(KvdGpuVmmTest, PushBetweenVmmCachesLandsEveryByte) {
  alloc_ = Alloc::kVmm;
  kvds_[0] = StartKvd("prefill", 0, GetParam());
  kvds_[1] = StartKvd("decode", 1, GetParam());
  ASSERT_TRUE(kvds_[0] && kvds_[1]);
  ASSERT_NO_FATAL_FAILURE(OpenPrefill(*kvds_[0]));
  ASSERT_NO_FATAL_FAILURE(OpenDecode(*kvds_[1]));
  ASSERT_TRUE(LegacyIpcRefuses(src_->get())) << "the cache is not VMM memory";
  ASSERT_TRUE(LegacyIpcRefuses(dst_[0]->get())) << "the cache is not VMM memory";
  for (const std::string request : {"vmm-1", "vmm-2"}) {
    ASSERT_NO_FATAL_FAILURE(ResetDecode());
    ASSERT_NO_FATAL_FAILURE(StartLoads(request, *kvds_[0]));
    for (int l = 0; l < kLayers; ++l) {
      Status s = prefill_->SaveLayer(request, l, kSrcBlocks);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
    ASSERT_NO_FATAL_FAILURE(ExpectLoaded(request, Filled(src_->bytes(), PatternA)));
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, KvdGpuVmmTest, ::testing::Values("ipc"),
                         [](const auto& info) { return info.param; });

// A VMM cache created without the POSIX fd handle type cannot be opened by kvd: refused before kvd
// hears of it, with a message naming what the engine must request. A shareable one registers.
TEST(KvdGpuRegistration, RefusesVmmMemoryWithoutTheFdHandleType) {
  if (DeviceCount() < 1) GTEST_SKIP() << "needs a CUDA device";
  const auto dir =
      std::filesystem::temp_directory_path() / ("kvd-gpu-vmm-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  kv::harness::KvdProcess::Options o;
  o.binary = kv::harness::KvdBesideSelf();
  o.name = "vmm";
  o.socket_path = (dir / "vmm.sock").string();
  o.transport = "ipc";
  // The side channel's sockets in the test's directory too: kvd is SIGKILLed at the end.
  o.extra_args = {"--log-level", "warn", "--transport-opt", "socket_dir=" + dir.string()};
  auto kvd = kv::harness::KvdProcess::Start(o);
  ASSERT_TRUE(kvd.ok()) << kvd.status().ToString();
  connector::ConnectorOptions options;
  options.timeout = 20s;
  const LayoutSpec spec = PrefillSpec();
  const uint64_t span = KvRegion::Create(spec)->span_bytes();
  DeviceMemory private_vmm(0, span, Alloc::kVmmWithoutFd);
  DeviceMemory shareable(0, span, Alloc::kVmm);
  ASSERT_TRUE(private_vmm.get() && shareable.get());
  ASSERT_TRUE(LegacyIpcRefuses(private_vmm.get()));
  auto c = Connector::Open((*kvd)->socket_path(), options);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  connector::KvCacheDesc refused = connector::GpuCache(private_vmm.get(), 0, spec);
  auto r = (*c)->RegisterKvCaches({&refused, 1});
  EXPECT_EQ(Code::kUnsupported, r.status().code()) << r.status().ToString();
  EXPECT_NE(std::string::npos,
            r.status().message().find("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"))
      << r.status().ToString();
  auto status = connector::DaemonStatusOf(**c);
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(0u, status->regions());

  connector::KvCacheDesc good = connector::GpuCache(shareable.get(), 0, spec);
  r = (*c)->RegisterKvCaches({&good, 1});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  status = connector::DaemonStatusOf(**c);
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(1u, status->regions());
  EXPECT_EQ(span, status->region_bytes());
  c->reset();
  std::filesystem::remove_all(dir);
}

// One GPU: memory kvd cannot share is refused with a message, and a good cache still registers.
TEST(KvdGpuRegistration, RefusesMemoryItCannotShare) {
  if (DeviceCount() < 1) GTEST_SKIP() << "needs a CUDA device";
  const auto dir =
      std::filesystem::temp_directory_path() / ("kvd-gpu-reg-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto start = [&](const std::string& name, const std::string& transport) {
    kv::harness::KvdProcess::Options o;
    o.binary = kv::harness::KvdBesideSelf();
    o.name = name;
    o.socket_path = (dir / (name + ".sock")).string();
    o.transport = transport;
    o.extra_args = {"--log-level", "warn"};
    if (transport == "ipc") {  // its side channel's sockets in here: kvd is SIGKILLed at the end
      o.extra_args.insert(o.extra_args.end(), {"--transport-opt", "socket_dir=" + dir.string()});
    }
    return kv::harness::KvdProcess::Start(o);
  };
  auto ipc = start("ipc", "ipc");
  auto local = start("local", "local");
  ASSERT_TRUE(ipc.ok() && local.ok());
  connector::ConnectorOptions options;
  options.timeout = 20s;
  const LayoutSpec spec = PrefillSpec();
  const uint64_t span = KvRegion::Create(spec)->span_bytes();
  DeviceMemory memory(0, span);
  DeviceMemory small(0, span / 2);
  ASSERT_TRUE(memory.get() && small.get());
  std::vector<uint8_t> host(span);
  {
    auto c = Connector::Open((*local)->socket_path(), options);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    connector::KvCacheDesc cache = connector::GpuCache(memory.get(), 0, spec);
    auto r = (*c)->RegisterKvCaches({&cache, 1});
    EXPECT_EQ(Code::kUnsupported, r.status().code()) << r.status().ToString();
    EXPECT_NE(std::string::npos, r.status().message().find("cannot reach GPU memory"))
        << r.status().ToString();
  }
  auto c = Connector::Open((*ipc)->socket_path(), options);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  connector::KvCacheDesc on_host = connector::GpuCache(host.data(), 0, spec);
  auto r = (*c)->RegisterKvCaches({&on_host, 1});
  EXPECT_EQ(Code::kInvalidArgument, r.status().code()) << r.status().ToString();
  EXPECT_NE(std::string::npos, r.status().message().find("host memory")) << r.status().ToString();
  connector::KvCacheDesc too_small = connector::GpuCache(small.get(), 0, spec);
  r = (*c)->RegisterKvCaches({&too_small, 1});
  EXPECT_EQ(Code::kInvalidArgument, r.status().code()) << r.status().ToString();
  EXPECT_NE(std::string::npos, r.status().message().find("past the allocation"))
      << r.status().ToString();
  connector::KvCacheDesc wrong_device = connector::GpuCache(memory.get(), 1, spec);
  r = (*c)->RegisterKvCaches({&wrong_device, 1});
  EXPECT_EQ(Code::kInvalidArgument, r.status().code()) << r.status().ToString();

  connector::KvCacheDesc good = connector::GpuCache(memory.get(), 0, spec);
  r = (*c)->RegisterKvCaches({&good, 1});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(memory.get(), r->front().base);
  EXPECT_EQ(Code::kOutOfRange, (*c)->SaveLayer("r", kLayers, kSrcBlocks).code());
  auto status = connector::DaemonStatusOf(**c);
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(1u, status->regions());
  EXPECT_EQ(span, status->region_bytes());
  c->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kv
