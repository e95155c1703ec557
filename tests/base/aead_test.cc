// The AEAD of kvd's sealed channels (base/aead.h) and its frames (base/frame_seal.h, and the
// framed socket's EnableSealing/EnableOpening): AES-256-GCM as published, a round trip, every
// alteration refused (ciphertext, tag, associated data, number, key), frames that do not open in
// order (replayed, reordered, dropped, from the other direction) refused and the stream with
// them, and frame numbers that are never reused: a spent direction refuses instead of wrapping.
#include "base/aead.h"

#include <sys/socket.h>

#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "base/frame_seal.h"
#include "base/framed_socket.h"
#include "base/framing.h"
#include "tests/support/socket_pair.h"

namespace kv {
namespace {

using crypto::Aead;

const std::string kKey(32, 'k');
const std::string kOtherKey(32, 'K');
constexpr uint64_t kLast = std::numeric_limits<uint64_t>::max() - 1;  // the last usable number

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

Aead Make(const std::string& key = kKey) {
  auto aead = Aead::Create(key);
  EXPECT_TRUE(aead.ok()) << aead.status().ToString();
  return std::move(aead).value();
}

// McGrew and Viega's GCM test cases 13 and 14 (AES-256, zero key, zero 96-bit IV, no associated
// data): the number 0 is the all-zero nonce, so these are AES-256-GCM exactly as published.
TEST(Aead, MatchesThePublishedAes256GcmVectors) {
  Aead aead = Make(std::string(32, '\0'));
  std::string empty;
  ASSERT_TRUE(aead.Seal(0, "", "", &empty).ok());
  EXPECT_EQ(Hex(empty), "530f8afbc74536b9a963b4f1c4cb738b");
  std::string block;
  ASSERT_TRUE(aead.Seal(0, "", std::string(16, '\0'), &block).ok());
  EXPECT_EQ(Hex(block),
            "cea7403d4d606b6e074ec5d3baf39d18"
            "d0d1c8a799996bf0265b98b5d48ab919");
}

TEST(Aead, RoundTripHidesThePlaintextAndAppends) {
  Aead sealer = Make();
  Aead opener = Make();
  const std::string message = "transfer token 0123456789abcdef for request req-42";
  std::string out = "prefix";
  ASSERT_TRUE(sealer.Seal(7, "header", message, &out).ok());
  ASSERT_EQ(out.size(), 6 + message.size() + crypto::kAeadTagBytes);
  EXPECT_EQ(out.substr(0, 6), "prefix");
  const std::string sealed = out.substr(6);
  EXPECT_EQ(sealed.find("token"), std::string::npos);
  EXPECT_EQ(sealed.find("req-42"), std::string::npos);
  auto opened = opener.Open(7, "header", sealed);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(*opened, message);
  // The same message under another number seals differently (the nonce).
  std::string again;
  ASSERT_TRUE(sealer.Seal(8, "header", message, &again).ok());
  EXPECT_NE(again, sealed);
  // An empty message is only a tag, and still opens.
  std::string tag_only;
  ASSERT_TRUE(sealer.Seal(9, "", "", &tag_only).ok());
  EXPECT_EQ(tag_only.size(), crypto::kAeadTagBytes);
  auto nothing = opener.Open(9, "", tag_only);
  ASSERT_TRUE(nothing.ok()) << nothing.status().ToString();
  EXPECT_EQ(*nothing, "");
}

TEST(Aead, EveryAlterationIsRefused) {
  Aead sealer = Make();
  Aead opener = Make();
  const std::string message = "layouts, request ids and tokens";
  std::string sealed;
  ASSERT_TRUE(sealer.Seal(3, "ad", message, &sealed).ok());
  for (size_t bit = 0; bit < sealed.size() * 8; bit += 7) {  // ciphertext and tag
    std::string flipped = sealed;
    flipped[bit / 8] = static_cast<char>(flipped[bit / 8] ^ (1 << (bit % 8)));
    auto opened = opener.Open(3, "ad", flipped);
    EXPECT_FALSE(opened.ok()) << "bit " << bit;
    if (!opened.ok()) {
      EXPECT_EQ(opened.status().code(), Code::kInvalidArgument);
    }
  }
  EXPECT_FALSE(opener.Open(3, "aD", sealed).ok());                               // associated data
  EXPECT_FALSE(opener.Open(4, "ad", sealed).ok());                               // another number
  EXPECT_FALSE(opener.Open(3, "ad", sealed.substr(0, sealed.size() - 1)).ok());  // truncated
  EXPECT_FALSE(opener.Open(3, "ad", sealed.substr(0, 5)).ok());  // shorter than a tag
  Aead stranger = Make(kOtherKey);
  EXPECT_FALSE(stranger.Open(3, "ad", sealed).ok());
  // The untouched message still opens: a refusal leaves the context usable.
  auto opened = opener.Open(3, "ad", sealed);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(*opened, message);
}

TEST(Aead, OnlyA32ByteKeyIsTaken) {
  EXPECT_EQ(Aead::Create(std::string(16, 'k')).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Aead::Create("").status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Aead::Create(kKey).ok());
}

// ---- frames -------------------------------------------------------------------------------

std::vector<std::string> Bodies(const std::string& wire) {
  FrameDecoder decoder;
  decoder.Append(wire.data(), wire.size());
  std::vector<std::string> bodies;
  while (true) {
    auto frame = decoder.Next();
    EXPECT_TRUE(frame.ok());
    if (!frame.ok() || !frame->has_value()) return bodies;
    bodies.push_back(std::move(**frame));
  }
}

struct SealedFrames {
  std::string wire;
  std::vector<std::string> bodies;  // as FrameDecoder hands them out
};

SealedFrames Seal(const std::vector<std::string>& messages, uint64_t first = 0) {
  auto sealer = FrameSealer::Create(kKey, first);
  EXPECT_TRUE(sealer.ok());
  SealedFrames out;
  for (const std::string& m : messages) {
    EXPECT_TRUE(sealer->Append(m, &out.wire, kDefaultMaxFrameBytes).ok());
  }
  out.bodies = Bodies(out.wire);
  return out;
}

TEST(FrameSeal, FramesOpenInOrderAndTheHeaderIsAuthenticated) {
  const SealedFrames frames = Seal({"hello", "", "want r1 token t1"});
  ASSERT_EQ(frames.bodies.size(), 3u);
  EXPECT_EQ(frames.bodies[0].size(), 5 + kSealOverheadBytes);
  EXPECT_EQ(frames.wire.find("want"), std::string::npos);
  auto opener = FrameOpener::Create(kKey);
  ASSERT_TRUE(opener.ok());
  for (const char* expected : {"hello", "", "want r1 token t1"}) {
    auto m = opener->Open(frames.bodies[opener->next()]);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(*m, expected);
  }
  // A frame cut short by a relay that also rewrote its length: the header is the associated
  // data, so the shorter body does not open even where its first bytes are intact.
  auto fresh = FrameOpener::Create(kKey);
  ASSERT_TRUE(fresh.ok());
  EXPECT_FALSE(fresh->Open(frames.bodies[2].substr(0, frames.bodies[2].size() - 1)).ok());
}

TEST(FrameSeal, AReplayedReorderedDroppedOrReflectedFrameIsRefusedAndSoIsEverythingAfter) {
  const SealedFrames frames = Seal({"f0", "f1", "f2", "f3"});
  ASSERT_EQ(frames.bodies.size(), 4u);
  struct Case {
    const char* what;
    std::vector<size_t> order;  // frames as the relay delivers them
    size_t open;                // how many open before the refusal
  };
  for (const Case& c : {Case{"replayed", {0, 1, 1, 2}, 2}, Case{"reordered", {0, 2, 1, 3}, 1},
                        Case{"dropped", {0, 2, 3}, 1}, Case{"replay of the first", {0, 0}, 1}}) {
    auto opener = FrameOpener::Create(kKey);
    ASSERT_TRUE(opener.ok());
    size_t opened = 0;
    Status refused;
    for (size_t i : c.order) {
      auto m = opener->Open(frames.bodies[i]);
      if (!m.ok()) {
        refused = m.status();
        break;
      }
      EXPECT_EQ(*m, "f" + std::to_string(i)) << c.what;
      ++opened;
    }
    EXPECT_EQ(opened, c.open) << c.what;
    EXPECT_EQ(refused.code(), Code::kInvalidArgument) << c.what;
    EXPECT_NE(refused.message().find("did not open"), std::string::npos) << refused.ToString();
    // The stream is done: even the frame it expected is refused now.
    EXPECT_FALSE(opener->Open(frames.bodies[opener->next()]).ok()) << c.what;
  }
  // The other direction's key (or another channel's) opens nothing.
  auto other = FrameOpener::Create(kOtherKey);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->Open(frames.bodies[0]).ok());
}

TEST(FrameSeal, NumbersAreNeverReusedASpentDirectionRefusesToWrap) {
  auto sealer = FrameSealer::Create(kKey, kLast);
  ASSERT_TRUE(sealer.ok());
  std::string wire;
  ASSERT_TRUE(sealer->Append("the last frame", &wire, kDefaultMaxFrameBytes).ok());
  const size_t size = wire.size();
  Status spent = sealer->Append("one more", &wire, kDefaultMaxFrameBytes);
  EXPECT_EQ(spent.code(), Code::kResourceExhausted) << spent.ToString();
  EXPECT_EQ(wire.size(), size) << "a refused frame appended bytes";
  EXPECT_EQ(sealer->Append("and more", &wire, kDefaultMaxFrameBytes).code(),
            Code::kResourceExhausted);

  auto opener = FrameOpener::Create(kKey, kLast);
  ASSERT_TRUE(opener.ok());
  const std::vector<std::string> bodies = Bodies(wire);
  ASSERT_EQ(bodies.size(), 1u);
  auto last = opener->Open(bodies[0]);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(*last, "the last frame");
  // Whatever comes next (here the same frame again, or one sealed under number 0 after a wrap)
  // is refused as spent.
  EXPECT_EQ(opener->Open(bodies[0]).status().code(), Code::kResourceExhausted);
  const SealedFrames wrapped = Seal({"after a wrap"});
  EXPECT_FALSE(opener->Open(wrapped.bodies[0]).ok());
}

TEST(FrameSeal, AMessageThatWouldExceedTheLimitOnceSealedIsRefused) {
  auto sealer = FrameSealer::Create(kKey);
  ASSERT_TRUE(sealer.ok());
  std::string wire;
  EXPECT_EQ(sealer->Append(std::string(100 - kSealOverheadBytes + 1, 'x'), &wire, 100).code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(wire.empty());
  EXPECT_EQ(sealer->next(), 0u) << "a refused frame used a number";
  EXPECT_TRUE(sealer->Append(std::string(100 - kSealOverheadBytes, 'x'), &wire, 100).ok());
}

// ---- the framed socket ------------------------------------------------------------------------

SteadyTime Soon() {
  return std::chrono::steady_clock::now() + std::chrono::seconds(5);
}

using testing_support::Drain;
using testing_support::SocketPair;

TEST(SealedSocket, PlaintextHandshakeThenSealedFramesBothWays) {
  auto [a, b] = SocketPair();
  ASSERT_TRUE(a.SendFrame("handshake", Soon()).ok());
  ASSERT_TRUE(a.EnableSealing(kKey).ok());
  ASSERT_TRUE(a.SendFrame("secret one", Soon()).ok());
  ASSERT_TRUE(a.SendFrame("secret two", Soon()).ok());
  FrameReader reader;
  auto first = ReceiveFrame(b.fd(), reader, Soon());
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, "handshake");
  // The sealed frames were read with the handshake frame, before the reader knew the key: they
  // open once it does.
  ASSERT_TRUE(reader.EnableOpening(kKey).ok());
  for (const char* expected : {"secret one", "secret two"}) {
    auto m = ReceiveFrame(b.fd(), reader, Soon());
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_EQ(*m, expected);
  }
}

TEST(SealedSocket, TheWireCarriesNoPlaintextAndATamperedFrameBreaksTheReader) {
  auto [a, relay] = SocketPair();
  ASSERT_TRUE(a.EnableSealing(kKey).ok());
  ASSERT_TRUE(a.SendFrame("token=0123456789abcdef", Soon()).ok());
  ASSERT_TRUE(a.SendFrame("second", Soon()).ok());
  const std::string wire = Drain(relay.fd());
  ASSERT_FALSE(wire.empty());
  EXPECT_EQ(wire.find("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(wire.find("second"), std::string::npos);
  std::vector<std::string> bodies = Bodies(wire);
  ASSERT_EQ(bodies.size(), 2u);

  for (const bool swap : {false, true}) {
    auto [in, out] = SocketPair();  // the relay writes into `in`, the reader reads `out`
    std::string forwarded;
    if (swap) {
      ASSERT_TRUE(AppendFrame(bodies[1], &forwarded).ok());
      ASSERT_TRUE(AppendFrame(bodies[0], &forwarded).ok());
    } else {
      std::string flipped = bodies[0];
      flipped[3] ^= 0x10;
      ASSERT_TRUE(AppendFrame(flipped, &forwarded).ok());
      ASSERT_TRUE(AppendFrame(bodies[1], &forwarded).ok());
    }
    ASSERT_EQ(::send(in.fd(), forwarded.data(), forwarded.size(), 0),
              static_cast<ssize_t>(forwarded.size()));
    FrameReader reader;
    ASSERT_TRUE(reader.EnableOpening(kKey).ok());
    ASSERT_TRUE(WaitReadable(out.fd(), Soon()));
    const Status read = reader.ReadAvailable(out.fd());
    EXPECT_EQ(read.code(), Code::kInvalidArgument) << read.ToString();
    EXPECT_NE(read.message().find("did not open"), std::string::npos) << read.ToString();
    EXPECT_FALSE(reader.Next().has_value()) << "a frame past the tampered one came out";
    EXPECT_FALSE(reader.ReadAvailable(out.fd()).ok()) << "the reader recovered";
  }
}

}  // namespace
}  // namespace kv
