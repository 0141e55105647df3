#include "collective_cost.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "error.h"

namespace {

using emugpu::Algorithm;
using emugpu::Collective;
using emugpu::Protocol;

constexpr double kGiB = 1024.0 * 1024 * 1024;
constexpr emugpu::TimeNs kLaunch = 8000;  // once per collective

// An A100-SXM4 as the catalog has it: 300 GB/s NVLink per direction.
emugpu::GpuSpec a100() {
  emugpu::GpuSpec g;
  g.name = "A100";
  g.nvlink_bandwidth = 300e9;
  g.pcie_generation = 4;
  g.pcie_width = 16;
  return g;
}

emugpu::GpuSpec pcie_gpu() {
  emugpu::GpuSpec g = a100();
  g.nvlink_bandwidth = 0;
  return g;
}

TEST(CollectiveTopology, RatesComeFromTheCatalogAndTheNetwork) {
  const auto t = emugpu::make_topology(a100(), 32, 8, {50e9, 2.0});
  EXPECT_EQ(t.ranks_per_node, 8);
  EXPECT_EQ(t.nodes, 4);
  EXPECT_EQ(t.world(), 32);
  EXPECT_TRUE(t.nvlink);
  EXPECT_DOUBLE_EQ(t.intra_bw, 240e9);  // 80% of the NVLink line rate
  EXPECT_DOUBLE_EQ(t.inter_bw, 48e9);   // 96% of the NICs
  EXPECT_DOUBLE_EQ(t.inter_latency_ns, 2000);
  const auto p = emugpu::make_topology(pcie_gpu(), 4, 8);
  EXPECT_FALSE(p.nvlink);
  EXPECT_EQ(p.ranks_per_node, 4);  // a partly used node
  EXPECT_EQ(p.nodes, 1);
  EXPECT_DOUBLE_EQ(p.intra_bw, pcie_gpu().pcie_bandwidth());
}

TEST(CollectiveCost, BusFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(emugpu::bus_factor(Collective::kAllReduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(emugpu::bus_factor(Collective::kAllGather, 8), 0.875);
  EXPECT_DOUBLE_EQ(emugpu::bus_factor(Collective::kReduceScatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(emugpu::bus_factor(Collective::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(emugpu::bus_factor(Collective::kBroadcast, 8), 1);
  EXPECT_DOUBLE_EQ(emugpu::bus_factor(Collective::kReduce, 8), 1);
  EXPECT_DOUBLE_EQ(emugpu::bus_factor(Collective::kSendRecv, 2), 1);
  EXPECT_DOUBLE_EQ(emugpu::bus_factor(Collective::kAllReduce, 1), 0);
  const auto t = emugpu::make_topology(a100(), 8, 8);
  EXPECT_DOUBLE_EQ(emugpu::collective_time(Collective::kAllReduce, 1e6, t).bus_factor, 1.75);
}

TEST(CollectiveCost, LargeAllReduceOnOneNodeIsARing) {
  const auto t = emugpu::make_topology(a100(), 8, 8);
  const auto c = emugpu::collective_time(Collective::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, Algorithm::kRing);
  EXPECT_EQ(c.protocol, Protocol::kSimple);
  // launch + 2(n-1) hops of (NVLink 600 ns + Simple 1600 ns) + 2(n-1)/n x bytes / 240 GB/s
  const double expected = kLaunch + 14 * 2200 + 1.75 * kGiB / 240e9 * 1e9;
  EXPECT_NEAR(c.duration, expected, 1);
  // Its bus bandwidth approaches the effective NVLink rate.
  const double busbw = kGiB / (c.duration * 1e-9) * c.bus_factor;
  EXPECT_NEAR(busbw / 1e9, 238.8, 0.1);
}

TEST(CollectiveCost, RingCollectivesMoveTheirShareOfTheBuffer) {
  const auto t = emugpu::make_topology(a100(), 8, 8);
  const auto ag = emugpu::collective_time(Collective::kAllGather, kGiB, t);
  EXPECT_EQ(ag.algorithm, Algorithm::kRing);
  EXPECT_NEAR(ag.duration, kLaunch + 7 * 2200 + 0.875 * kGiB / 240e9 * 1e9, 1);
  const auto rs = emugpu::collective_time(Collective::kReduceScatter, kGiB, t);
  EXPECT_EQ(rs.duration, ag.duration);
  const auto bc = emugpu::collective_time(Collective::kBroadcast, kGiB, t);
  EXPECT_NEAR(bc.duration, kLaunch + 7 * 2200 + kGiB / 240e9 * 1e9, 1);
}

TEST(CollectiveCost, SmallAllReduceAcrossNodesPicksTreeAndLL) {
  const auto t = emugpu::make_topology(a100(), 32, 8);  // 4 nodes, 100 GB/s and 3 us each
  const auto c = emugpu::collective_time(Collective::kAllReduce, 1024, t);
  EXPECT_EQ(c.algorithm, Algorithm::kTree);
  EXPECT_EQ(c.protocol, Protocol::kLL);
  // launch + 2 x (7 NVLink hops + log2(4) network hops) + the buffer twice
  // through the network at a quarter of 96 GB/s (LL), of which NCCL's tuner gives tree all_reduce 92%
  const double expected = kLaunch + 2 * (7 * 600 + 2 * 3000) + 2 * 1024 / (96e9 * 0.25 * 0.92) * 1e9;
  EXPECT_NEAR(c.duration, expected, 1);
}

TEST(CollectiveCost, LargeAllReduceAcrossNodesIsARingAtTheNicRate) {
  const auto t = emugpu::make_topology(a100(), 32, 8);
  const auto c = emugpu::collective_time(Collective::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, Algorithm::kRing);
  EXPECT_EQ(c.protocol, Protocol::kSimple);
  // 62 hops, 4 of every 32 on the network (3 us + 1.6 us), the rest NVLink (2.2 us)
  const double hop = 0.875 * 2200 + 0.125 * 4600;
  EXPECT_NEAR(c.duration, kLaunch + 62 * hop + 62.0 / 32 * kGiB / 96e9 * 1e9, 1);
}

TEST(CollectiveCost, TwoNodeTreeSendsTheBufferOnceOverTheNetwork) {
  const auto t = emugpu::make_topology(a100(), 16, 8);
  const auto c = emugpu::collective_time(Collective::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, Algorithm::kTree);
  EXPECT_NEAR(c.duration, kLaunch + 2 * (7 * 2200 + 1 * 4600) + kGiB / (96e9 * 0.92) * 1e9, 1);
  // so its bus bandwidth exceeds the NICs', as nccl-tests shows on two nodes
  EXPECT_GT(kGiB / (c.duration * 1e-9) * c.bus_factor, 96e9 * 1.5);
}

TEST(CollectiveCost, PointToPointCollectives) {
  const auto node = emugpu::make_topology(a100(), 8, 8);
  const auto a2a = emugpu::collective_time(Collective::kAllToAll, kGiB, node);
  EXPECT_EQ(a2a.algorithm, Algorithm::kDirect);
  EXPECT_NEAR(a2a.duration, kLaunch + 2200 + 0.875 * kGiB / 240e9 * 1e9, 1);
  // Two nodes: each node sends half of its ranks' buffers out.
  const auto two = emugpu::make_topology(a100(), 16, 8);
  const auto a2a2 = emugpu::collective_time(Collective::kAllToAll, kGiB, two);
  EXPECT_NEAR(a2a2.duration, kLaunch + 4600 + 8 * 0.5 * kGiB / 96e9 * 1e9, 1);
  const auto pair = emugpu::make_topology(a100(), 2, 1);  // two nodes, one GPU each
  const auto p2p = emugpu::collective_time(Collective::kSendRecv, kGiB, pair);
  EXPECT_NEAR(p2p.duration, kLaunch + 4600 + kGiB / 96e9 * 1e9, 1);
  const auto gather = emugpu::collective_time(Collective::kGather, kGiB, node);
  EXPECT_NEAR(gather.duration, kLaunch + 2200 + 0.875 * kGiB / 240e9 * 1e9, 1);
}

TEST(CollectiveCost, PcieNodesNeverUseLL128) {
  const auto t = emugpu::make_topology(pcie_gpu(), 4, 4);
  for (double bytes : {8.0, 65536.0, 1e6, 1e8}) {
    EXPECT_NE(emugpu::collective_time(Collective::kAllReduce, bytes, t).protocol, Protocol::kLL128) << bytes;
  }
  const auto c = emugpu::collective_time(Collective::kAllReduce, kGiB, t);
  EXPECT_NEAR(c.duration, kLaunch + 6 * 3100 + 1.5 * kGiB / pcie_gpu().pcie_bandwidth() * 1e9, 1);
}

TEST(CollectiveCost, TimeGrowsWithSizeAndBarrierIsATinyAllReduce) {
  const auto t = emugpu::make_topology(a100(), 16, 8);
  emugpu::TimeNs last = 0;
  for (double bytes = 1; bytes <= kGiB; bytes *= 4) {
    const auto d = emugpu::collective_time(Collective::kAllReduce, bytes, t).duration;
    EXPECT_GE(d, last) << bytes;
    last = d;
  }
  EXPECT_EQ(emugpu::collective_time(Collective::kBarrier, 0, t).duration,
            emugpu::collective_time(Collective::kAllReduce, 4, t).duration);
  const auto one = emugpu::make_topology(a100(), 1, 8);
  const auto solo = emugpu::collective_time(Collective::kAllReduce, kGiB, one);
  EXPECT_EQ(solo.duration, kLaunch);
  EXPECT_EQ(solo.bus_factor, 0);
}

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kValue);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(CollectiveCost, BadArgumentsSayWhatWasExpected) {
  const auto t = emugpu::make_topology(a100(), 8, 8);
  EXPECT_NE(error_of([&] { emugpu::collective_time(Collective::kAllReduce, -1, t); }).find("got -1"),
            std::string::npos);
  error_of([&] { emugpu::collective_time(Collective::kAllGather, std::nan(""), t); });
  EXPECT_NE(error_of([&] { emugpu::make_topology(a100(), 12, 8); }).find("multiple of 8"), std::string::npos);
  EXPECT_NE(error_of([&] { emugpu::make_topology(a100(), 0, 8); }).find("got 0"), std::string::npos);
  EXPECT_NE(error_of([&] { emugpu::make_topology(a100(), 8, 0); }).find("ranks_per_node"), std::string::npos);
  error_of([&] { emugpu::make_topology(a100(), 16, 8, {0, 3}); });
  error_of([&] { emugpu::make_topology(a100(), 16, 8, {100e9, -1}); });
  emugpu::Topology zero;
  zero.ranks_per_node = 0;
  EXPECT_NE(error_of([&] { emugpu::collective_time(Collective::kAllReduce, 1, zero); }).find("ranks per node"),
            std::string::npos);
  emugpu::Topology no_net = t;
  no_net.nodes = 2;
  no_net.inter_bw = 0;
  EXPECT_NE(error_of([&] { emugpu::collective_time(Collective::kAllReduce, 1, no_net); }).find("network"),
            std::string::npos);
  error_of([&] { emugpu::bus_factor(Collective::kAllReduce, 0); });
}

TEST(CollectiveCost, NamesParseLoosely) {
  EXPECT_EQ(emugpu::parse_collective("all_reduce"), Collective::kAllReduce);
  EXPECT_EQ(emugpu::parse_collective("AllGather"), Collective::kAllGather);
  EXPECT_EQ(emugpu::parse_collective("reduce-scatter"), Collective::kReduceScatter);
  EXPECT_EQ(emugpu::parse_collective("alltoall"), Collective::kAllToAll);
  EXPECT_EQ(emugpu::parse_collective("send"), Collective::kSendRecv);
  const std::string msg = error_of([] { emugpu::parse_collective(std::string(500, 'x')); });
  EXPECT_NE(msg.find("all_reduce"), std::string::npos);
  EXPECT_LT(msg.size(), 300u);
  for (auto c : {Collective::kBroadcast, Collective::kGather, Collective::kScatter, Collective::kBarrier}) {
    EXPECT_EQ(emugpu::parse_collective(emugpu::collective_name(c)), c);
  }
}

}  // namespace
