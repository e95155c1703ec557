// ConnectorCore::Client: the connection to kvd behind a Connector — blocking request/reply calls
// matched by seq, and a reader thread that applies kvd's events (LayerReady, RequestDone) to
// per-request state the waiting calls observe. Private to connector/.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/waker.h"
#include "connector/connector_core.h"
#include "protocol/kvd.pb.h"

namespace kv::connector {

class ConnectorCore::Client {
 public:
  // Takes ownership of `fd`, a connected stream socket to kvd, on every path. Sends to kvd are
  // bounded by `timeout` (SO_SNDTIMEO); kIoError when the socket refuses that bound. With
  // `busy_poll` the reader spins on the socket and the waiting calls on its news instead of
  // sleeping (ConnectorOptions::busy_poll): a core for the reader, another while a call waits.
  static Result<std::unique_ptr<Client>> Create(int fd, std::chrono::milliseconds timeout,
                                                bool busy_poll = false);
  ~Client();

  // Sends `message` (and `pass_fd` with it when >= 0) and waits for the reply: the reply's
  // error as a Status, kTimeout, or kUnavailable when kvd went away. CallAll of one.
  Result<proto::Reply> Call(proto::EngineMessage message, int pass_fd = -1);
  // Several messages sent in one write (`pass_fd` with its first byte), each with its own seq:
  // kvd reads them in one wake-up and answers each, so a batch costs one round trip, not one
  // each. One result per message, in order: its reply, the reply's error, or the batch's own
  // (kTimeout within one timeout for all, kUnavailable) where it has no reply. After a failed
  // send some may have gone out. Non-empty.
  std::vector<Result<proto::Reply>> CallAll(std::span<proto::EngineMessage> messages,
                                            int pass_fd = -1);
  // Sends `message` with seq 0: kvd sends no reply (SaveLayer only; a save it refuses comes back
  // as RequestDone(sent) with the error, kept for SaveError). kUnavailable when kvd went away.
  Status Send(proto::EngineMessage message);
  // Send of several messages in one write: kvd reads them in one wake-up, not one each (a
  // step's saves; SaveLayers). One status for all of them: on an error some may have gone out.
  Status SendAll(std::span<proto::EngineMessage> messages);

  // The error of a send of `request` that failed (a refused one-way save, or the transfer), if
  // any; TakeSaveError forgets it.
  Status SaveError(const std::string& request);
  Status TakeSaveError(const std::string& request);

  // Records a load so that events for it are kept; before the StartLoad call goes out. False,
  // with nothing changed, when `request` is tracked already (loading, or finished and not yet
  // taken by TakeFinished): a second load would share its events, and forget them if refused.
  bool ExpectLoad(const std::string& request, std::vector<int64_t> blocks);
  void ForgetLoad(const std::string& request);
  Status WaitLayer(const std::string& request, int layer);
  Finished TakeFinished();
  // Also forgets the failed loads: WaitLayer on them is kNotFound afterwards.
  std::vector<int64_t> TakeFailedBlocks();
  // TakeFailedBlocks into `out`; *count is how many there are. kResourceExhausted, with nothing
  // taken, when they do not fit.
  Status TakeFailedBlocksInto(std::span<int64_t> out, size_t* count);
  // The error a load of `request` failed with, also after TakeFailedBlocks forgot the load (the
  // last kMaxLoadErrors of them); Ok when it did not fail or is not known.
  Status LoadError(const std::string& request);

 private:
  Client(int fd, std::chrono::milliseconds timeout, bool busy_poll);

  struct Load {
    // The layers in place, as kvd's LayerReady named them: [begin, end) each.
    std::vector<std::pair<int, int>> ready;
    bool IsReady(int layer) const {
      return std::any_of(ready.begin(), ready.end(),
                         [layer](const auto& r) { return r.first <= layer && layer < r.second; });
    }
    Status failed;
    std::vector<int64_t> blocks;
  };

  Status SendFrame(const std::string& frame, int pass_fd);
  void ReadLoop();
  void Apply(proto::DaemonMessage message);      // mu_ held
  void FailLoad(Load& load, const Status& why);  // mu_ held
  void ForgetFailedLoads();                      // mu_ held: into load_errors_

  const int fd_;
  const std::chrono::milliseconds timeout_;
  const bool busy_poll_;
  std::mutex send_mu_;
  std::mutex mu_;
  kv::Waker waker_;  // notified after each change under mu_ that a waiting call may wait for
  uint64_t next_seq_ = 1;
  std::map<uint64_t, std::optional<proto::Reply>> replies_;
  bool closed_ = false;
  Status closed_reason_;
  std::map<std::string, Load> loads_;
  Finished finished_;
  std::vector<int64_t> failed_blocks_;
  // Failed sends by request, oldest first in save_error_order_; at most kMaxSaveErrors (an engine
  // that never asks about a failed request does not grow them without bound).
  static constexpr size_t kMaxSaveErrors = 4096;
  std::map<std::string, Status> save_errors_;
  std::deque<std::string> save_error_order_;
  // Forgotten failed loads' errors (LoadError), oldest first in load_error_order_.
  static constexpr size_t kMaxLoadErrors = 4096;
  std::map<std::string, Status> load_errors_;
  std::deque<std::string> load_error_order_;
  std::thread reader_;
};

}  // namespace kv::connector
