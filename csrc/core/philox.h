// The state of a CUDA-style Philox generator as PyTorch's CUDA generator
// keeps it (a seed and a counter offset, 16 bytes in get_rng_state), and how
// much a random kernel advances the offset on a given GPU. DTensor's random
// ops and checkpointed RNG states read and write exactly this layout.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace emugpu {

struct PhiloxState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // counter offset per thread, a multiple of 4

  // Reserves `increment` counter values (rounded up to a multiple of 4, as
  // CUDA's generator does) and returns the offset the kernel starts from.
  uint64_t reserve(uint64_t increment);
};

// seed (little-endian uint64) then offset (int64): CUDA's get_rng_state().
constexpr size_t kPhiloxStateBytes = 16;
std::array<uint8_t, kPhiloxStateBytes> encode_philox_state(const PhiloxState& state);

// Accepts CUDA's two layouts: 16 bytes, or 8 (a seed alone; offset 0).
// Throws kRuntime (RuntimeError, as CUDA) for any other size or an offset that is not a multiple of 4.
PhiloxState decode_philox_state(const uint8_t* bytes, size_t size);

// Threads a streaming multiprocessor holds at once (maxThreadsPerMultiProcessor)
// for a compute capability: 1024 on Turing, 1536 on GA10x/AD10x/Blackwell
// consumer parts, 2048 otherwise.
int max_threads_per_sm(int major, int minor);

// How far one random kernel over `numel` elements advances the offset, as
// PyTorch's CUDA distribution kernels compute it: a grid-stride loop of
// 256-thread blocks (at most as many as the SMs hold at once), each thread
// drawing `unroll` values per Philox call (4 for 32-bit types, 2 for double),
// 4 offsets per call. 0 for an empty tensor.
uint64_t philox_increment(int64_t numel, int unroll, int sm_count, int threads_per_sm);

// A 64-bit seed for a host generator standing in for Philox at (seed,
// offset): equal states give equal values, nearby offsets unrelated ones.
uint64_t host_seed_for(uint64_t seed, uint64_t offset);

}  // namespace emugpu
