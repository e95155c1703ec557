// Connection: a storm of frames from one socket is delivered in order, kFramesPerTurn at a time,
// with the io loop's other ready handlers run in between; frames read before the other side
// closed are all delivered before the close handler.
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

#include "base/framing.h"
#include "daemon/peer_auth.h"

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

// Security issue 19: after authentication every frame carries a MAC over its number and body.
// Frames with the right MAC in order are delivered without it; an altered frame, or a replay of
// an earlier one, closes the connection with nothing more delivered.
TEST_F(ConnectionTest, MacdFramesAreCheckedAndAReplayOrAlterationCloses) {
  const std::string key(32, 'k');
  for (const bool replay : {false, true}) {
    Pair p;
    auto conn = Connection::Adopt(io, p.ours, ConnectionLimits{}, "mac");
    conn->EnableMac("send-key", key);
    std::string bytes;
    for (uint64_t seq = 0; seq < 2; ++seq) {
      const std::string body = "frame " + std::to_string(seq);
      ASSERT_TRUE(AppendFrame(body + auth::FrameMac(key, seq, body), &bytes).ok());
    }
    std::string bad = "frame 2";
    if (replay) {
      bad = "frame 0" + auth::FrameMac(key, 0, "frame 0");  // an earlier frame, sent again
    } else {
      bad += auth::FrameMac(key, 2, bad);
      bad[0] = 'F';  // altered after it was MAC'd
    }
    ASSERT_TRUE(AppendFrame(bad, &bytes).ok());
    ASSERT_TRUE(AppendFrame("frame 3" + auth::FrameMac(key, 3, "frame 3"), &bytes).ok());
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
    io.run_for(1s);
    EXPECT_TRUE(closed);
    EXPECT_NE(why.message().find("message authentication"), std::string::npos) << why.ToString();
    EXPECT_EQ(got, (std::vector<std::string>{"frame 0", "frame 1"}));
  }
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
