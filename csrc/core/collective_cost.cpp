#include "collective_cost.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>

#include "error.h"

namespace emugpu {
namespace {

// Fraction of the NVLink line rate that NCCL's kernels move: SMs write
// 128-byte payloads into larger link packets (~80% according to NCCL's
// maintainers, NVIDIA/nccl#1054; 230 of 300 GB/s on A100, nccl-tests#149).
constexpr double kNvlinkEfficiency = 0.8;
// Of an InfiniBand NIC's line rate, NCCL reaches ~96% (24 GB/s per 200 Gb/s
// NIC, nccl-tests#119). PCIe needs none here: GpuSpec::pcie_bandwidth() is
// already the usable rate.
constexpr double kNetEfficiency = 0.96;
// One LL hop between two GPUs, flag write to flag seen: NCCL's tuner
// (tuning.cc, hwLat) rates it 0.6 us over NVLink and 1.0 us over PCIe.
constexpr double kNvlinkHopNs = 600;
constexpr double kPcieHopNs = 1000;
// Enqueue, launch and teardown of the collective kernel, paid once: fitted
// to NDmv4's 1 KiB times on one node (benchmarks/data/ndmv4_a100.txt).
constexpr double kLaunchNs = 8000;
// NVLS all_reduce: each GPU's buffer crosses its links once each way (the
// switch reduces and multicasts), at 60% of the NVLink line rate: 8 H100s
// reach 466-470 GB/s bus bandwidth at 1-2 GiB (nccl-tests#290, #309).
constexpr double kNvlsEfficiency = 0.6;
constexpr double kNvlsLatencyNs = 25000;  // NCCL's tuner: hwLat NVLS Simple 23-25 us

constexpr int kMaxRanksPerNode = 64;
constexpr int kMaxRanks = 1 << 20;
constexpr double kMaxBytes = 1e18;  // keeps every duration inside TimeNs

struct ProtocolTraits {
  Protocol protocol;
  double efficiency;     // payload share of the link rate
  double nvlink_hop_ns;  // what the protocol adds to a hop's latency, per link kind
  double pcie_hop_ns;
  double net_hop_ns;
  double fixed_ns;  // pipeline fill and drain, once per collective
};

// Hop latencies: the differences between NCCL's hwLat rows (tuning.cc,
// 2.20-2.25: NVLink 0.6/1.9/3.4 us, PCIe 1.0/2.5/5.7, network 2.7/4.0/14 for
// LL/LL128/Simple). LL: 8 payload bytes per 16-byte line with its flags;
// NCCL rates it at half the bus bandwidth, capped (ll_max_bw). LL128 and
// Simple: efficiency and fixed cost fitted once to three published runs
// (OCI BM.GPU4.8 8 x A100, nccl-tests#309's 2 x 8 H100 with NCCL_ALGO=Ring,
// nccl-tests#290's 8 x H100; benchmarks/collective_model.py): between 1 and
// 64 MiB NCCL's LL128 kernels reach about half the link rate, not the 92%
// its tuner assumes, and Simple pays ~80 us to fill its pipeline.
constexpr std::array<ProtocolTraits, 3> kProtocols{{
    {Protocol::kLL, 0.5, 0, 0, 0, 0},
    {Protocol::kLL128, 0.5, 1300, 1500, 1300, 20000},
    {Protocol::kSimple, 1.0, 2800, 4700, 11300, 80000},
}};

// NCCL's LL bus-bandwidth caps (tuning.cc, llMaxBws, Ampere and Hopper): one
// node, two nodes, more.
double ll_max_bw(int nodes) { return nodes == 1 ? 87.7e9 : nodes == 2 ? 22.5e9 : 19.0e9; }

struct Rates {
  double intra_bw, inter_bw;    // bytes/s under this protocol
  double intra_hop, inter_hop;  // ns per hop under this protocol
  double fixed;                 // ns once per collective
};

Rates rates(const Topology& t, const ProtocolTraits& p) {
  Rates r{t.intra_bw * p.efficiency, t.inter_bw * p.efficiency,
          t.intra_latency_ns + (t.nvlink ? p.nvlink_hop_ns : p.pcie_hop_ns), t.inter_latency_ns + p.net_hop_ns,
          p.fixed_ns};
  if (p.protocol == Protocol::kLL) {
    r.intra_bw = std::min(r.intra_bw, ll_max_bw(t.nodes));
    r.inter_bw = std::min(r.inter_bw, ll_max_bw(t.nodes));
  }
  return r;
}

// Time of one ring pass: `steps` hops one after another for the first chunk
// (pipeline fill), then `wire` bytes per rank at the ring's slowest edge.
// With several nodes, NCCL's rings cross the network once per node, so a
// nodes/world share of the hops are network hops, and each node's NICs carry
// what one rank sends per step (one ring edge per channel leaves each node).
double ring(const Topology& t, const Rates& r, double steps, double wire) {
  const double n = t.world();
  const double net_share = t.nodes > 1 ? t.nodes / n : 0.0;
  const double hop = (1 - net_share) * r.intra_hop + net_share * r.inter_hop;
  double bw = r.intra_bw;
  if (t.nodes > 1) bw = t.ranks_per_node > 1 ? std::min(r.intra_bw, r.inter_bw) : r.inter_bw;
  return r.fixed + steps * hop + wire / bw * 1e9;
}

// All_reduce over NCCL's tree: a chain through each node's GPUs and a double
// binary tree across nodes, reduce up then broadcast down, pipelined. A chain
// GPU sends the whole buffer twice (up and down). A node sends 2x the buffer
// on the network (interior in one tree with two children, leaf in the other),
// but only 1x with two nodes, where each tree is a single edge.
// NCCL's tuner (tuning.cc) rates tree all_reduce at 92% of the links' bus
// bandwidth, for every protocol.
constexpr double kTreeAllReduceShare = 0.92;

int tree_depth(const Topology& t) { return t.nodes > 1 ? static_cast<int>(std::ceil(std::log2(t.nodes))) : 0; }

// Seconds a node's NICs send a tree all_reduce's bytes (see above).
double tree_net_s(const Topology& t, const Rates& r, double bytes) {
  return t.nodes > 1 ? (t.nodes == 2 ? bytes : 2 * bytes) / r.inter_bw : 0.0;
}

// What the network part of a tree all_reduce costs (latency and bytes).
double tree_network(const Topology& t, const Rates& r, double bytes) {
  if (t.nodes == 1) return 0;
  return 2.0 * tree_depth(t) * r.inter_hop + tree_net_s(t, r, bytes) / kTreeAllReduceShare * 1e9;
}

double tree_all_reduce(const Topology& t, const Rates& r, double bytes) {
  const double latency = 2.0 * ((t.ranks_per_node - 1) * r.intra_hop + tree_depth(t) * r.inter_hop);
  const double chain = t.ranks_per_node > 1 ? 2 * bytes / r.intra_bw : 0.0;
  return r.fixed + latency + std::max(chain, tree_net_s(t, r, bytes)) / kTreeAllReduceShare * 1e9;
}

// NVLS all_reduce: the switch reduces inside each node; across nodes
// (NVLSTree) a tree over the network, whichever is slower bounds it.
double nvls_all_reduce(const Topology& t, const Rates& r, double bytes) {
  const double intra = kNvlsLatencyNs + bytes / (t.nvlink_line_bw * kNvlsEfficiency) * 1e9;
  return r.fixed + std::max(intra, tree_network(t, r, bytes));
}

// Point-to-point traffic, all peers at once: `local` bytes leave a GPU over
// its intra-node links, `remote` bytes leave its node over the network.
double direct(const Topology& t, const Rates& r, double local, double remote) {
  const double hop = t.nodes > 1 && remote > 0 ? r.inter_hop : r.intra_hop;
  const double intra = local > 0 ? local / r.intra_bw : 0.0;
  const double inter = remote > 0 ? remote / r.inter_bw : 0.0;
  return r.fixed + hop + std::max(intra, inter) * 1e9;
}

// Duration (ns, launch excluded) of `kind` with `algorithm` under `r`, or
// NaN where NCCL has no such variant.
double variant(Collective kind, Algorithm algorithm, Protocol protocol, const Topology& t, const Rates& r,
               double bytes) {
  const double n = t.world();
  const double R = t.ranks_per_node;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  switch (kind) {
    case Collective::kAllReduce:
      if (algorithm == Algorithm::kRing) return ring(t, r, 2 * (n - 1), 2 * (n - 1) / n * bytes);
      if (algorithm == Algorithm::kTree) return tree_all_reduce(t, r, bytes);
      // NVLS needs a switch that reduces, two GPUs on it, and runs Simple only.
      if (algorithm == Algorithm::kNvls && t.nvls && R > 1 && protocol == Protocol::kSimple) {
        return nvls_all_reduce(t, r, bytes);
      }
      return nan;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
      return algorithm == Algorithm::kRing ? ring(t, r, n - 1, (n - 1) / n * bytes) : nan;
    case Collective::kBroadcast:
    case Collective::kReduce: return algorithm == Algorithm::kRing ? ring(t, r, n - 1, bytes) : nan;
    case Collective::kAllToAll:
      // Each rank keeps 1/n, sends (R-1)/n to its node and the rest out;
      // its node's R ranks share the NICs.
      return algorithm == Algorithm::kDirect ? direct(t, r, (R - 1) / n * bytes, R * (n - R) / n * bytes) : nan;
    case Collective::kGather:
    case Collective::kScatter:
      // The root's links carry everyone else's share: the network what the
      // other nodes hold.
      return algorithm == Algorithm::kDirect ? direct(t, r, (R - 1) / n * bytes, (n - R) / n * bytes) : nan;
    case Collective::kSendRecv:
      if (algorithm != Algorithm::kDirect) return nan;
      // Across nodes one GPU gets its share of the node's NICs (one per GPU
      // on rail-optimised nodes).
      return t.nodes > 1 ? direct(t, r, 0, bytes * R) : direct(t, r, bytes, 0);
    case Collective::kBarrier: return nan;  // handled by the caller as a small all_reduce
  }
  return nan;
}

void check_topology(const Topology& t) {
  EMUGPU_CHECK(t.ranks_per_node >= 1 && t.ranks_per_node <= kMaxRanksPerNode, kValue, "topology: expected 1 to ",
               kMaxRanksPerNode, " ranks per node, got ", t.ranks_per_node);
  EMUGPU_CHECK(t.nodes >= 1 && t.nodes <= kMaxRanks / t.ranks_per_node, kValue, "topology: expected 1 to ",
               kMaxRanks / t.ranks_per_node, " nodes of ", t.ranks_per_node, " ranks, got ", t.nodes);
  const auto finite_non_negative = [](double v) { return std::isfinite(v) && v >= 0; };
  EMUGPU_CHECK(finite_non_negative(t.intra_latency_ns) && finite_non_negative(t.inter_latency_ns), kValue,
               "topology: expected finite non-negative latencies, got intra ", t.intra_latency_ns, " ns, inter ",
               t.inter_latency_ns, " ns");
  EMUGPU_CHECK(t.ranks_per_node == 1 || (std::isfinite(t.intra_bw) && t.intra_bw > 0), kValue,
               "topology: expected a positive intra-node bandwidth for ", t.ranks_per_node, " ranks per node, got ",
               t.intra_bw, " bytes/s");
  EMUGPU_CHECK(t.nodes == 1 || (std::isfinite(t.inter_bw) && t.inter_bw > 0), kValue,
               "topology: expected a positive network bandwidth for ", t.nodes, " nodes, got ", t.inter_bw, " bytes/s");
}

std::string normalized(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
  }
  return out;
}

constexpr std::array<Collective, 10> kCollectives{
    Collective::kAllReduce,     Collective::kBroadcast, Collective::kReduce, Collective::kAllGather,
    Collective::kReduceScatter, Collective::kAllToAll,  Collective::kGather, Collective::kScatter,
    Collective::kSendRecv,      Collective::kBarrier};

}  // namespace

Topology make_topology(const GpuSpec& gpu, int world, int ranks_per_node, const NetworkSpec& net) {
  EMUGPU_CHECK(ranks_per_node >= 1 && ranks_per_node <= kMaxRanksPerNode, kValue, "ranks_per_node: expected 1 to ",
               kMaxRanksPerNode, ", got ", ranks_per_node);
  EMUGPU_CHECK(world >= 1 && world <= kMaxRanks, kValue, "world size: expected 1 to ", kMaxRanks, " ranks, got ",
               world);
  // A world smaller than a node is one partly used node; a larger one must
  // fill whole nodes, as torchrun's --nproc-per-node does.
  EMUGPU_CHECK(world <= ranks_per_node || world % ranks_per_node == 0, kValue, "world size: expected a multiple of ",
               ranks_per_node, " ranks per node (whole nodes), got ", world);
  EMUGPU_CHECK(std::isfinite(net.bandwidth) && net.bandwidth > 0, kValue,
               "network bandwidth: expected a positive number of bytes/s, got ", net.bandwidth);
  EMUGPU_CHECK(std::isfinite(net.latency_us) && net.latency_us >= 0, kValue,
               "network latency: expected a non-negative number of microseconds, got ", net.latency_us);
  Topology t;
  t.ranks_per_node = std::min(world, ranks_per_node);
  t.nodes = world / t.ranks_per_node;
  t.nvlink = gpu.nvlink_bandwidth > 0;
  t.nvlink_line_bw = gpu.nvlink_bandwidth;
  // NVLink SHARP came with the third-generation NVSwitch (Hopper, sm_90).
  t.nvls = t.nvlink && gpu.major >= 9;
  t.intra_bw = t.nvlink ? gpu.nvlink_bandwidth * kNvlinkEfficiency : gpu.pcie_bandwidth();
  t.intra_latency_ns = t.nvlink ? kNvlinkHopNs : kPcieHopNs;
  t.inter_bw = net.bandwidth * kNetEfficiency;
  t.inter_latency_ns = net.latency_us * 1e3;
  return t;
}

double bus_factor(Collective kind, int ranks) {
  EMUGPU_CHECK(ranks >= 1, kValue, "ranks: expected 1 or more, got ", ranks);
  const double n = ranks;
  switch (kind) {
    case Collective::kAllReduce:
    case Collective::kBarrier: return 2 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
    case Collective::kGather:
    case Collective::kScatter: return (n - 1) / n;
    case Collective::kBroadcast:
    case Collective::kReduce:
    case Collective::kSendRecv: return 1;
  }
  return 1;
}

bool AlgorithmSet::allows(Algorithm a) const {
  switch (a) {
    case Algorithm::kRing: return ring;
    case Algorithm::kTree: return tree;
    case Algorithm::kNvls: return nvls;
    case Algorithm::kDirect: return true;
  }
  return false;
}

AlgorithmSet parse_algorithms(std::string_view text) {
  std::string_view rest = text;
  while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.front()))) rest.remove_prefix(1);
  const std::string whole = normalized(rest);
  if (whole.empty() || whole == "default") return {};
  const bool exclude = rest.front() == '^';
  if (exclude) rest.remove_prefix(1);
  AlgorithmSet named{false, false, false};
  while (true) {
    const size_t comma = rest.find(',');
    const std::string key = normalized(rest.substr(0, comma));
    if (key == "ring")
      named.ring = true;
    else if (key == "tree")
      named.tree = true;
    else if (key == "nvls" || key == "nvlstree")
      named.nvls = true;
    else if (key != "collnetdirect" && key != "collnetchain" && key != "collnet" && key != "pat") {
      const std::string shown(text.substr(0, 60));
      detail::throw_error(ErrorKind::kValue,
                          "NCCL_ALGO: expected a comma-separated list of Ring, Tree, NVLS, "
                          "NVLSTree, CollNetDirect, CollNetChain or PAT (a leading ^ excludes them), got '",
                          shown, "'");
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  AlgorithmSet out = named;
  if (exclude) out = {!named.ring, !named.tree, !named.nvls};
  EMUGPU_CHECK(out.ring || out.tree || out.nvls, kValue, "NCCL_ALGO: '", std::string(text.substr(0, 60)),
               "' leaves no algorithm this model has (Ring, Tree, NVLS); allow at least Ring");
  return out;
}

CollectiveCost collective_time(Collective kind, double bytes, const Topology& topo, const AlgorithmSet& allowed) {
  EMUGPU_CHECK(std::isfinite(bytes) && bytes >= 0 && bytes <= kMaxBytes, kValue, collective_name(kind),
               ": expected a size from 0 to 1e18 bytes, got ", bytes);
  check_topology(topo);
  CollectiveCost best;
  best.bus_factor = bus_factor(kind, topo.world());
  if (kind == Collective::kBarrier) {
    best = collective_time(Collective::kAllReduce, 4, topo, allowed);
    best.bus_factor = bus_factor(kind, topo.world());
    return best;
  }
  if (topo.world() == 1) {
    best.duration = static_cast<TimeNs>(kLaunchNs);  // a local copy at most, hidden behind the launch
    return best;
  }
  double best_ns = std::numeric_limits<double>::infinity();
  for (Algorithm a : {Algorithm::kRing, Algorithm::kTree, Algorithm::kDirect, Algorithm::kNvls}) {
    if (!allowed.allows(a)) continue;
    for (const auto& p : kProtocols) {
      // NCCL enables LL128 only where its stores stay ordered: NVLink.
      if (p.protocol == Protocol::kLL128 && !topo.nvlink) continue;
      const double ns = variant(kind, a, p.protocol, topo, rates(topo, p), bytes);
      if (std::isnan(ns) || ns >= best_ns) continue;
      best_ns = ns;
      best.algorithm = a;
      best.protocol = p.protocol;
    }
  }
  EMUGPU_CHECK(std::isfinite(best_ns), kValue, "NCCL_ALGO leaves ", collective_name(kind),
               " no algorithm (it runs as a ring); allow Ring");
  // Saturated, not wrapped: a slow network (EMUGPU_NET_GBPS near its
  // minimum) and a large size can take longer than a TimeNs holds.
  best.duration = ns_from_double(kLaunchNs + best_ns);
  return best;
}

Collective parse_collective(std::string_view name) {
  const std::string key = normalized(name);
  for (Collective c : kCollectives) {
    if (normalized(collective_name(c)) == key) return c;
  }
  if (key == "alltoallv" || key == "a2a") return Collective::kAllToAll;
  if (key == "send" || key == "recv" || key == "p2p") return Collective::kSendRecv;
  std::string choices;
  for (Collective c : kCollectives) choices += std::string(choices.empty() ? "" : ", ") + collective_name(c);
  const std::string shown(name.substr(0, 40));
  detail::throw_error(ErrorKind::kValue, "collective: expected one of ", choices, ", got '", shown,
                      name.size() > 40 ? "...'" : "'");
}

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kReduce: return "reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
    case Collective::kAllToAll: return "all_to_all";
    case Collective::kGather: return "gather";
    case Collective::kScatter: return "scatter";
    case Collective::kSendRecv: return "send_recv";
    case Collective::kBarrier: return "barrier";
  }
  return "?";
}

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kTree: return "tree";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kNvls: return "nvls";
  }
  return "?";
}

const char* protocol_name(Protocol protocol) {
  switch (protocol) {
    case Protocol::kLL: return "LL";
    case Protocol::kLL128: return "LL128";
    case Protocol::kSimple: return "Simple";
  }
  return "?";
}

}  // namespace emugpu
