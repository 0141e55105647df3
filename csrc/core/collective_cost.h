// Duration of NCCL-style collectives over a node/network topology: an
// alpha-beta model of ring, tree and (on Hopper NVSwitch nodes) NVLink-SHARP
// algorithms under the LL, LL128 and Simple protocols, picking the fastest
// the way NCCL's tuner does, among those NCCL_ALGO allows.
//
// Sizes follow nccl-tests (its doc/PERFORMANCE.md): `bytes` is the per-rank
// buffer for all_reduce, broadcast and reduce; the total output (n x the
// per-rank input) for all_gather and gather; the total input for
// reduce_scatter and scatter; the per-rank send buffer for all_to_all; the
// message for send/recv. Bus bandwidth = algbw x bus_factor, algbw = bytes /
// duration, so busbw of a well-fed link is the same whatever the collective.
#pragma once

#include <string>
#include <string_view>

#include "catalog.h"
#include "clock.h"

namespace emugpu {

enum class Collective {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kSendRecv,  // one message between two ranks (on different nodes when nodes > 1)
  kBarrier,   // an all_reduce of one float, as ProcessGroupNCCL does it
};

// kDirect: point-to-point (all_to_all, gather, send/recv); kNvls: the
// NVSwitch reduces (NVLink SHARP), across nodes with a tree over the network.
enum class Algorithm { kRing, kTree, kDirect, kNvls };
enum class Protocol { kLL, kLL128, kSimple };

// Inter-node network, per node: nominal rates as configured (config.h).
struct NetworkSpec {
  double bandwidth = 100e9;  // bytes/s per direction per node: 4 x 200 Gb/s InfiniBand HDR
  double latency_us = 3.0;   // one RDMA hop plus NCCL's proxy hand-off
};

// Effective rates the collective kernels reach (nominal rates times link
// efficiency, see make_topology), one hop's latency per link kind.
struct Topology {
  int ranks_per_node = 1;
  int nodes = 1;
  double intra_bw = 0;          // bytes/s per direction per GPU inside a node
  double intra_latency_ns = 0;  // one hop between two GPUs of a node
  bool nvlink = false;          // intra-node traffic rides NVLink/NVSwitch (else PCIe peer-to-peer)
  bool nvls = false;            // the NVSwitch can reduce (Hopper and later): NCCL's NVLS algorithm
  double nvlink_line_bw = 0;    // NVLink line rate per direction per GPU (NVLS is rated on it)
  double inter_bw = 0;          // bytes/s per direction per node, all its NICs together
  double inter_latency_ns = 0;  // one network hop
  int world() const { return ranks_per_node * nodes; }
};

// Topology of `world` ranks, `ranks_per_node` per node, on `gpu` (NVLink from
// the catalog, else PCIe) and `net`; throws kValue for counts that do not fit.
Topology make_topology(const GpuSpec& gpu, int world, int ranks_per_node, const NetworkSpec& net = {});

struct CollectiveCost {
  TimeNs duration = 0;  // ns, on every rank, from the last rank's start
  Algorithm algorithm = Algorithm::kRing;
  Protocol protocol = Protocol::kSimple;
  double bus_factor = 0;  // busbw = bytes / duration x bus_factor
};

// Which algorithms NCCL may use, as NCCL_ALGO sets them; point-to-point
// collectives (kDirect) are never restricted.
struct AlgorithmSet {
  bool ring = true, tree = true, nvls = true;
  bool allows(Algorithm a) const;
};

// NCCL_ALGO's syntax: "" or "default" for all; a comma-separated list
// ("Ring,Tree"); a leading '^' excludes the list. NCCL's other names
// (CollNetDirect, CollNetChain, PAT) parse and are ignored, NVLSTree is NVLS.
// Throws kValue naming the choices for anything else or an empty result.
AlgorithmSet parse_algorithms(std::string_view text);

// Fastest allowed algorithm/protocol for `kind` on `bytes` (nccl-tests' size
// convention above) over `topo`; throws kValue for a negative or non-finite
// size, an inconsistent topology, or a set that leaves `kind` no algorithm
// (NCCL fails such a call too).
CollectiveCost collective_time(Collective kind, double bytes, const Topology& topo, const AlgorithmSet& allowed = {});

// nccl-tests' bus-bandwidth factor of `kind` on `ranks` ranks.
double bus_factor(Collective kind, int ranks);

// "all_reduce", "allreduce" and "all-reduce" all parse; throws kValue naming the choices.
Collective parse_collective(std::string_view name);
const char* collective_name(Collective kind);
const char* algorithm_name(Algorithm algorithm);
const char* protocol_name(Protocol protocol);

}  // namespace emugpu
