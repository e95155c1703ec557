// Connection: one framed, Protobuf-carrying stream socket (unix or TCP) served by an io_context.
//
// Reads are recvmsg() on readiness, so file descriptors sent with SCM_RIGHTS by a local engine
// arrive with the bytes that announce them; they queue here until the session claims them with
// TakeFd(). A frame above the size limit, more fds than allowed, a frame left incomplete past
// the partial-frame deadline, or a write backlog past its bound close the connection: one bad
// peer costs exactly its own connection.
//
// Threading: every method must be called on the io_context's thread; handlers run there.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "base/frame_seal.h"
#include "base/framing.h"
#include "base/status.h"

namespace google::protobuf {
class MessageLite;
}

namespace kv::daemon {

struct ConnectionLimits {
  uint32_t max_frame_bytes = kDefaultMaxFrameBytes;
  size_t max_queued_fds = 0;  // 0: a received fd is a protocol error
  std::chrono::milliseconds partial_frame_timeout{5000};
  size_t max_write_backlog_bytes = 64u << 20;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Frames handed to the message handler per turn of the io loop; more wait behind the other
  // handlers ready then, in order. Small, so that a peer's WantRequest (which starts a request's
  // transfer) is not held behind an engine's burst of saves; below 4 the send queue, flushed
  // once a turn, posts too little at a time (benchmarks/pd_gpu.md, seventh session).
  static constexpr size_t kFramesPerTurn = 4;
  using MessageHandler = std::function<void(std::string body)>;
  // Called once, with OK for an orderly close by the other side, else why it was closed.
  using CloseHandler = std::function<void(const Status& why)>;

  // Takes ownership of the connected socket `fd`.
  static std::shared_ptr<Connection> Adopt(boost::asio::io_context& io, int fd,
                                           ConnectionLimits limits, std::string label);
  ~Connection();

  void Start(MessageHandler on_message, CloseHandler on_close);
  // Queues one framed message. Errors close the connection (and are returned).
  Status Send(const google::protobuf::MessageLite& message);
  // Closes now; the close handler runs (once) with `why`.
  void Close(const Status& why);

  // From now on every frame sent is sealed under `send_key`, and every frame received must be
  // sealed under `receive_key` (base/frame_seal.h: AES-256-GCM, each direction's frames
  // numbered from 0; peer_auth.h derives the keys): encrypted, and a frame that does not open
  // (altered, injected, replayed, reordered) closes the connection, as does a direction whose
  // frame numbers are spent. Frames already queued are not changed. An error (a key of the
  // wrong size) closes the connection and is returned.
  Status EnableSealing(std::string_view send_key, std::string_view receive_key);

  // The oldest fd received and not yet claimed, or -1. The caller owns it.
  int TakeFd();
  bool open() const { return open_; }
  // A received frame did not open (EnableSealing): the connection was closed for it.
  bool seal_broken() const { return seal_broken_; }
  const std::string& label() const { return label_; }
  int native_handle() { return socket_.native_handle(); }

 private:
  Connection(boost::asio::io_context& io, int fd, ConnectionLimits limits, std::string label);
  void ArmRead();
  void OnReadable();
  // Delivers kFramesPerTurn frames, then queues itself behind the io loop's other ready
  // handlers until every frame read is delivered; only then reads again.
  void ContinueReading();
  enum class Delivery { kDrained, kMore, kClosed };
  // Hands up to `most` decoded frames to the handler: kDrained when no complete frame is left,
  // kMore when `most` were delivered, kClosed once the connection closed.
  Delivery DeliverFrames(size_t most);
  void ArmPartialFrameTimer();
  void WriteNext();

  boost::asio::posix::stream_descriptor socket_;
  boost::asio::steady_timer partial_timer_;
  ConnectionLimits limits_;
  std::string label_;
  FrameDecoder decoder_;
  std::deque<int> fds_;
  std::deque<std::string> writes_;
  size_t backlog_bytes_ = 0;
  size_t write_offset_ = 0;  // bytes of writes_.front() already sent
  bool writing_ = false;
  bool open_ = true;
  bool partial_timer_armed_ = false;
  bool seal_broken_ = false;
  uint64_t frames_received_ = 0;
  // EnableSealing: each direction's key and frame numbers; null before.
  std::unique_ptr<FrameSealer> sealer_;
  std::unique_ptr<FrameOpener> opener_;
  MessageHandler on_message_;
  CloseHandler on_close_;
};

}  // namespace kv::daemon
