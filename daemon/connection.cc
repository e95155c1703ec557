#include "daemon/connection.h"

#include <google/protobuf/message_lite.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstring>
#include <utility>

namespace kv::daemon {

namespace asio = boost::asio;

std::shared_ptr<Connection> Connection::Adopt(asio::io_context& io, int fd, ConnectionLimits limits,
                                              std::string label) {
  return std::shared_ptr<Connection>(new Connection(io, fd, limits, std::move(label)));
}

Connection::Connection(asio::io_context& io, int fd, ConnectionLimits limits, std::string label)
    : socket_(io, fd),
      partial_timer_(io),
      limits_(limits),
      label_(std::move(label)),
      decoder_(limits.max_frame_bytes) {
  socket_.non_blocking(true);
}

Connection::~Connection() {
  for (int fd : fds_) close(fd);
}

void Connection::Start(MessageHandler on_message, CloseHandler on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  ArmRead();
}

void Connection::ArmRead() {
  socket_.async_wait(asio::posix::stream_descriptor::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       if (!self->open_) return;
                       if (ec) {
                         self->Close(Status::IoError(self->label_ + ": " + ec.message()));
                         return;
                       }
                       self->OnReadable();
                     });
}

void Connection::OnReadable() {
  char buf[64 * 1024];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  bool eof = false;
  for (;;) {
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(socket_.native_handle(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Close(Status::IoError(label_ + ": recvmsg: " + std::strerror(errno)));
      return;
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds_.push_back(fd);
      }
    }
    if (fds_.size() > limits_.max_queued_fds) {
      Close(Status::InvalidArgument(label_ + ": " + std::to_string(fds_.size()) +
                                    " unclaimed file descriptors, limit " +
                                    std::to_string(limits_.max_queued_fds)));
      return;
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      Close(Status::InvalidArgument(label_ + ": too many file descriptors in one message"));
      return;
    }
    if (n == 0) {
      eof = true;
      break;
    }
    decoder_.Append(buf, static_cast<size_t>(n));
  }

  auto self = shared_from_this();  // a handler may drop the session's last reference
  if (eof) {
    if (DeliverFrames(SIZE_MAX) == Delivery::kClosed) return;
    Close(decoder_.pending_bytes() > 0
              ? Status::InvalidArgument(label_ + ": connection ended in the middle of a message")
              : Status::Ok());
    return;
  }
  ContinueReading();
}

void Connection::ContinueReading() {
  switch (DeliverFrames(kFramesPerTurn)) {
    case Delivery::kClosed:
      return;
    case Delivery::kMore:
      // The rest waits behind whatever else the io loop has ready: one engine's storm of saves
      // must not hold off a peer's request (or transport completions) for milliseconds. Nothing
      // more is read meanwhile, so a sender faster than its handler meets the socket's buffer,
      // not an ever-growing decoder.
      asio::post(socket_.get_executor(), [self = shared_from_this()] {
        if (self->open_) self->ContinueReading();
      });
      return;
    case Delivery::kDrained:
      if (decoder_.pending_bytes() > 0) ArmPartialFrameTimer();
      ArmRead();
      return;
  }
}

Connection::Delivery Connection::DeliverFrames(size_t most) {
  for (size_t delivered = 0; delivered < most; ++delivered) {
    auto frame = decoder_.Next();
    if (!frame.ok()) {
      Close(frame.status().WithContext(label_));
      return Delivery::kClosed;
    }
    if (!frame->has_value()) return Delivery::kDrained;
    ++frames_received_;
    if (opener_) {
      auto message = opener_->Open(**frame);
      if (!message.ok()) {
        seal_broken_ = true;
        Close(message.status().WithContext(label_));
        return Delivery::kClosed;
      }
      **frame = std::move(message).value();
    }
    on_message_(std::move(**frame));
    if (!open_) return Delivery::kClosed;
  }
  return Delivery::kMore;
}

void Connection::ArmPartialFrameTimer() {
  if (partial_timer_armed_) return;
  partial_timer_armed_ = true;
  const uint64_t frames_at_arm = frames_received_;
  partial_timer_.expires_after(limits_.partial_frame_timeout);
  partial_timer_.async_wait(
      [self = shared_from_this(), frames_at_arm](const boost::system::error_code& ec) {
        self->partial_timer_armed_ = false;
        if (ec || !self->open_) return;
        if (self->decoder_.pending_bytes() > 0 && self->frames_received_ == frames_at_arm) {
          self->Close(Status::Timeout(self->label_ + ": message incomplete after " +
                                      std::to_string(self->limits_.partial_frame_timeout.count()) +
                                      " ms"));
        } else if (self->decoder_.pending_bytes() > 0) {
          self->ArmPartialFrameTimer();
        }
      });
}

Status Connection::Send(const google::protobuf::MessageLite& message) {
  if (!open_) return Status::Unavailable(label_ + ": connection closed");
  std::string body;
  if (!message.SerializeToString(&body)) {
    return Status::Internal(label_ + ": could not serialise " + message.GetTypeName());
  }
  std::string frame;
  Status s = sealer_ ? sealer_->Append(body, &frame, limits_.max_frame_bytes)
                     : AppendFrame(body, &frame, limits_.max_frame_bytes);
  if (s.code() == Code::kResourceExhausted) {
    s = s.WithContext(label_);
    Close(s);
    return s;
  }
  if (!s.ok()) return s.WithContext(label_);
  backlog_bytes_ += frame.size();
  if (backlog_bytes_ > limits_.max_write_backlog_bytes) {
    Status why = Status::ResourceExhausted(label_ + ": peer is not reading; " +
                                           std::to_string(backlog_bytes_) + " bytes queued");
    Close(why);
    return why;
  }
  writes_.push_back(std::move(frame));
  WriteNext();
  return Status::Ok();
}

// send(MSG_NOSIGNAL) on readiness rather than asio::async_write: a peer that vanished must cost
// an EPIPE on its own connection, not a SIGPIPE for the embedding process.
void Connection::WriteNext() {
  if (writing_ || writes_.empty() || !open_) return;
  while (!writes_.empty()) {
    std::string& front = writes_.front();
    ssize_t n = send(socket_.native_handle(), front.data() + write_offset_,
                     front.size() - write_offset_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      Close(Status::IoError(label_ + ": send: " + std::strerror(errno)));
      return;
    }
    write_offset_ += static_cast<size_t>(n);
    if (write_offset_ == front.size()) {
      backlog_bytes_ -= front.size();
      writes_.pop_front();
      write_offset_ = 0;
    }
  }
  if (writes_.empty()) return;
  writing_ = true;
  socket_.async_wait(asio::posix::stream_descriptor::wait_write,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->writing_ = false;
                       if (!self->open_) return;
                       if (ec) {
                         self->Close(Status::IoError(self->label_ + ": write: " + ec.message()));
                         return;
                       }
                       self->WriteNext();
                     });
}

void Connection::Close(const Status& why) {
  if (!open_) return;
  open_ = false;
  boost::system::error_code ignored;
  partial_timer_.cancel();
  socket_.cancel(ignored);
  socket_.close(ignored);
  if (on_close_) {
    auto handler = std::move(on_close_);
    handler(why);
  }
}

Status Connection::EnableSealing(std::string_view send_key, std::string_view receive_key) {
  auto sealer = FrameSealer::Create(send_key);
  auto opener = FrameOpener::Create(receive_key);
  Status s = sealer.ok() ? opener.status() : sealer.status();
  if (!s.ok()) {
    s = s.WithContext(label_ + ": sealing");
    Close(s);
    return s;
  }
  sealer_ = std::make_unique<FrameSealer>(std::move(sealer).value());
  opener_ = std::make_unique<FrameOpener>(std::move(opener).value());
  return Status::Ok();
}

int Connection::TakeFd() {
  if (fds_.empty()) return -1;
  int fd = fds_.front();
  fds_.pop_front();
  return fd;
}

}  // namespace kv::daemon
