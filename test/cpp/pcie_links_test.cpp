#include "pcie_links.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "error.h"

namespace {

TEST(PcieLinks, CopiesOnOneUplinkQueueInEachDirection) {
  auto links = emugpu::PcieLinks::in_process();
  EXPECT_EQ(links->reserve(0, true, 100, 50), 100);
  EXPECT_EQ(links->reserve(0, true, 120, 50), 150);    // behind the first
  EXPECT_EQ(links->reserve(0, false, 120, 50), 120);   // the other direction is free
  EXPECT_EQ(links->reserve(1, true, 120, 50), 120);    // so is another uplink
  EXPECT_EQ(links->reserve(0, true, 1000, 10), 1000);  // an idle uplink does not delay
}

TEST(PcieLinks, ConcurrentReservationsNeverOverlap) {
  auto links = emugpu::PcieLinks::in_process();
  constexpr int kThreads = 4, kEach = 1000;
  std::vector<std::vector<emugpu::TimeNs>> begins(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([links, &out = begins[t]] {
      for (int i = 0; i < kEach; ++i) out.push_back(links->reserve(3, true, 0, 10));
    });
  }
  for (auto& t : threads) t.join();
  std::vector<emugpu::TimeNs> all;
  for (const auto& b : begins) all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], static_cast<emugpu::TimeNs>(10 * i));
}

TEST(PcieLinks, ProcessesOfANodeShareTheSegment) {
  const std::string name = emugpu::private_segment_name("pcie-test", std::to_string(getpid()));
  auto parent = emugpu::PcieLinks::shared(name);
  EXPECT_EQ(parent->reserve(2, true, 1000, 500), 1000);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto mine = emugpu::PcieLinks::shared(name);  // opens the same segment
    _exit(mine->reserve(2, true, 1200, 100) == 1500 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the child did not see the parent's copy";
  EXPECT_EQ(parent->reserve(2, true, 0, 1), 1600);  // behind the child's
  emugpu::PcieLinks::unlink(name);
}

TEST(PcieLinks, BadArgumentsSayWhatWasExpected) {
  auto links = emugpu::PcieLinks::in_process();
  try {
    links->reserve(emugpu::PcieLinks::kMaxUplinks, true, 0, 1);
    ADD_FAILURE() << "an uplink out of range was accepted";
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
    EXPECT_NE(std::string(e.what()).find("expected an uplink from 0 to 63"), std::string::npos) << e.what();
  }
  EXPECT_THROW(emugpu::PcieLinks::shared("no-slash"), emugpu::Error);
}

}  // namespace
