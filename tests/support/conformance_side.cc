#include "tests/support/conformance_side.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <future>
#include <map>
#include <mutex>

#include "base/codec.h"
#include "base/shared_memory.h"
#include "tests/support/test_support.h"

namespace kv::transport::conformance {
namespace {

using namespace std::chrono_literals;

enum Verb : uint32_t { kConnect = 1, kPost, kSnapshot, kNotes, kDump, kClose, kExit, kTrace };

// How long a side waits for a completion past its batch's deadline before it reports none; and
// how long the test waits for a side's answer beyond that.
constexpr auto kCompletionGrace = 15s;
constexpr auto kAnswerBound = 60s;

std::string EncodeStatus(const Status& s) {
  return ByteWriter().u32(static_cast<uint32_t>(s.code())).bytes(s.message()).take();
}

bool DecodeStatus(ByteReader& r, Status* out) {
  uint32_t code = 0;
  std::string_view message;
  if (!r.u32(&code) || !r.bytes(&message) || code > static_cast<uint32_t>(Code::kInternal))
    return false;
  *out = code == 0 ? Status::Ok() : Status(static_cast<Code>(code), std::string(message));
  return true;
}

std::string EncodeRuns(const std::vector<kv::Run>& runs) {
  ByteWriter w;
  w.u64(runs.size());
  for (const kv::Run& r : runs) w.u64(r.src_offset).u64(r.dst_offset).u64(r.length);
  return w.take();
}

bool DecodeRuns(std::string_view blob, std::vector<kv::Run>* runs) {
  ByteReader r(blob);
  uint64_t n = 0;
  if (!r.u64(&n) || n > blob.size() / 24) return false;
  runs->resize(n);
  for (kv::Run& run : *runs) {
    if (!r.u64(&run.src_offset) || !r.u64(&run.dst_offset) || !r.u64(&run.length)) return false;
  }
  return true;
}

class HostSideMemory final : public SideMemory {
 public:
  explicit HostSideMemory(uint64_t bytes) : bytes_(bytes) {}
  void* base() override { return bytes_.data(); }
  MemoryLocation location() const override { return MemoryLocation::Host(); }
  Status Write(const std::vector<uint8_t>& bytes) override {
    if (bytes.size() != bytes_.size()) return Status::InvalidArgument("size mismatch");
    std::memcpy(bytes_.data(), bytes.data(), bytes.size());
    return Status::Ok();
  }
  Result<std::vector<uint8_t>> Read() override { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class SharedHostSideMemory final : public SideMemory {
 public:
  explicit SharedHostSideMemory(SharedMemory memory) : memory_(std::move(memory)) {}
  void* base() override { return memory_.data(); }
  MemoryLocation location() const override { return MemoryLocation::Host(); }
  Status Write(const std::vector<uint8_t>& bytes) override {
    if (bytes.size() != memory_.size()) return Status::InvalidArgument("size mismatch");
    std::memcpy(memory_.data(), bytes.data(), bytes.size());
    return Status::Ok();
  }
  Result<std::vector<uint8_t>> Read() override {
    const auto* data = static_cast<const uint8_t*>(memory_.data());
    return std::vector<uint8_t>(data, data + memory_.size());
  }
  Transport::SharedObject shared() const override { return {memory_.fd(), 0}; }

 private:
  SharedMemory memory_;
};

// What one batch's completion did: the first status, and how often it was called.
struct CompletionSlot {
  std::promise<Status> first;
  std::atomic<int> calls{0};
};

// The side itself, in its thread or child. Answers one command at a time.
class SideBody {
 public:
  SideBody(Channel& channel, const Backend& backend, bool initiator, uint64_t bytes, int seed)
      : channel_(channel), backend_(backend), initiator_(initiator), bytes_(bytes), seed_(seed) {}

  int Run() {
    Status set_up = SetUp();
    std::string hello = EncodeStatus(set_up);
    if (set_up.ok()) {
      hello += ByteWriter()
                   .bytes(transport_->address())
                   .bytes(registration_->packed_descriptor())
                   .take();
    }
    if (!channel_.Send(hello).ok() || !set_up.ok()) {
      Shutdown();
      return set_up.ok() ? 2 : 3;
    }
    int code = Serve();
    Shutdown();
    return code;
  }

 private:
  Status SetUp() {
    const int device = initiator_ ? backend_.initiator_device : backend_.target_device;
    KV_ASSIGN_OR_RETURN(memory_, backend_.memory(device, bytes_));
    KV_RETURN_IF_ERROR(memory_->Write(Pattern(bytes_, seed_)));
    TransportOptions options{backend_.settings};
    if (device >= 0) options.settings.emplace_back("device", std::to_string(device));
    options.trace = [this](std::string_view event, uint64_t id) {
      std::lock_guard lock(mu_);
      trace_.push_back(std::string(event) + " " + std::to_string(id));
    };
    KV_ASSIGN_OR_RETURN(transport_, CreateTransport(backend_.transport, options));
    transport_->set_notification_handler([this](std::string_view note) {
      // Test-only: a handler must not block, but one copy of a test region is short.
      auto snapshot = memory_->Read();
      std::lock_guard lock(mu_);
      notes_.emplace_back(note);
      snapshots_.insert_or_assign(std::string(note), std::move(snapshot));
    });
    KV_ASSIGN_OR_RETURN(registration_,
                        transport_->register_shared_memory(memory_->base(), bytes_,
                                                           memory_->location(), memory_->shared()));
    return Status::Ok();
  }

  // Registrations and remotes go before their transport (the Transport contract), the memory
  // after it: its handler reads it.
  void Shutdown() {
    remote_.reset();
    registration_.reset();
    transport_.reset();
  }

  int Serve() {
    for (;;) {
      auto command = channel_.Receive(Clock::now() + 600s);
      if (!command.ok()) return 0;  // the test closed the channel: the side is done
      ByteReader r(*command);
      uint32_t verb = 0;
      if (!r.u32(&verb)) return 4;
      if (verb == kExit) return 0;
      Status answered = channel_.Send(Answer(static_cast<Verb>(verb), r));
      if (!answered.ok()) return 0;
    }
  }

  std::string Answer(Verb verb, ByteReader& r) {
    switch (verb) {
      case kConnect: {
        std::string_view address, descriptor;
        if (!r.bytes(&address) || !r.bytes(&descriptor))
          return EncodeStatus(Status::Internal("bad connect"));
        return EncodeStatus(Connect(address, descriptor));
      }
      case kPost:
        return PostAndWait(r);
      case kSnapshot: {
        std::string_view note;
        if (!r.bytes(&note)) return EncodeStatus(Status::Internal("bad snapshot"));
        return Snapshot(std::string(note));
      }
      case kNotes:
      case kTrace: {
        std::lock_guard lock(mu_);
        const std::vector<std::string>& list = verb == kNotes ? notes_ : trace_;
        ByteWriter w;
        w.u32(0).bytes({}).u64(list.size());
        for (const std::string& n : list) w.bytes(n);
        return w.take();
      }
      case kDump: {
        auto bytes = memory_->Read();
        if (!bytes.ok()) return EncodeStatus(bytes.status());
        return EncodeStatus(Status::Ok()) +
               std::string(reinterpret_cast<const char*>(bytes->data()), bytes->size());
      }
      case kClose:
        Shutdown();
        return EncodeStatus(Status::Ok());
      default:
        return EncodeStatus(Status::Internal("unknown command"));
    }
  }

  Status Connect(std::string_view address, std::string_view descriptor) {
    if (!transport_) return Status::Internal("the side was closed");
    KV_ASSIGN_OR_RETURN(peer_, transport_->connect(address));
    KV_ASSIGN_OR_RETURN(remote_, transport_->import_remote(peer_, descriptor));
    return Status::Ok();
  }

  // Answers twice: once every post() and the notify returned, then with the completions.
  std::string PostAndWait(ByteReader& r) {
    uint32_t op = 0;
    uint64_t deadline_ms = 0, count = 0;
    std::string_view note;
    if (!r.u32(&op) || !r.u64(&deadline_ms) || !r.bytes(&note) || !r.u64(&count) || count > 100000)
      return EncodeStatus(Status::Internal("bad post"));
    std::vector<std::vector<kv::Run>> batches(count);
    for (auto& runs : batches) {
      std::string_view blob;
      if (!r.bytes(&blob) || !DecodeRuns(blob, &runs))
        return EncodeStatus(Status::Internal("bad runs"));
    }
    if (!remote_) return EncodeStatus(Status::Internal("not connected"));

    const auto start = Clock::now();
    const auto deadline = start + std::chrono::milliseconds(deadline_ms);
    std::vector<std::shared_ptr<CompletionSlot>> slots;
    std::vector<Status> posted;
    for (const auto& runs : batches) {
      auto slot = std::make_shared<CompletionSlot>();
      Status s = transport_->post(
          {static_cast<Op>(op), registration_.get(), remote_.get(), runs, deadline},
          [slot](Status done) {
            if (slot->calls.fetch_add(1) == 0) slot->first.set_value(done);
          });
      posted.push_back(s);
      slots.push_back(std::move(slot));
    }
    Status noted = note.empty() ? Status::Ok() : transport_->notify(peer_, std::string(note));
    ByteWriter first;
    first.u32(0).bytes({}).u64(posted.size());
    for (const Status& s : posted) first.bytes(EncodeStatus(s));
    first.bytes(EncodeStatus(noted));
    if (!channel_.Send(first.take()).ok()) return EncodeStatus(Status::Internal("test gone"));

    std::vector<Status> completed;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!posted[i].ok()) {
        completed.push_back(Status::Internal("none: post() refused the batch"));
        continue;
      }
      auto future = slots[i]->first.get_future();
      if (future.wait_until(deadline + kCompletionGrace) != std::future_status::ready) {
        completed.push_back(Status::Internal("no completion within the deadline + 15 s"));
      } else {
        completed.push_back(future.get());
      }
    }
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
    int stray = 0;
    for (size_t i = 0; i < slots.size(); ++i) {
      const int calls = slots[i]->calls.load();
      stray += posted[i].ok() ? std::max(0, calls - 1) : calls;
    }
    ByteWriter second;
    second.u32(0).bytes({}).u64(completed.size());
    for (const Status& s : completed) second.bytes(EncodeStatus(s));
    second.u64(static_cast<uint64_t>(stray)).u64(static_cast<uint64_t>(took.count()));
    return second.take();
  }

  std::string Snapshot(const std::string& note) {
    const auto until = Clock::now() + 30s;
    for (;;) {
      {
        std::lock_guard lock(mu_);
        auto it = snapshots_.find(note);
        if (it != snapshots_.end()) {
          if (!it->second.ok()) return EncodeStatus(it->second.status());
          const auto& bytes = *it->second;
          return EncodeStatus(Status::Ok()) +
                 std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        }
      }
      if (Clock::now() > until)
        return EncodeStatus(Status::Timeout("notification '" + note + "' never arrived"));
      std::this_thread::sleep_for(1ms);
    }
  }

  Channel& channel_;
  const Backend backend_;
  const bool initiator_;
  const uint64_t bytes_;
  const int seed_;

  std::mutex mu_;  // guards notes_, snapshots_ and trace_ (the transport's threads write them)
  std::vector<std::string> notes_;
  std::vector<std::string> trace_;  // "event id", in the order the transport reported them
  std::map<std::string, Result<std::vector<uint8_t>>> snapshots_;

  std::unique_ptr<SideMemory> memory_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<MemoryRegistration> registration_;
  PeerId peer_ = 0;
  std::unique_ptr<RemoteMemory> remote_;
};

// The answer's leading status; `r` is left at what follows it.
Status LeadingStatus(ByteReader& r) {
  Status s;
  if (!DecodeStatus(r, &s)) return Status::Internal("malformed answer from the side");
  return s;
}

Result<std::vector<Status>> DecodeStatuses(ByteReader& r) {
  uint64_t n = 0;
  if (!r.u64(&n)) return Status::Internal("malformed statuses");
  std::vector<Status> out(n);
  for (Status& s : out) {
    std::string_view blob;
    if (!r.bytes(&blob)) return Status::Internal("malformed statuses");
    ByteReader one(blob);
    if (!DecodeStatus(one, &s)) return Status::Internal("malformed status");
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<SideMemory>> HostMemory(int device, uint64_t bytes) {
  (void)device;
  return std::unique_ptr<SideMemory>(new HostSideMemory(bytes));
}

Result<std::unique_ptr<SideMemory>> SharedHostMemory(int device, uint64_t bytes) {
  (void)device;
  KV_ASSIGN_OR_RETURN(SharedMemory memory, SharedMemory::Create(bytes, "kv-conformance"));
  return std::unique_ptr<SideMemory>(new SharedHostSideMemory(std::move(memory)));
}

std::vector<uint8_t> Pattern(uint64_t bytes, int seed) {
  std::vector<uint8_t> out(bytes, kUntouched);
  if (seed >= 0) {
    for (uint64_t i = 0; i < bytes; ++i)
      out[i] = testing::PatternByte(i, static_cast<uint32_t>(seed));
  }
  return out;
}

std::vector<uint8_t> Landed(std::vector<uint8_t> base, int src_seed,
                            const std::vector<kv::Run>& runs) {
  for (const kv::Run& r : runs) {
    for (uint64_t i = 0; i < r.length; ++i)
      base[r.dst_offset + i] = testing::PatternByte(r.src_offset + i, src_seed);
  }
  return base;
}

Result<std::unique_ptr<Side>> Side::Start(const Backend& backend, bool initiator, uint64_t bytes,
                                          int seed) {
  std::unique_ptr<Side> side(new Side());
  auto body = [backend, initiator, bytes, seed](Channel& channel) {
    return SideBody(channel, backend, initiator, bytes, seed).Run();
  };
  if (backend.hosting == Hosting::kProcesses) {
    KV_ASSIGN_OR_RETURN(side->process_, ChildProcess::Start(body));
  } else {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
      return Status::IoError(std::string("socketpair: ") + std::strerror(errno));
    side->channel_ = std::make_unique<Channel>(fds[0]);
    side->thread_ = std::thread([body, fd = fds[1], code = &side->thread_code_] {
      Channel channel(fd);
      *code = body(channel);
    });
  }
  KV_ASSIGN_OR_RETURN(std::string hello, side->Receive());
  ByteReader r(hello);
  KV_RETURN_IF_ERROR(LeadingStatus(r).WithContext("side set-up"));
  std::string_view address, descriptor;
  if (!r.bytes(&address) || !r.bytes(&descriptor)) return Status::Internal("malformed hello");
  side->address_ = address;
  side->descriptor_ = descriptor;
  return side;
}

Side::~Side() {
  if (process_) {
    // A clean exit where it answers; ~ChildProcess kills it where it does not.
    if (process_->channel().Send(ByteWriter().u32(kExit).take()).ok())
      (void)process_->Wait(Clock::now() + 10s);
    process_.reset();
  } else {
    channel_.reset();  // the side's next receive fails: it shuts down and returns
    if (thread_.joinable()) thread_.join();
  }
}

Status Side::Exit() {
  int code = 0;
  if (process_) {
    KV_RETURN_IF_ERROR(process_->channel().Send(ByteWriter().u32(kExit).take()));
    KV_ASSIGN_OR_RETURN(code, process_->Wait(Clock::now() + 10s));
    process_.reset();
  } else {
    channel_.reset();
    if (thread_.joinable()) thread_.join();
    code = thread_code_;
  }
  if (code != 0) return Status::Internal("the side exited with " + std::to_string(code));
  return Status::Ok();
}

Result<std::string> Side::Receive() {
  Channel& channel = process_ ? process_->channel() : *channel_;
  return channel.Receive(Clock::now() + kAnswerBound + kCompletionGrace);
}

Result<std::string> Side::Call(const std::string& command) {
  Channel& channel = process_ ? process_->channel() : *channel_;
  KV_RETURN_IF_ERROR(channel.Send(command));
  return Receive();
}

Status Side::Connect(const Side& target) {
  KV_ASSIGN_OR_RETURN(
      std::string answer,
      Call(ByteWriter().u32(kConnect).bytes(target.address_).bytes(target.descriptor_).take()));
  ByteReader r(answer);
  return LeadingStatus(r);
}

Result<Outcome> Side::Post(const Script& script) {
  ByteWriter w;
  w.u32(kPost)
      .u32(static_cast<uint32_t>(script.op))
      .u64(static_cast<uint64_t>(script.deadline.count()))
      .bytes(script.note)
      .u64(script.batches.size());
  for (const auto& runs : script.batches) w.bytes(EncodeRuns(runs));
  KV_ASSIGN_OR_RETURN(std::string answer, Call(w.take()));
  ByteReader r(answer);
  KV_RETURN_IF_ERROR(LeadingStatus(r));
  Outcome outcome;
  KV_ASSIGN_OR_RETURN(outcome.posted, DecodeStatuses(r));
  std::string_view noted;
  if (!r.bytes(&noted)) return Status::Internal("malformed post answer");
  ByteReader nr(noted);
  if (!DecodeStatus(nr, &outcome.noted)) return Status::Internal("malformed notify status");
  return outcome;
}

Result<Outcome> Side::Wait() {
  KV_ASSIGN_OR_RETURN(std::string answer, Receive());
  ByteReader r(answer);
  KV_RETURN_IF_ERROR(LeadingStatus(r));
  Outcome outcome;
  KV_ASSIGN_OR_RETURN(outcome.completed, DecodeStatuses(r));
  uint64_t stray = 0, took = 0;
  if (!r.u64(&stray) || !r.u64(&took)) return Status::Internal("malformed completions");
  outcome.stray_completions = static_cast<int>(stray);
  outcome.took = std::chrono::milliseconds(took);
  return outcome;
}

Result<Outcome> Side::Run(const Script& script) {
  KV_ASSIGN_OR_RETURN(Outcome posted, Post(script));
  KV_ASSIGN_OR_RETURN(Outcome done, Wait());
  done.posted = std::move(posted.posted);
  done.noted = std::move(posted.noted);
  return done;
}

Result<std::vector<uint8_t>> Side::SnapshotAt(const std::string& note) {
  KV_ASSIGN_OR_RETURN(std::string answer, Call(ByteWriter().u32(kSnapshot).bytes(note).take()));
  ByteReader r(answer);
  KV_RETURN_IF_ERROR(LeadingStatus(r));
  const size_t header = sizeof(uint32_t) * 2;  // an OK status: its code and an empty message
  return std::vector<uint8_t>(answer.begin() + header, answer.end());
}

Result<std::vector<std::string>> Side::Notes() {
  return List(kNotes);
}

Result<std::vector<std::string>> Side::Trace() {
  return List(kTrace);
}

Result<std::vector<std::string>> Side::List(uint32_t verb) {
  KV_ASSIGN_OR_RETURN(std::string answer, Call(ByteWriter().u32(verb).take()));
  ByteReader r(answer);
  KV_RETURN_IF_ERROR(LeadingStatus(r));
  uint64_t n = 0;
  if (!r.u64(&n)) return Status::Internal("malformed list");
  std::vector<std::string> notes;
  for (uint64_t i = 0; i < n; ++i) {
    std::string_view note;
    if (!r.bytes(&note)) return Status::Internal("malformed list");
    notes.emplace_back(note);
  }
  return notes;
}

Result<std::vector<uint8_t>> Side::Dump() {
  KV_ASSIGN_OR_RETURN(std::string answer, Call(ByteWriter().u32(kDump).take()));
  ByteReader r(answer);
  KV_RETURN_IF_ERROR(LeadingStatus(r));
  const size_t header = sizeof(uint32_t) * 2;
  return std::vector<uint8_t>(answer.begin() + header, answer.end());
}

Status Side::Kill() {
  if (process_) {
    process_->Kill();
    return Status::Ok();
  }
  KV_ASSIGN_OR_RETURN(std::string answer, Call(ByteWriter().u32(kClose).take()));
  ByteReader r(answer);
  return LeadingStatus(r);
}

}  // namespace kv::transport::conformance
