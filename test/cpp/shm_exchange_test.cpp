#include "exchange/shm_exchange.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "clock.h"
#include "error.h"

namespace {

using emugpu::ShmExchange;
using namespace std::chrono_literals;

std::string fresh_name() {
  static std::atomic<int> counter{0};
  return emugpu::private_segment_name("test", std::to_string(getpid()) + "-" + std::to_string(counter++));
}

// Every rank's exchange over one segment, its name already unlinked.
std::vector<std::unique_ptr<ShmExchange>> group(int size, uint64_t token = 42) {
  const std::string name = fresh_name();
  std::vector<std::unique_ptr<ShmExchange>> ranks;
  ranks.push_back(ShmExchange::create(name, size, token));
  for (int r = 1; r < size; ++r) ranks.push_back(ShmExchange::open(name, r, size, token));
  ShmExchange::unlink(name);
  return ranks;
}

TEST(ShmExchange, GathersEveryRanksWordsPerTicketAcrossRingWraps) {
  constexpr int kRanks = 4;
  constexpr int kGathers = static_cast<int>(ShmExchange::kDepth) * 3 + 7;
  auto ranks = group(kRanks);
  std::vector<int> failures(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      for (int i = 0; i < kGathers; ++i) {
        const std::array<int64_t, 3> mine{r, i, int64_t{r} * 1000 + i};
        const uint64_t ticket = ranks[r]->start_gather(mine.data(), 3, 10s);
        if (ticket != static_cast<uint64_t>(i)) ++failures[r];
        std::array<int64_t, 3 * kRanks> out{};
        ranks[r]->finish_gather(ticket, out.data(), 3, 10s);
        for (int s = 0; s < kRanks; ++s) {
          if (out[3 * s] != s || out[3 * s + 1] != i || out[3 * s + 2] != int64_t{s} * 1000 + i) ++failures[r];
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, std::vector<int>(kRanks, 0));
}

TEST(ShmExchange, StartsAheadOfTheOthersUntilTheRingIsFull) {
  auto ranks = group(2);
  const int64_t word = 7;
  std::array<int64_t, 2> out{};
  for (uint64_t i = 0; i < ShmExchange::kDepth; ++i) {
    EXPECT_EQ(ranks[0]->start_gather(&word, 1, 1s), i);
    ranks[1]->start_gather(&word, 1, 1s);
    ranks[0]->finish_gather(i, out.data(), 1, 1s);
  }
  // Rank 1 never read ticket 0, so its slot cannot be reused.
  try {
    ranks[0]->start_gather(&word, 1, 100ms);
    FAIL() << "a full ring must not be overwritten";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("ring full"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
  }
}

TEST(ShmExchange, FinishesTicketsOutOfOrder) {
  auto ranks = group(2);
  for (int r = 0; r < 2; ++r) {
    for (int64_t w : {10 + r, 20 + r}) ranks[r]->start_gather(&w, 1, 1s);
  }
  std::array<int64_t, 2> out{};
  ranks[0]->finish_gather(1, out.data(), 1, 1s);
  EXPECT_EQ(out, (std::array<int64_t, 2>{20, 21}));
  ranks[0]->finish_gather(0, out.data(), 1, 1s);
  EXPECT_EQ(out, (std::array<int64_t, 2>{10, 11}));
}

TEST(ShmExchange, TimesOutNamingTheRankThatDidNotArrive) {
  auto ranks = group(3);
  const int64_t word = 1;
  for (int r : {0, 2}) ranks[r]->start_gather(&word, 1, 1s);
  std::array<int64_t, 3> out{};
  const auto start = std::chrono::steady_clock::now();
  try {
    ranks[0]->finish_gather(0, out.data(), 1, 150ms);
    FAIL() << "rank 1 never started the gather";
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kRuntime);
    EXPECT_NE(std::string(e.what()).find("for rank 1"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 150ms);
}

TEST(ShmExchange, AWaitForAMissingRankStopsAtAnInterrupt) {
  struct Interrupted {};
  auto ranks = group(2);
  const int64_t word = 1;
  ranks[0]->start_gather(&word, 1, 1s);
  emugpu::set_wait_interrupt_check([] { throw Interrupted{}; });  // as Ctrl-C does in Python
  std::array<int64_t, 2> out{};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(ranks[0]->finish_gather(0, out.data(), 1, 60s), Interrupted);
  emugpu::set_wait_interrupt_check(nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "the wait ran on towards its timeout";
}

TEST(ShmExchange, NoticesARankThatExitedLongBeforeTheTimeout) {
  const std::string name = fresh_name();
  auto zero = ShmExchange::create(name, 2, 9);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto one = ShmExchange::open(name, 1, 2, 9);
    _exit(0);  // leaves without starting the gather; stays a zombie until reaped
  }
  const int64_t word = 3;
  zero->start_gather(&word, 1, 1s);
  std::array<int64_t, 2> out{};
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  // The child may not have opened the segment (written its pid) yet: then
  // the wait goes on until it has, and exited.
  try {
    zero->finish_gather(0, out.data(), 1, 30s);
  } catch (const emugpu::Error& e) {
    message = e.what();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  ShmExchange::unlink(name);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_NE(message.find("rank 1 (pid " + std::to_string(child) + ") exited"), std::string::npos) << message;
  EXPECT_LT(waited, 5s);
}

TEST(ShmExchange, GathersAcrossProcesses) {
  const std::string name = fresh_name();
  constexpr int kGathers = 3000;
  auto zero = ShmExchange::create(name, 2, 5);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto one = ShmExchange::open(name, 1, 2, 5);
    int bad = 0;
    for (int i = 0; i < kGathers; ++i) {
      const int64_t mine = 100000 + i;
      const uint64_t t = one->start_gather(&mine, 1, 10s);
      std::array<int64_t, 2> out{};
      one->finish_gather(t, out.data(), 1, 10s);
      bad += out[0] != i || out[1] != 100000 + i;
    }
    _exit(bad == 0 ? 0 : 1);
  }
  int bad = 0;
  for (int i = 0; i < kGathers; ++i) {
    const int64_t mine = i;
    const uint64_t t = zero->start_gather(&mine, 1, 10s);
    std::array<int64_t, 2> out{};
    zero->finish_gather(t, out.data(), 1, 10s);
    bad += out[0] != i || out[1] != 100000 + i;
  }
  ShmExchange::unlink(name);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(bad, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(ShmExchange, GathersByteBuffersOfDifferentLengths) {
  constexpr int kRanks = 3;
  auto ranks = group(kRanks);
  std::vector<int> failures(kRanks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      for (int round = 0; round < 20; ++round) {
        std::vector<unsigned char> mine(static_cast<size_t>((r + 1) * round * 100),
                                        static_cast<unsigned char>(r + round));
        int seen = 0;
        ranks[r]->gather_bytes(mine.data(), mine.size(), 10s, [&](int s, const void* bytes, size_t n) {
          const auto* b = static_cast<const unsigned char*>(bytes);
          if (s != seen++ || n != static_cast<size_t>((s + 1) * round * 100)) ++failures[r];
          for (size_t k = 0; k < n; ++k) failures[r] += b[k] != static_cast<unsigned char>(s + round);
        });
        if (seen != kRanks) ++failures[r];
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, std::vector<int>(kRanks, 0));
}

TEST(ShmExchange, RefusesOversizedRequestsAndForeignSegments) {
  const std::string name = fresh_name();
  auto zero = ShmExchange::create(name, 2, 11);
  EXPECT_THROW(ShmExchange::open(name, 1, 2, 12), emugpu::Error);  // another group's token
  EXPECT_THROW(ShmExchange::open(name, 1, 3, 11), emugpu::Error);  // another size
  EXPECT_THROW(ShmExchange::open(name, 2, 2, 11), emugpu::Error);  // no such rank
  EXPECT_THROW(ShmExchange::create(name, 2, 11), emugpu::Error);   // the name is taken
  ShmExchange::unlink(name);
  EXPECT_THROW(ShmExchange::open(name, 1, 2, 11), emugpu::Error);  // gone
  std::array<int64_t, ShmExchange::kMaxWords + 1> words{};
  EXPECT_THROW(zero->start_gather(words.data(), ShmExchange::kMaxWords + 1, 1s), emugpu::Error);
  std::vector<char> big(ShmExchange::kDataCapacity + 1);
  EXPECT_THROW(zero->gather_bytes(big.data(), big.size(), 1s, [](int, const void*, size_t) {}), emugpu::Error);
}

TEST(ShmExchange, ReportsRanksOutOfStepOnWordCounts) {
  auto ranks = group(2);
  const std::array<int64_t, 2> two{1, 2};
  ranks[0]->start_gather(two.data(), 2, 1s);
  ranks[1]->start_gather(two.data(), 1, 1s);
  std::array<int64_t, 4> out{};
  try {
    ranks[0]->finish_gather(0, out.data(), 2, 1s);
    FAIL() << "word counts differ";
  } catch (const emugpu::Error& e) {
    EXPECT_NE(std::string(e.what()).find("got 1 from rank 1"), std::string::npos) << e.what();
  }
}

}  // namespace
