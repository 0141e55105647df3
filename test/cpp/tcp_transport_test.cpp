#include "exchange/tcp_transport.h"

#include <gtest/gtest.h>

#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "clock.h"
#include "error.h"
#include "exchange/clock_offset.h"
#include "exchange/frame.h"

namespace {

using emugpu::TcpTransport;
using namespace std::chrono_literals;

class MapRendezvous : public emugpu::Rendezvous {
 public:
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mutex_);
    values_[key] = value;
    changed_.notify_all();
  }
  std::string get(const std::string& key, std::chrono::nanoseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    const bool found = changed_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; });
    EMUGPU_CHECK(found, kRuntime, "no key ", key);
    return values_[key];
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

TcpTransport::Options options(std::chrono::nanoseconds timeout = 10s, uint64_t token = 1) {
  TcpTransport::Options o;
  o.key_prefix = "g/";
  o.token = token;
  o.timeout = timeout;
  return o;
}

// Every rank's transport, set up concurrently as separate processes would.
std::vector<std::unique_ptr<TcpTransport>> group(MapRendezvous& rdv, int size) {
  std::vector<std::unique_ptr<TcpTransport>> ranks(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back(
        [&, r] { ranks[static_cast<size_t>(r)] = std::make_unique<TcpTransport>(rdv, r, size, options()); });
  }
  for (auto& t : threads) t.join();
  return ranks;
}

TEST(TcpTransport, GathersEveryRanksWordsInStartOrder) {
  constexpr int kRanks = 4;
  constexpr int kGathers = 300;
  MapRendezvous rdv;
  auto ranks = group(rdv, kRanks);
  std::vector<int> failures(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<uint64_t> tickets;
      for (int i = 0; i < kGathers; ++i) {  // start many before finishing any: they pair by order
        const std::array<int64_t, 3> mine{r, i, int64_t{r} * 1000 + i};
        tickets.push_back(ranks[r]->start_gather(mine.data(), 3, 10s));
      }
      for (int i = kGathers - 1; i >= 0; --i) {  // finish in any order
        std::array<int64_t, 3 * kRanks> out{};
        ranks[r]->finish_gather(tickets[static_cast<size_t>(i)], out.data(), 3, 10s);
        for (int s = 0; s < kRanks; ++s) {
          if (out[3 * s] != s || out[3 * s + 1] != i || out[3 * s + 2] != int64_t{s} * 1000 + i) ++failures[r];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, std::vector<int>(kRanks, 0));
}

TEST(TcpTransport, GathersBytesOfDifferentLengthsInRankOrder) {
  constexpr int kRanks = 3;
  MapRendezvous rdv;
  auto ranks = group(rdv, kRanks);
  std::vector<std::string> seen(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const std::string mine(static_cast<size_t>(r) * 100000 + 1, static_cast<char>('a' + r));
      ranks[r]->gather_bytes(mine.data(), mine.size(), 10s, [&](int from, const void* bytes, size_t length) {
        seen[r] += std::to_string(from) + ":" + std::to_string(length) + ":" +
                   static_cast<const char*>(bytes)[length - 1] + " ";
      });
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[r], "0:1:a 1:100001:b 2:200001:c ");
}

TEST(TcpTransport, MessagesArriveInOrderPerPeerAndChannel) {
  MapRendezvous rdv;
  auto ranks = group(rdv, 2);
  for (int i = 0; i < 50; ++i) {
    const int64_t v = i;
    ranks[0]->send(1, 7, &v, sizeof(v));
    const int64_t w = 1000 + i;
    ranks[0]->send(1, 8, &w, sizeof(w));
  }
  for (int i = 0; i < 50; ++i) {  // channel 8 first: channels do not block each other
    const auto m = ranks[1]->recv(0, 8, 10s);
    ASSERT_EQ(m.size(), 8u);
    EXPECT_EQ(*reinterpret_cast<const int64_t*>(m.data()), 1000 + i);
  }
  for (int i = 0; i < 50; ++i) {
    const auto m = ranks[1]->recv(0, 7, 10s);
    EXPECT_EQ(*reinterpret_cast<const int64_t*>(m.data()), i);
  }
  EXPECT_THROW(ranks[1]->send(1, 0, nullptr, 0), emugpu::Error);  // to itself
}

TEST(TcpTransport, ARankThatExitsFailsTheWaitsThatNeedItAtOnce) {
  MapRendezvous rdv;
  auto ranks = group(rdv, 3);
  ranks[2].reset();
  const int64_t word = 1;
  const uint64_t ticket = ranks[0]->start_gather(&word, 1, 60s);
  const auto begin = std::chrono::steady_clock::now();
  try {
    std::array<int64_t, 3> out{};
    ranks[0]->finish_gather(ticket, out.data(), 1, 60s);
    FAIL() << "the gather finished without rank 2";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - begin, 30s);  // not the 60 s timeout
  EXPECT_THROW(ranks[1]->recv(2, 0, 60s), emugpu::Error);
}

TEST(TcpTransport, AGatherARankNeverStartsTimesOutNamingIt) {
  MapRendezvous rdv;
  auto ranks = group(rdv, 2);
  const int64_t word = 1;
  const uint64_t ticket = ranks[0]->start_gather(&word, 1, 1s);
  try {
    std::array<int64_t, 2> out{};
    ranks[0]->finish_gather(ticket, out.data(), 1, 200ms);
    FAIL() << "the gather finished without rank 1";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1 did not arrive"), std::string::npos) << e.what();
  }
}

struct Interrupted {};

// Installs an interrupt check that throws (as Ctrl-C does in Python) and removes it at scope end.
struct InterruptAfter {
  explicit InterruptAfter(int calls) {
    emugpu::set_wait_interrupt_check([this, calls] {
      if (++seen >= calls) throw Interrupted{};
    });
  }
  ~InterruptAfter() { emugpu::set_wait_interrupt_check(nullptr); }
  std::atomic<int> seen{0};
};

TEST(TcpTransport, AWaitForAMissingRankStopsAtAnInterrupt) {
  MapRendezvous rdv;
  auto ranks = group(rdv, 2);
  const int64_t word = 1;
  const uint64_t ticket = ranks[0]->start_gather(&word, 1, 1s);
  InterruptAfter interrupt(2);
  const auto start = std::chrono::steady_clock::now();
  std::array<int64_t, 2> out{};
  EXPECT_THROW(ranks[0]->finish_gather(ticket, out.data(), 1, 60s), Interrupted);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "the wait ran on towards its timeout";
  EXPECT_THROW(ranks[0]->recv(1, 7, 60s), Interrupted);
}

TEST(TcpTransport, SetUpWaitingForAPeerStopsAtAnInterrupt) {
  MapRendezvous rdv;
  InterruptAfter interrupt(3);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(TcpTransport(rdv, 0, 2, options(60s)), Interrupted);  // rank 1 never comes
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

namespace asio = boost::asio;

// Connects to rank 0's published address as something that is not a rank.
std::unique_ptr<asio::ip::tcp::socket> stranger(asio::io_context& io, MapRendezvous& rdv) {
  const std::string address = rdv.get("g/addr/0", 10s);
  const size_t colon = address.rfind(':');
  auto socket = std::make_unique<asio::ip::tcp::socket>(io);
  socket->connect({asio::ip::make_address(address.substr(0, colon)),
                   static_cast<unsigned short>(std::stoi(address.substr(colon + 1)))});
  return socket;
}

TEST(TcpTransport, APeerThatConnectsAndSaysNothingTimesOutNamingIt) {
  MapRendezvous rdv;
  asio::io_context io;
  std::string error;
  std::thread rank0([&] {
    try {
      TcpTransport t(rdv, 0, 2, options(500ms));
    } catch (const emugpu::Error& e) {
      error = e.what();
    }
  });
  auto socket = stranger(io, rdv);
  rank0.join();
  const std::string where =
      socket->local_endpoint().address().to_string() + ":" + std::to_string(socket->local_endpoint().port());
  EXPECT_NE(error.find(where + " connected but sent no hello"), std::string::npos) << error;
  EXPECT_NE(error.find("rank(s) 1 did not connect"), std::string::npos) << error;
}

TEST(TcpTransport, GarbageAndStaleConnectionsDoNotStopTheGroup) {
  MapRendezvous rdv;
  asio::io_context io;
  std::unique_ptr<TcpTransport> rank0;
  std::thread first([&] { rank0 = std::make_unique<TcpTransport>(rdv, 0, 2, options()); });
  auto garbage = stranger(io, rdv);
  const std::string text(64, 'x');
  asio::write(*garbage, asio::buffer(text));
  auto stale = stranger(io, rdv);
  asio::write(*stale, asio::buffer(emugpu::encode_hello({emugpu::Hello::kVersion, 1, 2, /*token=*/99})));
  TcpTransport rank1(rdv, 1, 2, options());
  first.join();
  ASSERT_NE(rank0, nullptr);
  const int64_t word = 5;
  const uint64_t t0 = rank0->start_gather(&word, 1, 10s);
  const uint64_t t1 = rank1.start_gather(&word, 1, 10s);
  std::array<int64_t, 2> out{};
  rank0->finish_gather(t0, out.data(), 1, 10s);
  EXPECT_EQ(out, (std::array<int64_t, 2>{5, 5}));
  rank1.finish_gather(t1, out.data(), 1, 10s);
}

TEST(TcpTransport, AddressTowardsLoopbackIsLoopback) {
  EXPECT_EQ(TcpTransport::address_towards("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(TcpTransport::address_towards("localhost").rfind("127.", 0) == 0 ||
                TcpTransport::address_towards("localhost") == "::1",
            true);
}

}  // namespace

namespace {

TEST(ClockOffset, SampleTakesTheMiddleOfTheRoundTrip) {
  const emugpu::ClockSample s = emugpu::clock_sample(/*sent=*/1000, /*theirs=*/300, /*back=*/1100);
  EXPECT_EQ(s.offset, 750);  // the peer read 300 at our 1050
  EXPECT_EQ(s.round_trip, 100);
}

TEST(ClockOffset, MeasuresAKnownOffsetOverTcp) {
  MapRendezvous rdv;
  auto ranks = group(rdv, 2);
  const auto steady = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  constexpr emugpu::TimeNs kAhead = 5'000'000'000;  // rank 1's clock runs 5 s ahead of rank 0's
  std::thread server([&] { emugpu::serve_clock(*ranks[0], 1, steady, 16, 10s); });
  const emugpu::TimeNs offset = emugpu::measure_clock_offset(
      *ranks[1], 0, [&] { return steady() + kAhead; }, 16, 10s);
  server.join();
  // The best of 16 loopback round trips: off by at most half of one (well under 50 ms even on a busy host).
  EXPECT_NEAR(static_cast<double>(offset), static_cast<double>(kAhead), 50e6);
}

}  // namespace

namespace {

TEST(TcpTransport, ExchangeSendsEachRankOnlyItsChunk) {
  constexpr int kRanks = 3;
  MapRendezvous rdv;
  auto ranks = group(rdv, kRanks);
  std::vector<std::vector<std::string>> got(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<std::string> mine;
      for (int to = 0; to < kRanks; ++to) mine.push_back(std::to_string(r) + "->" + std::to_string(to));
      std::vector<const void*> chunks;
      std::vector<size_t> lengths;
      for (const auto& m : mine) {
        chunks.push_back(m.data());
        lengths.push_back(m.size());
      }
      for (int round = 0; round < 2; ++round) {  // exchanges pair up in call order
        const auto rows = ranks[r]->exchange(chunks, lengths, 10s);
        for (const auto& row : rows) got[r].emplace_back(row.begin(), row.end());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(got[r].size(), 2u * kRanks);
    for (int from = 0; from < kRanks; ++from) {
      EXPECT_EQ(got[r][static_cast<size_t>(from)], std::to_string(from) + "->" + std::to_string(r));
    }
  }
}

TEST(TcpTransport, ExchangedChunksMayChangeOnceTheExchangeReturns) {
  // The chunks are written without a copy: exchange() must not return while
  // a peer has still to read them. Each rank reuses one buffer for every round.
  constexpr int kRanks = 3;
  constexpr size_t kBytes = 3 << 20;  // larger than loopback's socket buffers
  MapRendezvous rdv;
  auto ranks = group(rdv, kRanks);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::vector<uint8_t> buffer(kBytes);
      for (int round = 0; round < 4; ++round) {
        std::fill(buffer.begin(), buffer.end(), static_cast<uint8_t>(16 * r + round));
        const std::vector<const void*> chunks(kRanks, buffer.data());  // one chunk for all: an all-gather
        const std::vector<size_t> lengths(kRanks, kBytes);
        const auto rows = ranks[static_cast<size_t>(r)]->exchange(chunks, lengths, 10s);
        for (int from = 0; from < kRanks; ++from) {
          const auto& row = rows[static_cast<size_t>(from)];
          const auto want = static_cast<uint8_t>(16 * from + round);
          if (row.size() != kBytes || std::count(row.begin(), row.end(), want) != static_cast<long>(kBytes)) ++wrong;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
