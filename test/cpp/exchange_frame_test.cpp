#include "exchange/frame.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "error.h"

namespace {

using emugpu::Frame;
using emugpu::FrameKind;
using emugpu::FrameParser;

TEST(FrameParser, ReassemblesFramesFedOneByteAtATime) {
  const int64_t words[3] = {1, -2, 1ll << 40};
  std::vector<uint8_t> wire = emugpu::encode_frame(FrameKind::kWords, 9, words, sizeof(words));
  const auto second = emugpu::encode_frame(FrameKind::kMessage, 3, "hi", 2);
  wire.insert(wire.end(), second.begin(), second.end());
  FrameParser parser("rank 1");
  std::vector<Frame> frames;
  for (uint8_t b : wire) {
    parser.feed(&b, 1);
    Frame f;
    while (parser.next(f)) frames.push_back(f);
  }
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[0].kind, FrameKind::kWords);
  EXPECT_EQ(frames[0].key, 9u);
  EXPECT_EQ(emugpu::decode_words(frames[0], 3), (std::vector<int64_t>{1, -2, 1ll << 40}));
  EXPECT_EQ(frames[1].kind, FrameKind::kMessage);
  EXPECT_EQ(std::string(frames[1].payload.begin(), frames[1].payload.end()), "hi");
  EXPECT_EQ(parser.pending(), 0u);
}

TEST(FrameParser, HelloRoundTrips) {
  const auto wire = emugpu::encode_hello({emugpu::Hello::kVersion, 3, 8, 0xabcdefull});
  FrameParser parser("peer");
  parser.feed(wire.data(), wire.size());
  Frame f;
  ASSERT_TRUE(parser.next(f));
  const emugpu::Hello h = emugpu::decode_hello(f);
  EXPECT_EQ(h.rank, 3);
  EXPECT_EQ(h.size, 8);
  EXPECT_EQ(h.token, 0xabcdefull);
}

TEST(FrameParser, GarbageNamesThePeer) {
  FrameParser parser("127.0.0.1:4711");
  const std::string text = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  try {
    parser.feed(reinterpret_cast<const uint8_t*>(text.data()), text.size());
    FAIL() << "garbage accepted";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:4711"), std::string::npos) << e.what();
  }
}

TEST(FrameParser, RejectsUnknownKindsAndHugeLengthsWithoutAllocating) {
  auto wire = emugpu::encode_frame(FrameKind::kBytes, 0, nullptr, 0);
  wire[4] = 9;
  FrameParser unknown("peer");
  EXPECT_THROW(unknown.feed(wire.data(), wire.size()), emugpu::Error);
  wire[4] = static_cast<uint8_t>(FrameKind::kBytes);
  const uint64_t huge = emugpu::kMaxFramePayload + 1;
  std::memcpy(wire.data() + 16, &huge, 8);
  FrameParser big("peer");
  EXPECT_THROW(big.feed(wire.data(), wire.size()), emugpu::Error);
}

TEST(FrameParser, ATruncatedFrameStaysPending) {
  const auto wire = emugpu::encode_frame(FrameKind::kBytes, 1, "abcdef", 6);
  FrameParser parser("peer");
  parser.feed(wire.data(), wire.size() - 2);
  Frame f;
  EXPECT_FALSE(parser.next(f));
  EXPECT_EQ(parser.pending(), wire.size() - 2);
}

TEST(FrameParser, WordsOfTheWrongLengthAreRefused) {
  const int64_t words[2] = {1, 2};
  const auto wire = emugpu::encode_frame(FrameKind::kWords, 0, words, sizeof(words));
  FrameParser parser("peer");
  parser.feed(wire.data(), wire.size());
  Frame f;
  ASSERT_TRUE(parser.next(f));
  EXPECT_THROW(emugpu::decode_words(f, 3), emugpu::Error);
  EXPECT_THROW(emugpu::decode_hello(f), emugpu::Error);
}

}  // namespace

TEST(FrameParser, ALargePayloadIsReadStraightIntoItsFrame) {
  std::vector<uint8_t> payload(3 << 20);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  const auto wire = emugpu::encode_frame(FrameKind::kBytes, 5, payload.data(), payload.size());
  const auto small = emugpu::encode_frame(FrameKind::kMessage, 6, "xy", 2);
  std::vector<uint8_t> stream(wire);
  stream.insert(stream.end(), small.begin(), small.end());
  FrameParser parser("peer");
  size_t fed = 0;
  const uint8_t* direct = nullptr;  // the first payload space handed out
  size_t direct_offset = 0;
  size_t read = 1000;  // socket reads of varying sizes
  while (fed < stream.size()) {
    const auto into = parser.prepare();
    const size_t n = std::min({read, into.size(), stream.size() - fed});
    if (direct == nullptr && into.size() > 64 * 1024) {
      direct = into.data();
      direct_offset = fed - emugpu::kFrameHeaderBytes;
    }
    std::memcpy(into.data(), stream.data() + fed, n);
    parser.commit(n);
    fed += n;
    read = read * 3 + 17;
  }
  Frame f;
  ASSERT_TRUE(parser.next(f));
  EXPECT_EQ(f.key, 5u);
  EXPECT_TRUE(std::equal(f.payload.begin(), f.payload.end(), payload.begin(), payload.end()));
  ASSERT_NE(direct, nullptr);
  EXPECT_EQ(f.payload.data() + direct_offset, direct);  // no copy after the read
  ASSERT_TRUE(parser.next(f));
  EXPECT_EQ(f.kind, FrameKind::kMessage);
  EXPECT_EQ(std::string(f.payload.begin(), f.payload.end()), "xy");
  EXPECT_FALSE(parser.next(f));
  EXPECT_EQ(parser.pending(), 0u);
}

TEST(FrameParser, AnAnnouncedPayloadIsAllocatedOnlyAsFarAsItsBytesCome) {
  auto wire = emugpu::encode_frame(FrameKind::kBytes, 0, nullptr, 0);
  const uint64_t claimed = uint64_t{1} << 39;  // within kMaxFramePayload, far beyond this machine
  std::memcpy(wire.data() + 16, &claimed, 8);
  FrameParser parser("peer");
  parser.feed(wire.data(), wire.size());
  const auto into = parser.prepare();
  EXPECT_EQ(into.size(), emugpu::kEagerPayload);
  EXPECT_EQ(parser.pending(), emugpu::kFrameHeaderBytes);
}
