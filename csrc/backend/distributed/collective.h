// Collectives of the torch.distributed backend `emu` (torch_emugpu/distributed):
// the timeline side. Python exchanges the ranks' start times and moves the
// real bytes; this file only reads and charges the emulated devices.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "core/clock.h"
#include "core/pending_writes.h"

namespace emugpu {

// When a collective launched now on `device`'s current stream would start
// there (rank r's t_r): the stream, the collective engine and the host
// reached it. Ranks exchange this value.
TimeNs collective_begin(int device);
// Enqueues the collective on `device`'s current stream from `start` (the
// latest t_r over ranks) for `duration`; later work on the stream waits for
// it, the host does not. Returns its end (the same on every rank).
TimeNs collective_end(int device, TimeNs start, TimeNs duration);
// Modelled duration of `kind` (core/collective_cost.h names and size
// conventions) over `world` ranks, `ranks_per_node` per node, on `device`'s
// GPU and the configured network.
TimeNs collective_duration(int device, const std::string& kind, double bytes, int world, int ranks_per_node);

// A CPU tensor over `t`'s bytes, charged nothing: the emulation's own data
// movement (the bytes ranks exchange) is no work of the emulated GPU. The
// caller keeps `t` alive while it uses the alias.
at::Tensor collective_host_view(const at::Tensor& t);
// The storages whose bytes collectives still read or write on their group's
// runner (core/pending_writes.h), keyed by StorageImpl: one per process.
PendingWrites& pending_writes();
// Returns once no collective launched before still reads or writes `t`'s
// storage: what touches a tensor's bytes or its real-bytes flag on the host
// (ops, copies, .item(), the exchange) calls it first, as stream order
// would make it wait on a GPU. Cheap when none is pending; may raise the
// collective's error.
void await_collective_writes(const at::Tensor& t);
void await_collective_writes(const c10::Storage& storage);
bool tensor_materialized(const at::Tensor& t);
void set_tensor_materialized(const at::Tensor& t, bool value);

}  // namespace emugpu
