// An MPS client's limits (NVIDIA's Multi-Process Service): the share of a
// GPU's SMs its kernels may use (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and the
// device memory it may allocate (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT). They
// apply only to processes attached to an emugpud that shares by MPS, as
// CUDA applies them only to clients of an MPS server.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "catalog.h"

namespace emugpu {

// A percentage in (0, 100]; throws kValue naming `source`.
double parse_active_thread_percentage(const std::string& text, const std::string& source);

// "0=1G,1=512M": a device ordinal (after visible-device selection) and a
// size with a unit (K, M, G or T, powers of 1024; "MB" and "GiB" as well).
// Throws kValue naming `source`.
std::map<int, uint64_t> parse_pinned_mem_limit(const std::string& text, const std::string& source);

// `gpu` as an MPS client sees it: its SMs capped at `percent` (rounded up,
// at least one) with its peak FLOP/s scaled alike (and its GPU as its
// parent_name, as a MIG instance's), and what it may allocate
// capped at `memory_limit` bytes (0: no cap). The bandwidth stays the
// GPU's: MPS partitions SMs, not memory controllers.
GpuSpec mps_client_spec(const GpuSpec& gpu, double percent, uint64_t memory_limit);

}  // namespace emugpu
