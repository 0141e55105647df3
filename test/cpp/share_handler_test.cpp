#include "daemon/handler.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error.h"

namespace {

using namespace emugpu::share;

constexpr uint64_t kMiB = 1 << 20;

Message as_message(const std::vector<uint8_t>& bytes) {
  Parser p("test");
  p.feed(bytes.data(), bytes.size());
  Message m;
  EXPECT_TRUE(p.next(m));
  return m;
}

class ShareHandler : public ::testing::Test {
 protected:
  Handler handler{
      {{"NVIDIA H100", 100 * kMiB, 110 * kMiB, 0, -1, "", ""}, {"NVIDIA H100", 100 * kMiB, 110 * kMiB, 0, -1, "", ""}}};

  uint64_t attach(int64_t pid, const std::string& clock = "real") {
    const uint64_t id = handler.connect();
    const Message reply = as_message(handler.handle(id, as_message(encode_hello(1, {pid, clock, "job"}))));
    EXPECT_EQ(reply.type, MessageType::kWelcome);
    return id;
  }
  Message reserve(uint64_t client, uint32_t gpu, uint64_t bytes) {
    return as_message(handler.handle(client, as_message(encode_bytes(MessageType::kReserve, 2, {gpu, bytes}))));
  }
  Message release(uint64_t client, uint32_t gpu, uint64_t bytes) {
    return as_message(handler.handle(client, as_message(encode_bytes(MessageType::kRelease, 3, {gpu, bytes}))));
  }
};

TEST_F(ShareHandler, ProcessesShareEachGpusCapacity) {
  const uint64_t a = attach(1), b = attach(2);
  EXPECT_EQ(reserve(a, 0, 60 * kMiB).type, MessageType::kGranted);
  const Message refused = reserve(b, 0, 50 * kMiB);
  ASSERT_EQ(refused.type, MessageType::kRefused);
  const Refused r = decode_refused(refused);
  EXPECT_EQ(r.capacity, 100 * kMiB);
  EXPECT_EQ(r.used, 60 * kMiB);
  EXPECT_EQ(r.mine, 0u);
  EXPECT_EQ(reserve(b, 0, 40 * kMiB).type, MessageType::kGranted);   // exactly what is left
  EXPECT_EQ(reserve(b, 1, 100 * kMiB).type, MessageType::kGranted);  // the other GPU is its own
  EXPECT_EQ(handler.status().used, (std::vector<uint64_t>{100 * kMiB, 100 * kMiB}));
  EXPECT_EQ(release(a, 0, 20 * kMiB).type, MessageType::kReleased);
  EXPECT_EQ(reserve(b, 0, 20 * kMiB).type, MessageType::kGranted);
}

TEST_F(ShareHandler, AClientThatGoesReleasesWhatItHeld) {
  const uint64_t a = attach(1), b = attach(2);
  ASSERT_EQ(reserve(a, 0, 90 * kMiB).type, MessageType::kGranted);
  ASSERT_EQ(reserve(a, 1, 10 * kMiB).type, MessageType::kGranted);
  handler.disconnect(a);
  EXPECT_EQ(handler.status().used, (std::vector<uint64_t>{0, 0}));
  EXPECT_EQ(handler.status().clients.size(), 1u);
  EXPECT_EQ(reserve(b, 0, 100 * kMiB).type, MessageType::kGranted);
}

TEST_F(ShareHandler, RequestsItCannotServeAreAnsweredWithAnError) {
  const uint64_t a = attach(1);
  ASSERT_EQ(reserve(a, 0, 10 * kMiB).type, MessageType::kGranted);
  const Message over = release(a, 0, 11 * kMiB);
  ASSERT_EQ(over.type, MessageType::kError);
  EXPECT_NE(decode_error(over).find("more than this process holds"), std::string::npos);
  const Message gpu = reserve(a, 7, kMiB);
  ASSERT_EQ(gpu.type, MessageType::kError);
  EXPECT_NE(decode_error(gpu).find("below 2"), std::string::npos);
  EXPECT_EQ(handler.status().used[0], 10 * kMiB);                    // nothing changed
  EXPECT_EQ(reserve(a, 0, 200 * kMiB).type, MessageType::kRefused);  // beyond the capacity, however large
  EXPECT_EQ(reserve(a, 0, ~uint64_t{0}).type, MessageType::kRefused);
}

TEST_F(ShareHandler, MessagesNoClientSendsDropTheConnection) {
  const uint64_t fresh = handler.connect();
  EXPECT_THROW(reserve(fresh, 0, kMiB), emugpu::Error);  // before hello
  const uint64_t a = attach(1);
  EXPECT_THROW(handler.handle(a, as_message(encode_hello(1, {1, "real", "again"}))), emugpu::Error);
  EXPECT_THROW(handler.handle(a, as_message(encode(MessageType::kGranted, 1))), emugpu::Error);
}

TEST_F(ShareHandler, AProcessOnAnotherClockIsRefusedNamingBoth) {
  attach(10, "virtual");
  const uint64_t id = handler.connect();
  const Message reply = as_message(handler.handle(id, as_message(encode_hello(1, {20, "real", "job"}))));
  ASSERT_EQ(reply.type, MessageType::kError);
  const std::string text = decode_error(reply);
  EXPECT_NE(text.find("runs the real clock"), std::string::npos) << text;
  EXPECT_NE(text.find("process 10"), std::string::npos) << text;
  EXPECT_NE(text.find("virtual"), std::string::npos) << text;
  EXPECT_EQ(handler.attached(), 1u);
}

TEST_F(ShareHandler, StatusListsAttachedProcessesAndNeedsNoHello) {
  const uint64_t a = attach(1);
  ASSERT_EQ(reserve(a, 1, 30 * kMiB).type, MessageType::kGranted);
  const uint64_t observer = handler.connect();
  const Status s = decode_status(as_message(handler.handle(observer, as_message(encode(MessageType::kStatus, 4)))));
  ASSERT_EQ(s.clients.size(), 1u);
  EXPECT_EQ(s.clients[0].pid, 1);
  EXPECT_EQ(s.clients[0].bytes, (std::vector<uint64_t>{0, 30 * kMiB}));
  EXPECT_EQ(s.gpus.size(), 2u);
}

}  // namespace

namespace {

class ShareHandlerTime : public ::testing::Test {
 protected:
  emugpu::TimeNs real = 1'000'000'000;
  Handler handler{{{"NVIDIA H100", 100 * kMiB, 110 * kMiB, 0, -1, "", ""}}, SharingConfig{}, [this] { return real; }};

  uint64_t attach(int64_t pid) {
    const uint64_t id = handler.connect();
    const Message reply = as_message(handler.handle(id, as_message(encode_hello(1, {pid, "virtual", "job", 0}))));
    EXPECT_EQ(reply.type, MessageType::kWelcome);
    return id;
  }
  ShareGrant share(uint64_t client, double busy, emugpu::TimeNs now = 0, emugpu::TimeNs busy_until = 0) {
    const auto ppm = static_cast<uint32_t>(busy * kPpm);
    const Message m = as_message(handler.handle(client, as_message(encode_share(4, {0, ppm, 1000, now, busy_until}))));
    EXPECT_EQ(m.type, MessageType::kShareReply);
    return decode_share_reply(m);
  }
};

TEST_F(ShareHandlerTime, BusyProcessesGetTheirPolicysShare) {
  const uint64_t a = attach(1), b = attach(2);
  const ShareGrant alone = share(a, 1.0);
  EXPECT_EQ(alone.rate_ppm, kPpm);
  EXPECT_EQ(alone.sharers, 0u);
  const ShareGrant second = share(b, 1.0);
  EXPECT_EQ(second.sharers, 1u);
  const SharingConfig config;
  const double slice = static_cast<double>(config.slice_ns);
  EXPECT_NEAR(second.rate_ppm, kPpm * (slice / (slice + static_cast<double>(config.switch_ns))) / 2, 1.0);
  EXPECT_EQ(share(a, 1.0).rate_ppm, second.rate_ppm);
  const Status s = handler.status();
  EXPECT_EQ(s.sharing, "time-slice");
  ASSERT_EQ(s.clients.size(), 2u);
  EXPECT_EQ(s.clients[0].busy_ppm[0], kPpm);
  EXPECT_EQ(s.clients[0].rate_ppm[0], second.rate_ppm);
}

TEST_F(ShareHandlerTime, AProcessThatWentQuietOrAwayNoLongerCounts) {
  const uint64_t a = attach(1), b = attach(2), c = attach(3);
  share(a, 1.0);
  share(b, 1.0);
  real += 6'000'000'000;  // b and a stop reporting: past the staleness limit
  EXPECT_EQ(share(c, 1.0).rate_ppm, kPpm);
  share(a, 1.0);
  handler.disconnect(a);
  EXPECT_EQ(share(c, 1.0).sharers, 0u);
}

TEST_F(ShareHandlerTime, ProcessesLearnTheEarliestClockOfTheOthers) {
  const uint64_t a = attach(1), b = attach(2);
  EXPECT_EQ(share(a, 1.0, 500).lowest_now, kNoTime);  // nobody else reported
  EXPECT_EQ(share(b, 0.0, 900).lowest_now, 500);      // an idle process's clock counts too
  EXPECT_EQ(share(a, 1.0, 700).lowest_now, 900);
  // A newcomer joins at the earliest of the live ones.
  const uint64_t c = handler.connect();
  const Message w = as_message(handler.handle(c, as_message(encode_hello(1, {3, "virtual", "late", 0}))));
  EXPECT_EQ(decode_welcome(w).now_ns, 700);
  real += 6'000'000'000;  // everyone went quiet
  const uint64_t d = handler.connect();
  const Message w2 = as_message(handler.handle(d, as_message(encode_hello(1, {4, "virtual", "later", 0}))));
  EXPECT_EQ(decode_welcome(w2).now_ns, 0);
}

TEST_F(ShareHandlerTime, AClockThatStoppedMovingNoLongerPacesTheOthers) {
  const uint64_t a = attach(1), b = attach(2), c = attach(3);
  const emugpu::TimeNs ahead = SharingConfig{}.window_ns / 5 + 1'000;  // far enough ahead that c waits
  share(a, 1.0, 100);
  share(b, 1.0, 300);
  EXPECT_EQ(share(c, 1.0, 100 + ahead).lowest_now, 100);  // c waits for a from here on
  real += SharingConfig{}.patience_ns + 1;                // a does not move (finishing, or blocked elsewhere)
  share(a, 1.0, 100);
  share(b, 1.0, 400);
  EXPECT_EQ(share(c, 1.0, 100 + ahead).lowest_now, 400);  // b still paces c
  share(a, 1.0, 150);                                     // a moves again
  EXPECT_EQ(share(c, 1.0, 100 + ahead).lowest_now, 150);
}

TEST_F(ShareHandlerTime, PatienceCountsFromTheFirstWaitNotFromTheLastMove) {
  // Both sat blocked outside the emulator (on their input) for longer than the
  // patience, and than a report stays fresh; the first to resume runs ahead
  // and must still wait for the other.
  const uint64_t a = attach(1), b = attach(2);
  const emugpu::TimeNs ahead = SharingConfig{}.window_ns / 5 + 1'000;
  share(a, 1.0, 1000);
  share(b, 1.0, 1000);
  real += 10 * SharingConfig{}.patience_ns;
  EXPECT_EQ(share(a, 1.0, 1000 + ahead).lowest_now, 1000);  // b is waited for
  real += SharingConfig{}.patience_ns / 2;
  EXPECT_EQ(share(a, 1.0, 1000 + ahead).lowest_now, 1000);  // still, within the patience
  real += SharingConfig{}.patience_ns;
  EXPECT_EQ(share(a, 1.0, 1000 + ahead).lowest_now, kNoTime);  // b never resumed: given up
  share(b, 1.0, 2000);                                         // b resumed after all
  EXPECT_EQ(share(a, 1.0, 1000 + ahead).lowest_now, 2000);
}

TEST_F(ShareHandlerTime, AProcessCountsOnlyWhileItsWorkMayStillRun) {
  const uint64_t a = attach(1), b = attach(2);
  const emugpu::TimeNs grace = SharingConfig{}.window_ns / 5;
  share(a, 1.0, 1000, 5000);  // busy until 5000
  EXPECT_EQ(share(b, 1.0, 4000).sharers, 1u);
  EXPECT_EQ(share(b, 1.0, 5000 + grace).sharers, 1u);
  EXPECT_EQ(share(b, 1.0, 5001 + grace).sharers, 0u);       // a went quiet: its queue ended long ago
  EXPECT_EQ(share(b, 1.0, 5001 + grace).lowest_now, 1000);  // yet its clock still paces b
}

TEST_F(ShareHandlerTime, AProcessAWindowAheadHasNoWorkAtThisOnesTimeYet) {
  const uint64_t a = attach(1), b = attach(2);
  const emugpu::TimeNs window = SharingConfig{}.window_ns;
  share(b, 1.0, 10 * window, 10 * window);  // joined at a later time, waiting for a's clock
  EXPECT_EQ(share(a, 1.0, 8 * window).sharers, 0u);
  EXPECT_EQ(share(a, 1.0, 8 * window).lowest_now, 10 * window);
  EXPECT_EQ(share(a, 1.0, 9 * window).sharers, 1u);  // within a window: its busy fraction covers a's time
  share(a, 1.0, 10 * window - window / 5);           // a caught up: b counts it too
  EXPECT_EQ(share(b, 1.0, 10 * window).sharers, 1u);
}

TEST_F(ShareHandlerTime, ReportsOfUnknownGpusOrBeforeHelloAreRefused) {
  const uint64_t a = attach(1);
  const Message wrong = as_message(handler.handle(a, as_message(encode_share(5, {3, 0, 0, 0}))));
  ASSERT_EQ(wrong.type, MessageType::kError);
  EXPECT_NE(decode_error(wrong).find("GPU index below 1"), std::string::npos);
  const uint64_t stranger = handler.connect();
  EXPECT_THROW(handler.handle(stranger, as_message(encode_share(6, {0, 0, 0, 0}))), emugpu::Error);
}

}  // namespace
