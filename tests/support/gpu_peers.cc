#include "tests/support/gpu_peers.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "base/codec.h"
#include "daemon/event_gate.h"
#include "gpu/cuda_util.h"
#include "tests/support/held_stream.h"
#include "transport/transport.h"

namespace kv::transport::gputest {
namespace {

using namespace std::chrono_literals;

enum Verb : uint32_t { kTransfer = 1, kWaitNote, kDump, kExit, kNoteSnapshot };

constexpr auto kBound = 60s;
// How long a gated post may take with its event pending; it should return in microseconds.
constexpr auto kPostBound = 10s;
// The deadline of a batch whose event is never released (PostExpiring).
constexpr auto kExpiry = 300ms;

// An event recorded behind a host function that holds its stream until Release() (at most 60 s):
// an engine's layer event whose layer is not done yet, or, never released, one whose engine died
// mid-layer. Destroyed only once its stream is done.
// An event recorded behind a stream held until Release(): by a host function (the default), or
// on the device by a kernel waiting for a mapped flag (`on_device`), for a mover whose own
// completions run as CUDA host functions, which the held one would block as well.
class HeldEvent {
 public:
  HeldEvent() = default;
  HeldEvent(const HeldEvent&) = delete;
  HeldEvent& operator=(const HeldEvent&) = delete;
  ~HeldEvent() {
    Release();
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (flag_ != nullptr) cudaFreeHost(flag_);
  }
  Status Create(bool on_device = false) {
    if (cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&event_, cudaEventDisableTiming) != cudaSuccess) {
      return Status::Internal("cannot create the held event");
    }
    if (on_device) {
      void* device_flag = nullptr;
      if (cudaHostAlloc(reinterpret_cast<void**>(&flag_), sizeof(int), cudaHostAllocMapped) !=
              cudaSuccess ||
          cudaHostGetDevicePointer(&device_flag, flag_, 0) != cudaSuccess ||
          LaunchHold(static_cast<const volatile int*>(device_flag), stream_) != cudaSuccess) {
        return Status::Internal("cannot hold the event's stream on the device");
      }
    } else {
      cudaLaunchHostFunc(
          stream_,
          [](void* flag) {
            const auto until = Clock::now() + 60s;
            while (!static_cast<std::atomic<bool>*>(flag)->load() && Clock::now() < until) {
              std::this_thread::sleep_for(1ms);
            }
          },
          &released_);
    }
    return cudaEventRecord(event_, stream_) == cudaSuccess
               ? Status::Ok()
               : Status::Internal("cannot record the held event");
  }
  cudaEvent_t get() const { return event_; }
  void Release() {
    released_ = true;
    if (flag_ != nullptr) __atomic_store_n(flag_, 1, __ATOMIC_RELEASE);
  }

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  std::atomic<bool> released_{false};
  int* flag_ = nullptr;  // on_device: mapped pinned memory the hold kernel reads
};

std::string EncodeStatus(const Status& s) {
  return ByteWriter().u32(static_cast<uint32_t>(s.code())).bytes(s.message()).take();
}

Status DecodeStatus(std::string_view blob) {
  ByteReader r(blob);
  uint32_t code = 0;
  std::string_view message;
  if (!r.u32(&code) || !r.bytes(&message)) return Status::Internal("bad status from child");
  if (code == 0) return Status::Ok();
  return Status(static_cast<Code>(code), std::string(message));
}

std::string EncodeRuns(const std::vector<Run>& runs) {
  ByteWriter w;
  w.u64(runs.size());
  for (const Run& r : runs) w.u64(r.src_offset).u64(r.dst_offset).u64(r.length);
  return w.take();
}

std::vector<Run> DecodeRuns(std::string_view blob) {
  ByteReader r(blob);
  uint64_t n = 0;
  std::vector<Run> runs;
  if (!r.u64(&n)) return runs;
  runs.resize(n);
  for (Run& run : runs) {
    if (!r.u64(&run.src_offset) || !r.u64(&run.dst_offset) || !r.u64(&run.length)) return {};
  }
  return runs;
}

// The child's side: owns CUDA, the transport and the buffer.
class PeerBody {
 public:
  PeerBody(Channel& channel, const SideSpec& spec, const Settings& settings)
      : channel_(channel), spec_(spec), settings_(settings) {}

  int Run() {
    if (cudaSetDevice(spec_.device) != cudaSuccess) return 2;
    if (cudaMalloc(&buffer_, spec_.bytes) != cudaSuccess) return 3;
    std::vector<uint8_t> host(spec_.bytes);
    for (uint64_t i = 0; i < host.size(); ++i) host[i] = PatternByte(i, spec_.seed);
    if (cudaMemcpy(buffer_, host.data(), host.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
      return 3;
    }
    TransportOptions options;
    options.settings = {{"device", std::to_string(spec_.device)},
                        {"staging_bytes", "65536"},  // many chunks: exercises slot reuse
                        {"timeout_ms", "20000"}};
    options.settings.insert(options.settings.begin(), settings_.begin(), settings_.end());
    auto transport = CreateTransport(spec_.backend, options);
    if (!transport.ok()) {
      (void)channel_.Send(EncodeStatus(transport.status()));
      return 4;
    }
    transport_ = std::move(transport).value();
    gate_ = std::make_unique<daemon::EventGate>(transport_.get());
    transport_->set_notification_handler([this](std::string_view note) {
      // Test-only: a handler must not block, but a copy of a test buffer is short.
      std::string snapshot;
      if (note.starts_with(kSnapshotPrefix)) {
        snapshot.resize(spec_.bytes);
        cudaSetDevice(spec_.device);
        cudaMemcpy(snapshot.data(), buffer_, snapshot.size(), cudaMemcpyDeviceToHost);
      }
      std::lock_guard lock(mu_);
      notes_.emplace_back(note);
      snapshots_[std::string(note)] = std::move(snapshot);
    });
    auto registration =
        transport_->register_memory(buffer_, spec_.bytes, MemoryLocation::Cuda(spec_.device));
    if (!registration.ok()) {
      (void)channel_.Send(EncodeStatus(registration.status()));
      return 5;
    }
    registration_ = std::move(registration).value();
    ByteWriter hello;
    hello.u32(0).bytes(transport_->address()).bytes(registration_->packed_descriptor());
    if (!channel_.Send(hello.take()).ok()) return 6;
    return Serve();
  }

 private:
  int Serve() {
    while (true) {
      auto command = channel_.Receive(Clock::now() + 300s);
      if (!command.ok()) return 7;
      ByteReader r(*command);
      uint32_t verb = 0;
      if (!r.u32(&verb)) return 8;
      switch (verb) {
        case kTransfer:
          (void)channel_.Send(EncodeStatus(DoTransfer(r)));
          break;
        case kWaitNote: {
          std::string_view text;
          r.bytes(&text);
          (void)channel_.Send(EncodeStatus(AwaitNote(std::string(text))));
          break;
        }
        case kNoteSnapshot: {
          std::string_view text;
          r.bytes(&text);
          Status noted = AwaitNote(std::string(text));
          std::lock_guard lock(mu_);
          (void)channel_.Send(noted.ok() ? snapshots_[std::string(text)] : std::string());
          break;
        }
        case kDump: {
          std::string bytes(spec_.bytes, '\0');
          cudaDeviceSynchronize();
          cudaMemcpy(bytes.data(), buffer_, bytes.size(), cudaMemcpyDeviceToHost);
          (void)channel_.Send(bytes);
          break;
        }
        case kExit:
          gate_.reset();
          registration_.reset();
          transport_.reset();
          cudaFree(buffer_);
          return 0;
        default:
          return 8;
      }
    }
  }

  Status DoTransfer(ByteReader& r) {
    uint32_t op = 0, wait_for_dead = 0, gated = 0, note_while_gated = 0, expired = 0,
             disconnect = 0, never_fires = 0, as_groups = 0;
    std::string_view address, descriptor, runs_blob, note;
    if (!r.u32(&op) || !r.u32(&wait_for_dead) || !r.u32(&gated) || !r.u32(&note_while_gated) ||
        !r.u32(&expired) || !r.u32(&disconnect) || !r.u32(&never_fires) || !r.u32(&as_groups) ||
        !r.bytes(&address) || !r.bytes(&descriptor) || !r.bytes(&runs_blob) || !r.bytes(&note)) {
      return Status::Internal("bad transfer command");
    }
    auto known = peers_.find(std::string(address));
    if (known == peers_.end()) {
      KV_ASSIGN_OR_RETURN(PeerId id, transport_->connect(address));
      known = peers_.emplace(std::string(address), id).first;
    }
    const PeerId peer = known->second;
    if (wait_for_dead) {
      const auto until = Clock::now() + 20s;
      while (transport_->notify(peer, "ping").ok()) {
        if (Clock::now() > until) return Status::Internal("peer never seen dead");
        std::this_thread::sleep_for(10ms);
      }
    }
    KV_ASSIGN_OR_RETURN(auto remote, transport_->import_remote(peer, descriptor));
    std::vector<kv::Run> runs = DecodeRuns(runs_blob);
    std::vector<RunGroup> groups;
    std::vector<GroupBlocks> blocks;
    if (as_groups && transport_->takes_run_groups()) GroupRuns(runs, &groups);
    if (as_groups == 2 && transport_->takes_group_blocks()) {
      JoinGroups(groups, &blocks);
      groups.clear();
    }
    Batch batch{static_cast<Op>(op), registration_.get(), remote.get(), runs,
                expired ? Clock::now() - 1s : Clock::now() + 20s};
    if (!groups.empty() || !blocks.empty()) {
      batch.runs = {};
      batch.groups = groups;
      batch.blocks = blocks;
    }
    remotes_.push_back(std::move(remote));  // batches may still name it until the peer is done
    std::vector<std::future<Status>> futures;
    auto post = [&]() -> Status {
      auto promise = std::make_shared<std::promise<Status>>();
      futures.push_back(promise->get_future());
      Completion done = [promise](Status s) { promise->set_value(s); };
      Status posted = transport_->post(batch, std::move(done));
      if (!posted.ok()) futures.pop_back();
      return posted;
    };
    if (never_fires) {
      Batch held = batch;
      held.deadline = Clock::now() + kExpiry;
      const std::vector<kv::Run> half(runs.begin(), runs.begin() + (runs.size() + 1) / 2);
      Batch alongside = batch;
      alongside.runs = half;
      KV_RETURN_IF_ERROR(PostExpiring(held, alongside));
    } else if (gated > 0) {
      const std::string held_note = note_while_gated ? std::string(note) : std::string();
      if (disconnect) peers_.erase(std::string(address));  // the next transfer reconnects
      KV_RETURN_IF_ERROR(
          PostGated(batch, static_cast<int>(gated), peer, held_note, disconnect != 0, futures));
      if (note_while_gated) note = {};
    } else {
      KV_RETURN_IF_ERROR(post());
    }
    Status first_error;
    for (auto& future : futures) {
      if (future.wait_for(kBound) != std::future_status::ready) {
        return Status::Internal("no completion within the bound");
      }
      Status s = future.get();
      if (first_error.ok()) first_error = s;
    }
    KV_RETURN_IF_ERROR(first_error);
    if (!note.empty()) KV_RETURN_IF_ERROR(transport_->notify(peer, std::string(note)));
    return Status::Ok();
  }

  // Posts `count` batches through kvd's event gate (daemon/event_gate.h) with an event recorded
  // behind a host callback that holds its stream until released, then `note` (through the gate)
  // when not empty: no batch may complete while the event has not fired, and the gate's Post()
  // and Notify() themselves must return while
  // it is pending (an engine records the layer's event long before the layer is done; a post
  // that waited for it would stall kvd's io thread, and deadlock an engine whose GPU work waits
  // for the host). So the posts run on a thread of their own, each bounded by kPromptPost, and
  // the gate is released only after they returned, or after kPostBound. `futures` gets one
  // completion per accepted batch.
  Status PostGated(const Batch& batch, int count, PeerId peer, const std::string& note,
                   bool disconnect, std::vector<std::future<Status>>& futures) {
    HeldEvent held;
    KV_RETURN_IF_ERROR(held.Create());
    cudaEvent_t gate = held.get();
    std::vector<std::shared_ptr<std::promise<Status>>> promises;
    const size_t first = futures.size();
    for (int i = 0; i < count; ++i) {
      promises.push_back(std::make_shared<std::promise<Status>>());
      futures.push_back(promises.back()->get_future());
    }
    auto posting = std::async(std::launch::async, [&]() -> Status {
      for (int i = 0; i < count; ++i) {
        const auto start = Clock::now();
        Status posted = gate_->Post(
            batch, [gate] { return gpu::QueryEvent(gate); },
            [promise = promises[i]](Status s) { promise->set_value(s); });
        if (!posted.ok()) {
          futures.resize(first + i);
          return posted;
        }
        if (Clock::now() - start > kPromptPost) {
          futures.resize(first + i + 1);  // the later ones were never posted: none to wait for
          return Status::Internal("the gated post of batch " + std::to_string(i) +
                                  " waited while earlier batches were gated");
        }
      }
      const auto start = Clock::now();
      if (!note.empty()) KV_RETURN_IF_ERROR(gate_->Notify(peer, note));
      if (Clock::now() - start > kPromptPost) {
        return Status::Internal("notify waited while earlier batches were gated");
      }
      return Status::Ok();
    });
    Status verdict;
    if (posting.wait_for(kPostBound) != std::future_status::ready) {
      verdict = Status::Internal("the gated post blocked the caller until its event fired");
    } else if (Status posted = posting.get(); !posted.ok()) {
      verdict = posted;
    } else {
      if (disconnect) {
        std::this_thread::sleep_for(100ms);
        gate_->Disconnect(peer);
      }
      // Whatever the backend does, it cannot have moved the bytes yet: it had time to go wrong.
      std::this_thread::sleep_for(200ms);
      for (auto& future : futures) {
        const bool ready = future.wait_for(0ms) == std::future_status::ready;
        if (!disconnect && ready) {
          verdict = Status::Internal("a batch completed before its event fired, with: " +
                                     future.get().ToString());
          break;
        }
        // A backend that launches a batch only once its event fired has nothing of it running:
        // disconnected, the batch fails at once (a batch already on the device would fail only
        // once its copy stopped; none can be here).
        if (disconnect && (!ready || future.get().code() != Code::kAborted)) {
          verdict = Status::Internal("a batch held for its event did not fail at the disconnect");
          break;
        }
      }
    }
    held.Release();
    if (posting.valid()) (void)posting.get();  // returns once the gate opened
    // The batches name `batch`'s memory and the gate event until they complete (the gate polls
    // the event until it posts them), so neither goes before they do.
    for (auto& future : futures) {
      if (future.valid()) (void)future.wait_for(kBound);
    }
    // Disconnected, their outcomes were taken above (kAborted): none is left for the caller.
    if (!verdict.ok() || disconnect) futures.clear();
    return verdict;
  }

  // Posts `held_batch` through the event gate behind an event held for the whole call, with a
  // deadline kExpiry away, then `alongside` through post(): while the event is still held, the
  // second must land and the first fail with kTimeout (an engine that died mid-layer must hold
  // up no other batch, and its batch must not run later).
  Status PostExpiring(const Batch& held_batch, const Batch& alongside) {
    HeldEvent held;
    // staged ("ucx") learns of its gathers through CUDA host functions.
    KV_RETURN_IF_ERROR(held.Create(spec_.backend == "ucx"));
    auto expired = std::make_shared<std::promise<Status>>();
    auto landed = std::make_shared<std::promise<Status>>();
    auto expired_done = expired->get_future(), landed_done = landed->get_future();
    cudaEvent_t event = held.get();
    KV_RETURN_IF_ERROR(gate_->Post(
        held_batch, [event] { return gpu::QueryEvent(event); },
        [expired](Status s) { expired->set_value(s); }));
    Status verdict = transport_->post(alongside, [landed](Status s) { landed->set_value(s); });
    if (verdict.ok()) {
      if (landed_done.wait_for(10s) != std::future_status::ready) {
        verdict =
            Status::Internal("a batch posted beside one whose event never fires did not land");
      } else if (Status s = landed_done.get(); !s.ok()) {
        verdict = s.WithContext("the batch posted beside");
      }
    }
    if (expired_done.wait_for(10s) != std::future_status::ready) {
      if (verdict.ok()) verdict = Status::Internal("the batch whose event never fired lived on");
    } else if (Status s = expired_done.get(); s.code() != Code::kTimeout && verdict.ok()) {
      verdict =
          Status::Internal("the batch whose event never fired completed with " + s.ToString());
    }
    held.Release();
    // It names the event and the memory until it completes, so neither goes before it does.
    if (expired_done.valid()) (void)expired_done.wait_for(kBound);
    return verdict;
  }

  Status AwaitNote(const std::string& text) {
    const auto until = Clock::now() + kBound;
    while (Clock::now() < until) {
      {
        std::lock_guard lock(mu_);
        for (const std::string& n : notes_) {
          if (n == text) return Status::Ok();
        }
      }
      std::this_thread::sleep_for(1ms);
    }
    return Status::Timeout("notification '" + text + "' never arrived");
  }

  Channel& channel_;
  SideSpec spec_;
  Settings settings_;
  void* buffer_ = nullptr;
  std::unique_ptr<Transport> transport_;
  // Gated posts go through kvd's event gate, as kvd's do; declared after the transport, so
  // destroyed before it.
  std::unique_ptr<daemon::EventGate> gate_;
  std::unique_ptr<MemoryRegistration> registration_;
  std::map<std::string, PeerId> peers_;
  std::vector<std::unique_ptr<RemoteMemory>> remotes_;
  std::mutex mu_;
  std::vector<std::string> notes_;
  std::map<std::string, std::string> snapshots_;  // per note starting with kSnapshotPrefix
};

}  // namespace

uint8_t PatternByte(uint64_t i, int seed) {
  if (seed < 0) return kUntouched;
  return static_cast<uint8_t>((i * 2654435761u + static_cast<uint64_t>(seed) * 97) >> 5);
}

int DeviceCount() {
  static const int count = [] {
    auto child = ChildProcess::Start([](Channel& channel) {
      int n = 0;
      if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
      return channel.Send(std::to_string(n)).ok() ? 0 : 1;
    });
    if (!child.ok()) return 0;
    auto reply = (*child)->channel().Receive(Clock::now() + 60s);
    return reply.ok() ? std::stoi(*reply) : 0;
  }();
  return count;
}

Result<Peer> StartPeer(const SideSpec& spec, const Settings& settings) {
  // The peers are programs of their own here: NVLink multicast off before NCCL starts, as kvd's
  // main() does (no library sets it; nccl_transport.h), and the lanes' splitShare left alone.
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/1);
  ::unsetenv("NCCL_COMM_SPLIT_SHARE_RESOURCES");
  KV_ASSIGN_OR_RETURN(auto process, ChildProcess::Start([spec, settings](Channel& channel) {
                        return PeerBody(channel, spec, settings).Run();
                      }));
  auto received = process->channel().Receive(Clock::now() + kBound);
  if (!received.ok()) return received.status();
  const std::string& hello = *received;
  ByteReader r(hello);
  uint32_t code = 0;
  std::string_view address, descriptor;
  if (!r.u32(&code)) return Status::Internal("empty hello from child");
  if (code != 0) return DecodeStatus(hello).WithContext("child set-up");
  if (!r.bytes(&address) || !r.bytes(&descriptor)) return Status::Internal("bad hello");
  return Peer{std::move(process), std::string(address), std::string(descriptor)};
}

Status Transfer(Peer& mover, const Peer& target, Op op, const std::vector<Run>& runs,
                const TransferOptions& options) {
  const std::string& descriptor =
      options.forged_descriptor.empty() ? target.descriptor : options.forged_descriptor;
  std::string command = ByteWriter()
                            .u32(kTransfer)
                            .u32(static_cast<uint32_t>(op))
                            .u32(options.wait_for_dead ? 1 : 0)
                            .u32(options.gated ? static_cast<uint32_t>(options.gated_batches) : 0)
                            .u32(options.note_while_gated ? 1 : 0)
                            .u32(options.expired ? 1 : 0)
                            .u32(options.disconnect_while_gated ? 1 : 0)
                            .u32(options.never_fires ? 1 : 0)
                            .u32(options.as_groups ? (options.as_blocks ? 2 : 1) : 0)
                            .bytes(target.address)
                            .bytes(descriptor)
                            .bytes(EncodeRuns(runs))
                            .bytes(options.note)
                            .take();
  KV_RETURN_IF_ERROR(mover.process->channel().Send(command));
  KV_ASSIGN_OR_RETURN(std::string reply, mover.process->channel().Receive(Clock::now() + 90s));
  return DecodeStatus(reply);
}

Status WaitForNote(Peer& peer, const std::string& text) {
  KV_RETURN_IF_ERROR(peer.process->channel().Send(ByteWriter().u32(kWaitNote).bytes(text).take()));
  KV_ASSIGN_OR_RETURN(std::string reply, peer.process->channel().Receive(Clock::now() + 90s));
  return DecodeStatus(reply);
}

Result<std::vector<uint8_t>> SnapshotAtNote(Peer& peer, const std::string& text) {
  KV_RETURN_IF_ERROR(
      peer.process->channel().Send(ByteWriter().u32(kNoteSnapshot).bytes(text).take()));
  KV_ASSIGN_OR_RETURN(std::string bytes, peer.process->channel().Receive(Clock::now() + 90s));
  if (bytes.empty()) return Status::Timeout("notification '" + text + "' never arrived");
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

Result<std::vector<uint8_t>> Dump(Peer& peer) {
  KV_RETURN_IF_ERROR(peer.process->channel().Send(ByteWriter().u32(kDump).take()));
  KV_ASSIGN_OR_RETURN(std::string bytes, peer.process->channel().Receive(Clock::now() + kBound));
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

Status Stop(Peer& peer) {
  KV_RETURN_IF_ERROR(peer.process->channel().Send(ByteWriter().u32(kExit).take()));
  KV_ASSIGN_OR_RETURN(int code, peer.process->Wait(Clock::now() + kBound));
  return code == 0 ? Status::Ok() : Status::Internal("child exited with " + std::to_string(code));
}

std::vector<uint8_t> Expected(uint64_t bytes, int src_seed, const std::vector<Run>& runs) {
  std::vector<uint8_t> out(bytes, kUntouched);
  for (const Run& r : runs) {
    for (uint64_t i = 0; i < r.length; ++i) {
      out[r.dst_offset + i] = PatternByte(r.src_offset + i, src_seed);
    }
  }
  return out;
}

Planned PlanRandomBlocks(const LayoutSpec& src_spec, const LayoutSpec& dst_spec, int64_t tokens) {
  auto src = KvRegion::Create(src_spec);
  auto dst = KvRegion::Create(dst_spec);
  EXPECT_TRUE(src.ok() && dst.ok());
  auto pick = [](int64_t count, int64_t of, uint32_t seed) {
    std::vector<int64_t> ids(of);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    ids.resize(count);
    return ids;
  };
  const int64_t blocks = (tokens + 15) / 16;
  const auto src_blocks = pick(blocks, src_spec.blocks, 1);
  const auto dst_blocks = pick(blocks, dst_spec.blocks, 2);
  TransferSpec t;
  t.src_blocks = src_blocks;
  t.dst_blocks = dst_blocks;
  t.tokens = tokens;
  auto plan = PlanTransfer(*src, *dst, t);
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return {src->span_bytes(), dst->span_bytes(), plan.ok() ? plan->runs : std::vector<Run>{}};
}

void ExpectTheHeldBatchWritesNothing(Peer& sender, Peer& receiver, const Planned& p, int seed) {
  ASSERT_GT(p.runs.size(), 1u);
  // The link and the copy kernels first, with the runs the batch beside rewrites: NCCL's first
  // use synchronises the device, and the held stream lives in the mover's own process here (an
  // engine's is in another), so a set-up meeting it would wait until it is released.
  const std::vector<Run> half(p.runs.begin(), p.runs.begin() + (p.runs.size() + 1) / 2);
  ASSERT_TRUE(Transfer(sender, receiver, Op::kPut, half).ok());
  TransferOptions stuck;
  stuck.never_fires = true;
  Status s = Transfer(sender, receiver, Op::kPut, p.runs, stuck);
  ASSERT_TRUE(s.ok()) << s.ToString();
  // The held batch wrote nothing, though its event fired before Transfer returned.
  auto bytes = Dump(receiver);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_TRUE(*bytes == Expected(p.dst_bytes, seed, half));
}

}  // namespace kv::transport::gputest
