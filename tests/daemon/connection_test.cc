// Connection: a storm of frames from one socket is delivered in order, kFramesPerTurn at a time,
// with the io loop's other ready handlers run in between; frames read before the other side
// closed are all delivered before the close handler; sealed frames (issue 19) open in order and a
// tampered one closes the connection.
#include "daemon/connection.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "base/frame_seal.h"
#include "base/framing.h"
#include "daemon/peer_auth.h"
#include "protocol/kvd.pb.h"

namespace kv::daemon {
namespace {

using namespace std::chrono_literals;

struct Pair {
  int ours = -1, theirs = -1;
  Pair() {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0) {
      ours = fds[0];
      theirs = fds[1];
    }
  }
  ~Pair() {
    if (theirs >= 0) close(theirs);
  }
};

// Writes `count` frames "0", "1", ... in one send, so one read sees them all.
void WriteFrames(int fd, int count) {
  std::string bytes;
  for (int i = 0; i < count; ++i) ASSERT_TRUE(AppendFrame(std::to_string(i), &bytes).ok());
  ASSERT_EQ(static_cast<ssize_t>(bytes.size()), send(fd, bytes.data(), bytes.size(), 0));
}

// A socket pair whose other end has written `frames` frames, ours adopted by a Connection.
class ConnectionTest : public ::testing::Test {
 protected:
  std::shared_ptr<Connection> Open(int frames) {
    if (pair.ours < 0) return nullptr;
    WriteFrames(pair.theirs, frames);
    return Connection::Adopt(io, pair.ours, ConnectionLimits{}, "test");
  }
  boost::asio::io_context io;
  Pair pair;
};

TEST_F(ConnectionTest, AStormOfFramesLetsOtherHandlersRunAndKeepsItsOrder) {
  constexpr int kFrames = 3 * Connection::kFramesPerTurn + 5;
  auto conn = Open(kFrames);
  ASSERT_NE(conn, nullptr);
  std::vector<std::string> got;
  int delivered_when_other_ran = -1;
  conn->Start(
      [&](std::string body) {
        // The first frame's handler queues another handler, as a peer's message would be.
        if (got.empty()) {
          boost::asio::post(io, [&] { delivered_when_other_ran = static_cast<int>(got.size()); });
        }
        got.push_back(std::move(body));
        if (got.size() == static_cast<size_t>(kFrames)) io.stop();
      },
      [](const Status&) {});
  io.run_for(2s);
  ASSERT_EQ(static_cast<size_t>(kFrames), got.size());
  for (int i = 0; i < kFrames; ++i) EXPECT_EQ(std::to_string(i), got[i]);
  // It ran after the first turn's frames, long before the storm's last.
  EXPECT_EQ(static_cast<int>(Connection::kFramesPerTurn), delivered_when_other_ran);
  conn->Close(Status::Ok());
}

TEST_F(ConnectionTest, EveryFrameReadBeforeTheOtherSideClosedIsDeliveredFirst) {
  constexpr int kFrames = 2 * Connection::kFramesPerTurn + 1;
  auto conn = Open(kFrames);
  ASSERT_NE(conn, nullptr);
  close(pair.theirs);
  pair.theirs = -1;
  int frames = 0;
  int frames_at_close = -1;
  Status why = Status::Internal("not closed");
  conn->Start([&](std::string) { ++frames; },
              [&](const Status& s) {
                frames_at_close = frames;
                why = s;
              });
  io.run_for(2s);
  EXPECT_EQ(kFrames, frames);
  EXPECT_EQ(kFrames, frames_at_close);
  EXPECT_TRUE(why.ok()) << why.ToString();
}

// Security issue 19: after authentication every frame is sealed (AES-256-GCM, numbered per
// direction, base/frame_seal.h). Sealed frames in order are delivered opened; a flipped bit, a
// replay of an earlier frame or two frames swapped close the connection with the frame named and
// nothing more delivered; what the connection sends is sealed under its own key.
TEST_F(ConnectionTest, SealedFramesOpenInOrderAndATamperedReplayedOrReorderedOneCloses) {
  const std::string key(32, 'k'), send_key(32, 's');
  std::vector<std::string> sealed;  // the bodies of "frame 0" ... "frame 3", sealed in order
  {
    auto sealer = FrameSealer::Create(key);
    ASSERT_TRUE(sealer.ok());
    for (int i = 0; i < 4; ++i) {
      std::string bytes;
      ASSERT_TRUE(sealer->Append("frame " + std::to_string(i), &bytes, kDefaultMaxFrameBytes).ok());
      sealed.push_back(bytes.substr(kFrameHeaderBytes));
    }
  }
  enum class Tamper { kNone, kFlip, kReplay, kReorder };
  for (const Tamper tamper : {Tamper::kNone, Tamper::kFlip, Tamper::kReplay, Tamper::kReorder}) {
    Pair p;
    auto conn = Connection::Adopt(io, p.ours, ConnectionLimits{}, "sealed");
    ASSERT_TRUE(conn->EnableSealing(send_key, key).ok());
    std::vector<std::string> wire = sealed;
    switch (tamper) {
      case Tamper::kNone:
        break;
      case Tamper::kFlip:
        wire[2][1] ^= 0x01;
        break;
      case Tamper::kReplay:
        wire[2] = sealed[0];  // an earlier frame, sent again
        break;
      case Tamper::kReorder:
        std::swap(wire[2], wire[3]);
        break;
    }
    std::string bytes;
    for (const std::string& body : wire) ASSERT_TRUE(AppendFrame(body, &bytes).ok());
    ASSERT_EQ(static_cast<ssize_t>(bytes.size()), send(p.theirs, bytes.data(), bytes.size(), 0));
    std::vector<std::string> got;
    Status why = Status::Ok();
    bool closed = false;
    conn->Start([&](std::string body) { got.push_back(std::move(body)); },
                [&](const Status& s) {
                  closed = true;
                  why = s;
                });
    io.restart();
    io.run_for(tamper == Tamper::kNone ? 300ms : 1s);
    if (tamper == Tamper::kNone) {
      EXPECT_FALSE(closed) << why.ToString();
      EXPECT_EQ(got, (std::vector<std::string>{"frame 0", "frame 1", "frame 2", "frame 3"}));
      conn->Close(Status::Ok());
      continue;
    }
    EXPECT_TRUE(closed);
    EXPECT_NE(why.message().find("sealed frame 2 did not open"), std::string::npos)
        << why.ToString();
    EXPECT_EQ(got, (std::vector<std::string>{"frame 0", "frame 1"}));
  }
}

// What a sealed connection sends: nothing of the message in the clear, and it opens under the
// send key as frame 0, 1, ...
TEST_F(ConnectionTest, WhatASealedConnectionSendsIsEncryptedUnderItsSendKey) {
  const std::string send_key(32, 's'), receive_key(32, 'r');
  auto conn = Connection::Adopt(io, pair.ours, ConnectionLimits{}, "sealed");
  ASSERT_TRUE(conn->EnableSealing(send_key, receive_key).ok());
  conn->Start([](std::string) {}, [](const Status&) {});
  proto::PeerMessage m;
  m.mutable_refused()->set_reason("request-id-0123456789 token-abcdefabcdef");
  ASSERT_TRUE(conn->Send(m).ok());
  ASSERT_TRUE(conn->Send(m).ok());
  io.run_for(100ms);
  std::string wire;
  char buf[4096];
  ssize_t n;
  while ((n = recv(pair.theirs, buf, sizeof buf, MSG_DONTWAIT)) > 0) wire.append(buf, n);
  ASSERT_FALSE(wire.empty());
  EXPECT_EQ(wire.find("request-id-0123456789"), std::string::npos);
  EXPECT_EQ(wire.find("token-abcdefabcdef"), std::string::npos);
  FrameDecoder decoder;
  decoder.Append(wire.data(), wire.size());
  auto opener = FrameOpener::Create(send_key);
  ASSERT_TRUE(opener.ok());
  for (int i = 0; i < 2; ++i) {
    auto frame = decoder.Next();
    ASSERT_TRUE(frame.ok() && frame->has_value());
    auto body = opener->Open(**frame);
    ASSERT_TRUE(body.ok()) << body.status().ToString();
    proto::PeerMessage back;
    ASSERT_TRUE(back.ParseFromString(*body));
    EXPECT_EQ(back.refused().reason(), m.refused().reason());
  }
  EXPECT_EQ(decoder.pending_bytes(), 0u);
  conn->Close(Status::Ok());
}

TEST(SessionKeys, BothEndsDeriveTheSameKeysCrossed) {
  const std::string secret(32, 's'), a(32, 'a'), b(32, 'b');
  auto dialer = auth::DeriveSessionKeys(secret, true, "p", "d", a, b);
  auto acceptor = auth::DeriveSessionKeys(secret, false, "d", "p", b, a);
  EXPECT_EQ(dialer.send, acceptor.receive);
  EXPECT_EQ(dialer.receive, acceptor.send);
  EXPECT_NE(dialer.send, dialer.receive);
  EXPECT_EQ(dialer.send.size(), 32u);
}

}  // namespace
}  // namespace kv::daemon
