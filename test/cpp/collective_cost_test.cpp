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
// Simple: 80 us pipeline fill once, 3.4 us per NVLink hop, 14.3 us per
// network hop (3 us configured + 11.3 us), 5.7 us per PCIe hop.
constexpr double kSimpleFixed = 80000;
constexpr double kNvlinkSimpleHop = 3400;
constexpr double kNetSimpleHop = 14300;

// An A100-SXM4 as the catalog has it: 300 GB/s NVLink per direction.
emugpu::GpuSpec a100() {
  emugpu::GpuSpec g;
  g.name = "A100";
  g.nvlink_bandwidth = 300e9;
  g.pcie_generation = 4;
  g.pcie_width = 16;
  return g;
}

// An H100 SXM: 450 GB/s NVLink per direction, an NVSwitch that reduces.
emugpu::GpuSpec h100() {
  emugpu::GpuSpec g = a100();
  g.name = "H100";
  g.nvlink_bandwidth = 450e9;
  g.major = 9;
  return g;
}

emugpu::GpuSpec pcie_gpu() {
  emugpu::GpuSpec g = a100();
  g.nvlink_bandwidth = 0;
  return g;
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
  // launch + Simple's fill + 2(n-1) hops of 3.4 us + 2(n-1)/n x bytes / 240 GB/s
  const double expected = kLaunch + kSimpleFixed + 14 * kNvlinkSimpleHop + 1.75 * kGiB / 240e9 * 1e9;
  EXPECT_NEAR(c.duration, expected, 1);
  // Its bus bandwidth approaches the effective NVLink rate.
  const double busbw = kGiB / (c.duration * 1e-9) * c.bus_factor;
  EXPECT_NEAR(busbw / 1e9, 235.9, 0.1);
}

TEST(CollectiveCost, RingCollectivesMoveTheirShareOfTheBuffer) {
  const auto t = emugpu::make_topology(a100(), 8, 8);
  const auto ag = emugpu::collective_time(Collective::kAllGather, kGiB, t);
  EXPECT_EQ(ag.algorithm, Algorithm::kRing);
  EXPECT_NEAR(ag.duration, kLaunch + kSimpleFixed + 7 * kNvlinkSimpleHop + 0.875 * kGiB / 240e9 * 1e9, 1);
  const auto rs = emugpu::collective_time(Collective::kReduceScatter, kGiB, t);
  EXPECT_EQ(rs.duration, ag.duration);
  const auto bc = emugpu::collective_time(Collective::kBroadcast, kGiB, t);
  EXPECT_NEAR(bc.duration, kLaunch + kSimpleFixed + 7 * kNvlinkSimpleHop + kGiB / 240e9 * 1e9, 1);
}

TEST(CollectiveCost, SmallAllReduceAcrossNodesPicksTreeAndLL) {
  const auto t = emugpu::make_topology(a100(), 32, 8);  // 4 nodes, 100 GB/s and 3 us each
  const auto c = emugpu::collective_time(Collective::kAllReduce, 1024, t);
  EXPECT_EQ(c.algorithm, Algorithm::kTree);
  EXPECT_EQ(c.protocol, Protocol::kLL);
  // launch + 2 x (7 NVLink hops + log2(4) network hops) + the buffer twice
  // through the network at LL's cap beyond two nodes (19 GB/s, below half of
  // 96 GB/s), of which NCCL's tuner gives tree all_reduce 92%
  const double expected = kLaunch + 2 * (7 * 600 + 2 * 3000) + 2 * 1024 / (19e9 * 0.92) * 1e9;
  EXPECT_NEAR(c.duration, expected, 1);
}

TEST(CollectiveCost, LargeAllReduceAcrossNodesIsARingAtTheNicRate) {
  const auto t = emugpu::make_topology(a100(), 32, 8);
  const auto c = emugpu::collective_time(Collective::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, Algorithm::kRing);
  EXPECT_EQ(c.protocol, Protocol::kSimple);
  // 62 hops, 4 of every 32 on the network, the rest NVLink
  const double hop = 0.875 * kNvlinkSimpleHop + 0.125 * kNetSimpleHop;
  EXPECT_NEAR(c.duration, kLaunch + kSimpleFixed + 62 * hop + 62.0 / 32 * kGiB / 96e9 * 1e9, 1);
}

TEST(CollectiveCost, TwoNodeTreeSendsTheBufferOnceOverTheNetwork) {
  const auto t = emugpu::make_topology(a100(), 16, 8);
  const auto c = emugpu::collective_time(Collective::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, Algorithm::kTree);
  EXPECT_NEAR(c.duration,
              kLaunch + kSimpleFixed + 2 * (7 * kNvlinkSimpleHop + kNetSimpleHop) + kGiB / (96e9 * 0.92) * 1e9, 1);
  // so its bus bandwidth exceeds the NICs', as nccl-tests shows on two nodes
  EXPECT_GT(kGiB / (c.duration * 1e-9) * c.bus_factor, 96e9 * 1.5);
}

TEST(CollectiveCost, PointToPointCollectives) {
  const auto node = emugpu::make_topology(a100(), 8, 8);
  const auto a2a = emugpu::collective_time(Collective::kAllToAll, kGiB, node);
  EXPECT_EQ(a2a.algorithm, Algorithm::kDirect);
  EXPECT_NEAR(a2a.duration, kLaunch + kSimpleFixed + kNvlinkSimpleHop + 0.875 * kGiB / 240e9 * 1e9, 1);
  // Two nodes: each node sends half of its ranks' buffers out.
  const auto two = emugpu::make_topology(a100(), 16, 8);
  const auto a2a2 = emugpu::collective_time(Collective::kAllToAll, kGiB, two);
  EXPECT_NEAR(a2a2.duration, kLaunch + kSimpleFixed + kNetSimpleHop + 8 * 0.5 * kGiB / 96e9 * 1e9, 1);
  const auto pair = emugpu::make_topology(a100(), 2, 1);  // two nodes, one GPU each
  const auto p2p = emugpu::collective_time(Collective::kSendRecv, kGiB, pair);
  EXPECT_NEAR(p2p.duration, kLaunch + kSimpleFixed + kNetSimpleHop + kGiB / 96e9 * 1e9, 1);
  const auto gather = emugpu::collective_time(Collective::kGather, kGiB, node);
  EXPECT_NEAR(gather.duration, kLaunch + kSimpleFixed + kNvlinkSimpleHop + 0.875 * kGiB / 240e9 * 1e9, 1);
}

TEST(CollectiveCost, PcieNodesNeverUseLL128) {
  const auto t = emugpu::make_topology(pcie_gpu(), 4, 4);
  for (double bytes : {8.0, 65536.0, 1e6, 1e8}) {
    EXPECT_NE(emugpu::collective_time(Collective::kAllReduce, bytes, t).protocol, Protocol::kLL128) << bytes;
  }
  const auto c = emugpu::collective_time(Collective::kAllReduce, kGiB, t);
  // 6 hops of 1.0 + 4.7 us over PCIe
  EXPECT_NEAR(c.duration, kLaunch + kSimpleFixed + 6 * 5700 + 1.5 * kGiB / pcie_gpu().pcie_bandwidth() * 1e9, 1);
}

TEST(CollectiveCost, HopperAllReduceUsesTheSwitchesReduction) {
  const auto t = emugpu::make_topology(h100(), 8, 8);
  EXPECT_TRUE(t.nvls);
  const auto c = emugpu::collective_time(Collective::kAllReduce, kGiB, t);
  EXPECT_EQ(c.algorithm, Algorithm::kNvls);
  EXPECT_EQ(c.protocol, Protocol::kSimple);
  // the buffer once through 60% of 450 GB/s, after NVLS's 25 us
  EXPECT_NEAR(c.duration, kLaunch + kSimpleFixed + 25000 + kGiB / 270e9 * 1e9, 1);
  EXPECT_NEAR(kGiB / (c.duration * 1e-9) * c.bus_factor / 1e9, 459.4, 0.1);  // published: 465-470
  // Only all_reduce, and not on an A100's switch.
  EXPECT_EQ(emugpu::collective_time(Collective::kAllGather, kGiB, t).algorithm, Algorithm::kRing);
  EXPECT_FALSE(emugpu::make_topology(a100(), 8, 8).nvls);
  // One GPU per node has no switch to reduce on.
  EXPECT_NE(emugpu::collective_time(Collective::kAllReduce, kGiB, emugpu::make_topology(h100(), 8, 1)).algorithm,
            Algorithm::kNvls);
}

TEST(CollectiveCost, NvlsAcrossNodesIsBoundByTheSlowerOfSwitchAndNetwork) {
  // 2 nodes x 8 H100, 8 x 400 Gb/s each: the switch (270 GB/s) is slower
  // than the two-node tree's one pass over 384 GB/s x 92%.
  const auto fast = emugpu::make_topology(h100(), 16, 8, {400e9, 3.0});
  const auto c = emugpu::collective_time(Collective::kAllReduce, kGiB, fast);
  EXPECT_EQ(c.algorithm, Algorithm::kNvls);
  EXPECT_NEAR(c.duration, kLaunch + kSimpleFixed + 25000 + kGiB / 270e9 * 1e9, 1);
  // 4 nodes x 100 GB/s: the network's tree (2x the buffer) bounds it, as it bounds the plain tree.
  const auto slow = emugpu::make_topology(h100(), 32, 8);
  const auto nvls = emugpu::collective_time(Collective::kAllReduce, kGiB, slow, emugpu::parse_algorithms("NVLSTree"));
  EXPECT_EQ(nvls.algorithm, Algorithm::kNvls);
  EXPECT_NEAR(nvls.duration, kLaunch + kSimpleFixed + 2 * 2 * kNetSimpleHop + 2 * kGiB / (96e9 * 0.92) * 1e9, 1);
}

TEST(CollectiveCost, NcclAlgoRestrictsTheChoice) {
  const auto t = emugpu::make_topology(a100(), 16, 8);  // the tree wins at 1 GiB here
  EXPECT_EQ(emugpu::collective_time(Collective::kAllReduce, kGiB, t).algorithm, Algorithm::kTree);
  const auto ring = emugpu::collective_time(Collective::kAllReduce, kGiB, t, emugpu::parse_algorithms("Ring"));
  EXPECT_EQ(ring.algorithm, Algorithm::kRing);
  EXPECT_EQ(emugpu::collective_time(Collective::kAllReduce, kGiB, t, emugpu::parse_algorithms("^tree")).algorithm,
            Algorithm::kRing);
  // Point-to-point collectives are not NCCL_ALGO's to restrict.
  EXPECT_EQ(emugpu::collective_time(Collective::kAllToAll, kGiB, t, emugpu::parse_algorithms("Tree")).algorithm,
            Algorithm::kDirect);
  const auto parsed = emugpu::parse_algorithms(" ring, NVLSTree ,CollNetDirect");
  EXPECT_TRUE(parsed.ring);
  EXPECT_FALSE(parsed.tree);
  EXPECT_TRUE(parsed.nvls);
  EXPECT_TRUE(emugpu::parse_algorithms("default").tree);
  EXPECT_TRUE(emugpu::parse_algorithms("").ring);
}

TEST(CollectiveCost, NcclAlgoErrorsSayWhatIsAllowed) {
  const auto t = emugpu::make_topology(a100(), 8, 8);
  // NCCL fails a collective that its NCCL_ALGO leaves no algorithm for.
  EXPECT_NE(error_of([&] {
              emugpu::collective_time(Collective::kAllGather, kGiB, t, emugpu::parse_algorithms("Tree"));
            }).find("allow Ring"),
            std::string::npos);
  EXPECT_NE(error_of([] { emugpu::parse_algorithms("Rign"); }).find("Ring, Tree, NVLS"), std::string::npos);
  EXPECT_NE(error_of([] { emugpu::parse_algorithms("^ring,tree,nvls"); }).find("leaves no algorithm"),
            std::string::npos);
  EXPECT_NE(error_of([] { emugpu::parse_algorithms("CollNetDirect"); }).find("leaves no algorithm"), std::string::npos);
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
