#include "share/protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error.h"
#include "share/address.h"

namespace {

using namespace emugpu::share;

Message parse_one(const std::vector<uint8_t>& bytes) {
  Parser p("test");
  p.feed(bytes.data(), bytes.size());
  Message m;
  EXPECT_TRUE(p.next(m));
  EXPECT_EQ(p.pending(), 0u);
  return m;
}

TEST(ShareProtocol, EveryMessageRoundTrips) {
  const Hello hello{4711, "virtual", "python train.py --epochs 3", -7};
  const Hello h = decode_hello(parse_one(encode_hello(7, hello)));
  EXPECT_EQ(h.pid, 4711);
  EXPECT_EQ(h.priority, -7);
  EXPECT_EQ(h.clock, "virtual");
  EXPECT_EQ(h.name, hello.name);

  const Welcome w = decode_welcome(parse_one(
      encode_welcome(7, {3,
                         {{"NVIDIA H100", 10, 20, 0, -1, "", ""}, {"NVIDIA H100", 10, 20, 1, 2, "3g.40gb", "MIG-abc"}},
                         "fifo",
                         2000,
                         5000,
                         77})));
  EXPECT_EQ(w.client, 3u);
  EXPECT_EQ(w.sharing, "fifo");
  EXPECT_EQ(w.report_ns, 2000);
  EXPECT_EQ(w.window_ns, 5000);
  EXPECT_EQ(w.now_ns, 77);
  ASSERT_EQ(w.gpus.size(), 2u);
  EXPECT_EQ(w.gpus[1].name, "NVIDIA H100");
  EXPECT_EQ(w.gpus[1].capacity, 10u);
  EXPECT_EQ(w.gpus[1].total, 20u);
  EXPECT_EQ(w.gpus[0].instance, -1);
  EXPECT_EQ(w.gpus[1].gpu, 1);
  EXPECT_EQ(w.gpus[1].instance, 2);
  EXPECT_EQ(w.gpus[1].mig_profile, "3g.40gb");
  EXPECT_EQ(w.gpus[1].uuid, "MIG-abc");

  const Message reserve = parse_one(encode_bytes(MessageType::kReserve, 9, {1, 2u << 20}));
  EXPECT_EQ(reserve.id, 9u);
  EXPECT_EQ(decode_bytes(reserve).gpu, 1u);
  EXPECT_EQ(decode_bytes(reserve).bytes, 2u << 20);

  const Refused r = decode_refused(parse_one(encode_refused(1, {100, 90, 30})));
  EXPECT_EQ(r.capacity, 100u);
  EXPECT_EQ(r.used, 90u);
  EXPECT_EQ(r.mine, 30u);

  Status s;
  s.sharing = "time-slice";
  s.gpus = {{"g", 100, 120, 0, -1, "", ""}};
  s.used = {40};
  s.clients = {{1, 11, "real", "a", {15}, 0, {kPpm}, {kPpm / 2}}, {2, 12, "real", "b", {25}, 3, {250}, {kPpm}}};
  const Status back = decode_status(parse_one(encode_status(5, s)));
  ASSERT_EQ(back.clients.size(), 2u);
  EXPECT_EQ(back.sharing, "time-slice");
  EXPECT_EQ(back.used[0], 40u);
  EXPECT_EQ(back.clients[1].pid, 12);
  EXPECT_EQ(back.clients[1].bytes[0], 25u);
  EXPECT_EQ(back.clients[1].priority, 3);
  EXPECT_EQ(back.clients[1].busy_ppm[0], 250u);
  EXPECT_EQ(back.clients[0].rate_ppm[0], kPpm / 2);

  const ShareReport report =
      decode_share(parse_one(encode_share(8, {1, 500000, 123456, 987654321, 987654400, 420000, 35000})));
  EXPECT_EQ(report.gpu, 1u);
  EXPECT_EQ(report.busy_until_ns, 987654400);
  EXPECT_EQ(report.demand_ppm, 420000u);
  EXPECT_EQ(report.hold_ns, 35000);
  EXPECT_EQ(report.busy_ppm, 500000u);
  EXPECT_EQ(report.iteration_ns, 123456);
  EXPECT_EQ(report.now_ns, 987654321);
  EXPECT_EQ(report.bins[0].fraction_ppm, 0u);  // none sent
  ShareReport binned{0, kPpm, 1, 2, 3, 500000, 40, {}};
  binned.bins[0] = {250000, 100000, 1000, 20000};
  binned.bins[3] = {600000, 990000, 90000, 400000};
  binned.bins[7] = {150000, 300000, 5000, 30000, 850000};
  const ShareReport bins_back = decode_share(parse_one(encode_share(9, binned)));
  EXPECT_EQ(bins_back.bins[0].fraction_ppm, 250000u);
  EXPECT_EQ(bins_back.bins[0].kernel_ns, 20000);
  EXPECT_EQ(bins_back.bins[3].demand_ppm, 990000u);
  EXPECT_EQ(bins_back.bins[3].hold_ns, 90000);
  EXPECT_EQ(bins_back.bins[7].bandwidth_ppm, 850000u);
  EXPECT_EQ(bins_back.bins[7].demand_ppm, 300000u);
  EXPECT_EQ(bins_back.bins[1].fraction_ppm, 0u);
  const ShareGrant grant = decode_share_reply(parse_one(encode_share_reply(8, {kPpm / 3, 2, 1234})));
  EXPECT_EQ(grant.rate_ppm, kPpm / 3);
  EXPECT_EQ(grant.sharers, 2u);
  EXPECT_EQ(grant.lowest_now, 1234);

  EXPECT_EQ(decode_error(parse_one(encode_error(2, "no"))), "no");
}

TEST(ShareProtocol, FractionsAboveOneAndZeroSharesAreRefused) {
  EXPECT_THROW(decode_share(parse_one(encode_share(1, {0, kPpm + 1, 0, 0}))), emugpu::Error);
  EXPECT_THROW(decode_share(parse_one(encode_share(1, {0, 0, -5, 0}))), emugpu::Error);
  EXPECT_THROW(decode_share(parse_one(encode_share(1, {0, 0, 0, 0, 0, kPpm + 1, 0}))), emugpu::Error);
  EXPECT_THROW(decode_share(parse_one(encode_share(1, {0, 0, 0, 0, 0, kPpm, -1}))), emugpu::Error);
  ShareReport bins{};
  bins.bins[0].fraction_ppm = bins.bins[1].fraction_ppm = kPpm / 2 + 10;  // more than all of its kernel time
  EXPECT_THROW(decode_share(parse_one(encode_share(1, bins))), emugpu::Error);
  bins.bins[1] = {};
  bins.bins[2].hold_ns = -1;
  EXPECT_THROW(decode_share(parse_one(encode_share(1, bins))), emugpu::Error);
  bins.bins[2] = {0, kPpm + 1, 0, 0};
  EXPECT_THROW(decode_share(parse_one(encode_share(1, bins))), emugpu::Error);
  bins.bins[2] = {0, 0, 0, 0, kPpm + 1};  // more than the peak bandwidth
  EXPECT_THROW(decode_share(parse_one(encode_share(1, bins))), emugpu::Error);
  EXPECT_THROW(decode_share_reply(parse_one(encode_share_reply(1, {0, 0, 0}))), emugpu::Error);
  EXPECT_THROW(decode_share_reply(parse_one(encode_share_reply(1, {kPpm + 1, 0, 0}))), emugpu::Error);
  EXPECT_THROW(decode_welcome(parse_one(encode_welcome(1, {1, {{"g", 1, 1, 0, -1, "", ""}}, "fair", 0, 1, 0}))),
               emugpu::Error);
}

TEST(ShareProtocol, DeviceIndicesOutOfRangeAreRefused) {
  const auto welcome = [](int32_t gpu, int32_t instance) {
    return parse_one(encode_welcome(1, {1, {{"g", 1, 1, gpu, instance, "", ""}}, "fair", 1, 1, 0}));
  };
  EXPECT_NO_THROW(decode_welcome(welcome(3, 6)));
  EXPECT_THROW(decode_welcome(welcome(-1, -1)), emugpu::Error);
  EXPECT_THROW(decode_welcome(welcome(0, -2)), emugpu::Error);
  EXPECT_THROW(decode_welcome(welcome(static_cast<int32_t>(kMaxGpus), -1)), emugpu::Error);
}

TEST(ShareProtocol, MessagesSplitAnywhereArriveWhole) {
  std::vector<uint8_t> stream = encode_hello(1, {1, "real", "x"});
  const auto second = encode_bytes(MessageType::kReserve, 2, {0, 4096});
  stream.insert(stream.end(), second.begin(), second.end());
  Parser p("test");
  std::vector<Message> got;
  for (uint8_t byte : stream) {
    p.feed(&byte, 1);
    Message m;
    while (p.next(m)) got.push_back(m);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type, MessageType::kHello);
  EXPECT_EQ(got[1].id, 2u);
  EXPECT_EQ(p.pending(), 0u);
}

TEST(ShareProtocol, ABadHeaderIsRefusedNamingThePeer) {
  const auto expect_refused = [](std::vector<uint8_t> bytes, const std::string& words) {
    Parser p("client 4");
    try {
      p.feed(bytes.data(), bytes.size());
      FAIL() << "accepted: " << words;
    } catch (const emugpu::Error& e) {
      EXPECT_NE(std::string(e.what()).find("client 4"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  std::vector<uint8_t> good = encode(MessageType::kStatus, 1);
  auto bad = good;
  bad[0] ^= 0xFF;
  expect_refused(bad, "not a message");
  bad = good;
  bad[4] = 9;
  expect_refused(bad, "version 9");
  bad = good;
  bad[6] = 99;
  expect_refused(bad, "unknown type 99");
  bad = good;
  bad[15] = 0x7F;  // a length of about 2 GB
  expect_refused(bad, "over the limit");
}

TEST(ShareProtocol, TruncatedOrPaddedPayloadsAreRefused) {
  Message m = parse_one(encode_hello(1, {1, "real", "name"}));
  Message cut = m;
  cut.payload.resize(cut.payload.size() - 2);
  EXPECT_THROW(decode_hello(cut), emugpu::Error);
  Message padded = m;
  padded.payload.push_back(0);
  EXPECT_THROW(decode_hello(padded), emugpu::Error);
  Message huge_string = m;
  huge_string.payload[8] = 0xFF;  // the clock's length: 255 + ... bytes, beyond what is there
  huge_string.payload[9] = 0xFF;
  EXPECT_THROW(decode_hello(huge_string), emugpu::Error);
  EXPECT_THROW(decode_welcome(m), emugpu::Error);  // the wrong type
}

TEST(ShareAddress, UnixAndTcpFormsAndTheirErrors) {
  EXPECT_EQ(parse_address("unix:/run/x.sock", "s").path, "/run/x.sock");
  EXPECT_EQ(parse_address("/tmp/y.sock", "s").text(), "unix:/tmp/y.sock");
  const Address t = parse_address("tcp:127.0.0.1:7000", "s");
  EXPECT_EQ(t.kind, Address::Kind::kTcp);
  EXPECT_EQ(t.host, "127.0.0.1");
  EXPECT_EQ(t.port, 7000);
  EXPECT_EQ(parse_address("tcp:[::1]:7", "s").host, "::1");
  for (const char* bad : {"tcp:host", "tcp::80", "tcp:h:99999", "tcp:h:x", "unix:", ""}) {
    try {
      parse_address(bad, "EMUGPU_DAEMON");
      ADD_FAILURE() << "accepted " << bad;
    } catch (const emugpu::Error& e) {
      EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
      EXPECT_NE(std::string(e.what()).find("EMUGPU_DAEMON"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("tcp:HOST:PORT"), std::string::npos);
    }
  }
  EXPECT_THROW(parse_address("unix:/" + std::string(200, 'x'), "s"), emugpu::Error);
}

}  // namespace
