#include "connector/client.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/fd_passing.h"
#include "base/framing.h"
#include "protocol/wire_layout.h"

namespace kv::connector {

Result<std::unique_ptr<ConnectorCore::Client>> ConnectorCore::Client::Create(
    int fd, std::chrono::milliseconds timeout, bool busy_poll) {
  // A kvd that stops reading cannot block a sender past the timeout.
  timeval tv{};
  tv.tv_sec = timeout.count() / 1000;
  tv.tv_usec = (timeout.count() % 1000) * 1000;
  if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0) {
    Status s = Status::IoError(std::string("bounding sends to kvd (SO_SNDTIMEO): ") +
                               std::strerror(errno));
    close(fd);
    return s;
  }
  return std::unique_ptr<Client>(new Client(fd, timeout, busy_poll));
}

ConnectorCore::Client::Client(int fd, std::chrono::milliseconds timeout, bool busy_poll)
    : fd_(fd), timeout_(timeout), busy_poll_(busy_poll), waker_(busy_poll) {
  reader_ = std::thread([this] { ReadLoop(); });
}

ConnectorCore::Client::~Client() {
  shutdown(fd_, SHUT_RDWR);  // wakes the reader's recv
  reader_.join();
  close(fd_);
}

Status ConnectorCore::Client::SendFrame(const std::string& frame, int pass_fd) {
  std::lock_guard<std::mutex> lock(send_mu_);
  size_t sent = 0;
  while (sent < frame.size()) {
    const ssize_t n =
        kv::SendWithFd(fd_, frame.data() + sent, frame.size() - sent, sent == 0 ? pass_fd : -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return Status::Timeout("kvd did not take a message within " +
                               std::to_string(timeout_.count()) + " ms");
      }
      return Status::Unavailable(std::string("send to kvd: ") + std::strerror(errno));
    }
    sent += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<proto::Reply> ConnectorCore::Client::Call(proto::EngineMessage message, int pass_fd) {
  return std::move(CallAll({&message, 1}, pass_fd).front());
}

std::vector<Result<proto::Reply>> ConnectorCore::Client::CallAll(
    std::span<proto::EngineMessage> messages, int pass_fd) {
  std::vector<uint64_t> seqs(messages.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return std::vector<Result<proto::Reply>>(messages.size(), closed_reason_);
    for (uint64_t& seq : seqs) {
      seq = next_seq_++;
      replies_[seq];
    }
  }
  Status s;
  std::string frames;
  for (size_t i = 0; s.ok() && i < messages.size(); ++i) {
    messages[i].set_seq(seqs[i]);
    s = kv::AppendFrame(messages[i].SerializeAsString(), &frames);
  }
  if (s.ok()) s = SendFrame(frames, pass_fd);
  std::unique_lock<std::mutex> lock(mu_);
  auto answered = [&](uint64_t seq) {
    auto it = replies_.find(seq);
    return it != replies_.end() && it->second.has_value();
  };
  if (s.ok()) {
    const bool all = waker_.AwaitUntil(lock, std::chrono::steady_clock::now() + timeout_, [&] {
      return closed_ || std::all_of(seqs.begin(), seqs.end(), answered);
    });
    if (!all) {
      s = Status::Timeout("kvd did not answer within " + std::to_string(timeout_.count()) + " ms");
    } else if (closed_) {
      s = closed_reason_;
    }
  }
  std::vector<Result<proto::Reply>> out;
  out.reserve(messages.size());
  for (uint64_t seq : seqs) {
    auto it = replies_.find(seq);
    if (it == replies_.end() || !it->second.has_value()) {
      out.emplace_back(s);
    } else if (Status error = kv::proto::FromWire(it->second->error()); !error.ok()) {
      out.emplace_back(std::move(error));
    } else {
      out.emplace_back(std::move(*it->second));
    }
    if (it != replies_.end()) replies_.erase(it);
  }
  return out;
}

Status ConnectorCore::Client::Send(proto::EngineMessage message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return closed_reason_;
  }
  message.set_seq(0);
  std::string frame;
  KV_RETURN_IF_ERROR(kv::AppendFrame(message.SerializeAsString(), &frame));
  return SendFrame(frame, -1);
}

Status ConnectorCore::Client::SendAll(std::span<proto::EngineMessage> messages) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return closed_reason_;
  }
  std::string frames;
  for (proto::EngineMessage& message : messages) {
    message.set_seq(0);
    KV_RETURN_IF_ERROR(kv::AppendFrame(message.SerializeAsString(), &frames));
  }
  if (frames.empty()) return Status::Ok();
  return SendFrame(frames, -1);
}

Status ConnectorCore::Client::SaveError(const std::string& request) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = save_errors_.find(request);
  return it == save_errors_.end() ? Status::Ok() : it->second;
}

Status ConnectorCore::Client::TakeSaveError(const std::string& request) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = save_errors_.find(request);
  if (it == save_errors_.end()) return Status::Ok();
  Status error = std::move(it->second);
  save_errors_.erase(it);
  std::erase(save_error_order_, request);
  return error;
}

void ConnectorCore::Client::ReadLoop() {
  kv::FrameDecoder decoder;
  char buf[64 * 1024];
  Status why = Status::Unavailable("kvd closed the connection");
  for (;;) {
    // Spinning, a reply or LayerReady is seen within microseconds, not a wake-up (41-114 us p50
    // on the GPU host, benchmarks/pd_gpu.md); the destructor's shutdown ends both loops alike.
    ssize_t n = recv(fd_, buf, sizeof(buf), busy_poll_ ? MSG_DONTWAIT : 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && busy_poll_ && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      kv::Waker::Pause();
      continue;
    }
    if (n <= 0) {
      if (n < 0) why = Status::Unavailable(std::string("read from kvd: ") + std::strerror(errno));
      break;
    }
    decoder.Append(buf, static_cast<size_t>(n));
    bool broken = false;
    for (;;) {
      auto frame = decoder.Next();
      proto::DaemonMessage message;
      if (!frame.ok() || (frame->has_value() && !message.ParseFromString(**frame))) {
        why = Status::Internal("kvd sent a malformed message");
        broken = true;
        break;
      }
      if (!frame->has_value()) break;
      std::lock_guard<std::mutex> lock(mu_);
      Apply(std::move(message));
    }
    if (broken) break;
    waker_.Notify();
  }
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  closed_reason_ = why;
  for (auto& [id, load] : loads_) FailLoad(load, why);
  waker_.Notify();
}

void ConnectorCore::Client::FailLoad(Load& load, const Status& why) {
  if (!load.failed.ok()) return;
  load.failed = why;
  failed_blocks_.insert(failed_blocks_.end(), load.blocks.begin(), load.blocks.end());
}

void ConnectorCore::Client::Apply(proto::DaemonMessage message) {
  switch (message.body_case()) {
    case proto::DaemonMessage::kReply: {
      auto it = replies_.find(message.seq());
      if (it != replies_.end()) it->second = std::move(*message.mutable_reply());
      return;
    }
    case proto::DaemonMessage::kLayerReady: {
      const proto::LayerReady& ready = message.layer_ready();
      auto it = loads_.find(ready.request_id());
      const int end = ready.layer_end() == 0 ? ready.layer() + 1 : ready.layer_end();
      // kvd names each layer once; a range whose first layer is in place is a repeat.
      if (it != loads_.end() && ready.layer() < end && !it->second.IsReady(ready.layer())) {
        it->second.ready.emplace_back(ready.layer(), end);
      }
      return;
    }
    case proto::DaemonMessage::kRequestDone: {
      const auto& done = message.request_done();
      const Status error = kv::proto::FromWire(done.error());
      if (done.sent()) {
        finished_.sent.push_back(done.request_id());
        if (!error.ok() && save_errors_.emplace(done.request_id(), error).second) {
          save_error_order_.push_back(done.request_id());
          if (save_error_order_.size() > kMaxSaveErrors) {
            save_errors_.erase(save_error_order_.front());
            save_error_order_.pop_front();
          }
        }
        return;
      }
      auto it = loads_.find(done.request_id());
      if (it == loads_.end()) return;
      if (error.ok()) {
        finished_.received.push_back(done.request_id());
      } else {
        FailLoad(it->second, error);
      }
      return;
    }
    default:
      return;
  }
}

bool ConnectorCore::Client::ExpectLoad(const std::string& request, std::vector<int64_t> blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  return loads_.try_emplace(request, Load{{}, Status::Ok(), std::move(blocks)}).second;
}

void ConnectorCore::Client::ForgetLoad(const std::string& request) {
  std::lock_guard<std::mutex> lock(mu_);
  loads_.erase(request);
  waker_.Notify();  // a waiter on it answers kNotFound now, not at its timeout
}

Status ConnectorCore::Client::WaitLayer(const std::string& request, int layer) {
  std::unique_lock<std::mutex> lock(mu_);
  // Looked up afresh on every wake-up: TakeFinished, TakeFailedBlocks or ForgetLoad on another
  // thread may erase the load while this one waits.
  const Load* load = nullptr;
  auto settled = [&] {
    auto it = loads_.find(request);
    load = it == loads_.end() ? nullptr : &it->second;
    return load == nullptr || load->IsReady(layer) || !load->failed.ok();
  };
  waker_.AwaitUntil(lock, std::chrono::steady_clock::now() + timeout_, settled);
  if (load == nullptr) return Status::NotFound("no load of request " + request);
  if (load->IsReady(layer)) return Status::Ok();
  if (!load->failed.ok()) return load->failed;
  return Status::Timeout("layer " + std::to_string(layer) + " of request " + request +
                         " not in place within " + std::to_string(timeout_.count()) + " ms");
}

Finished ConnectorCore::Client::TakeFinished() {
  std::lock_guard<std::mutex> lock(mu_);
  Finished out = std::move(finished_);
  finished_ = {};
  for (const auto& id : out.received) loads_.erase(id);
  return out;
}

std::vector<int64_t> ConnectorCore::Client::TakeFailedBlocks() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> out = std::move(failed_blocks_);
  failed_blocks_.clear();
  ForgetFailedLoads();
  return out;
}

void ConnectorCore::Client::ForgetFailedLoads() {
  for (auto it = loads_.begin(); it != loads_.end();) {
    if (it->second.failed.ok()) {
      ++it;
      continue;
    }
    if (load_errors_.insert_or_assign(it->first, it->second.failed).second) {
      load_error_order_.push_back(it->first);
      if (load_error_order_.size() > kMaxLoadErrors) {
        load_errors_.erase(load_error_order_.front());
        load_error_order_.pop_front();
      }
    }
    it = loads_.erase(it);
  }
}

Status ConnectorCore::Client::LoadError(const std::string& request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = loads_.find(request); it != loads_.end()) return it->second.failed;
  auto it = load_errors_.find(request);
  return it == load_errors_.end() ? Status::Ok() : it->second;
}

Status ConnectorCore::Client::TakeFailedBlocksInto(std::span<int64_t> out, size_t* count) {
  std::lock_guard<std::mutex> lock(mu_);
  *count = failed_blocks_.size();
  if (failed_blocks_.size() > out.size()) {
    return Status::ResourceExhausted(std::to_string(failed_blocks_.size()) +
                                     " failed blocks do not fit a buffer of " +
                                     std::to_string(out.size()) + "; none was taken");
  }
  std::copy(failed_blocks_.begin(), failed_blocks_.end(), out.begin());
  failed_blocks_.clear();
  ForgetFailedLoads();
  return Status::Ok();
}

}  // namespace kv::connector
