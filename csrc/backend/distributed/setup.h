// How a process group of backend `emu` comes up: torchrun's layout checked
// against the emulated devices, fresh store keys per group instance (torchrun
// keeps its store across restarts), the transports, where each rank runs (its
// node and its clock) and the offsets between clocks that differ.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/exchange/clock_offset.h"
#include "core/exchange/shm_exchange.h"
#include "core/exchange/tcp_transport.h"

namespace emugpu {

// Each of a node's LOCAL_WORLD_SIZE ranks drives its own GPU,
// emugpu:LOCAL_RANK (NCCL refuses two ranks on one GPU), and the world is
// whole nodes; checked before any rendezvous, so every rank fails at once.
void check_layout(int size);

// A key prefix no earlier instance of this group used, the same on every
// rank: rank 0 draws it and hands it to each rank that asks with a nonce of
// its own (a key only this attempt can have written).
std::string fresh_namespace(c10d::Store& store, int rank, int size, std::chrono::milliseconds timeout);

// The local address from which this host reaches the group's TCPStore (one
// the other nodes reach too); loopback for a store on this machine; the
// hostname's address without a TCPStore.
std::string listen_address(const c10::intrusive_ptr<c10d::Store>& store);

// The shared-memory transport where every rank of the group shares this
// machine (and EMUGPU_EXCHANGE allows it), else null; EMUGPU_EXCHANGE=shm
// makes "else" an error. The segment's name is removed once every rank
// opened it, so no crash leaves it behind.
std::shared_ptr<ShmExchange> shared_memory(c10d::Store& store, int rank, int size, Transport& tcp,
                                           std::chrono::nanoseconds timeout);

// Which node this rank runs on (torchrun's GROUP_RANK), -1 where no launcher says.
int64_t node_key();
// Equal for processes that read the same CLOCK_MONOTONIC: one boot of one
// kernel and one time namespace.
int64_t clock_key();

struct GroupTopology {
  int ranks_per_node;
  int nodes;
};
// The cost model's topology from every rank's node key: by node, so a
// subgroup that spans nodes pays the network and one within a node does not.
GroupTopology topology(const std::vector<int64_t>& nodes_of_ranks, int size);

// This rank's steady clock minus rank 0's: 0 where both read one clock, else
// measured once per clock by its first rank against rank 0, so ranks that
// share a clock share its offset.
TimeNs align_clocks(TcpTransport& tcp, Transport& words, const std::vector<int64_t>& clock_keys, int rank,
                    std::chrono::nanoseconds timeout);

// An all-gather of a few words during set-up, every rank's row after the
// other; a rank that left or never came is a DistBackendError naming `what`.
std::vector<int64_t> gather_setup_words(Transport& transport, const std::vector<int64_t>& words,
                                        std::chrono::nanoseconds timeout, const std::string& what);

}  // namespace emugpu
