#include "philox.h"

#include <algorithm>

#include "error.h"

namespace emugpu {

namespace {

constexpr uint64_t kBlockSize = 256;

uint64_t read_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t PhiloxState::reserve(uint64_t increment) {
  const uint64_t start = offset;
  offset += (increment + 3) / 4 * 4;
  return start;
}

std::array<uint8_t, kPhiloxStateBytes> encode_philox_state(const PhiloxState& state) {
  std::array<uint8_t, kPhiloxStateBytes> out{};
  write_u64(out.data(), state.seed);
  write_u64(out.data() + 8, state.offset);
  return out;
}

PhiloxState decode_philox_state(const uint8_t* bytes, size_t size) {
  EMUGPU_CHECK(size == kPhiloxStateBytes || size == 8, kRuntime, "RNG state is wrong size: expected ",
               kPhiloxStateBytes, " bytes (seed and offset, as CUDA's generator) or 8 (a seed), got ", size,
               "; pass a state from get_rng_state() of an emugpu device");
  PhiloxState state;
  state.seed = read_u64(bytes);
  if (size == kPhiloxStateBytes) state.offset = read_u64(bytes + 8);
  EMUGPU_CHECK(state.offset % 4 == 0, kRuntime, "offset must be a multiple of 4 (as CUDA's Philox generator), got ",
               state.offset);
  return state;
}

int max_threads_per_sm(int major, int minor) {
  if (major == 7 && minor >= 5) return 1024;
  if ((major == 8 && minor >= 6) || major >= 12) return 1536;
  return 2048;
}

uint64_t philox_increment(int64_t numel, int unroll, int sm_count, int threads_per_sm) {
  if (numel <= 0) return 0;
  EMUGPU_CHECK(unroll >= 1 && sm_count >= 1 && threads_per_sm >= static_cast<int>(kBlockSize), kValue,
               "philox_increment expected unroll >= 1, sm_count >= 1 and threads_per_sm >= 256, got ", unroll, ", ",
               sm_count, ", ", threads_per_sm);
  const auto n = static_cast<uint64_t>(numel);
  const uint64_t resident_blocks =
      static_cast<uint64_t>(sm_count) * (static_cast<uint64_t>(threads_per_sm) / kBlockSize);
  const uint64_t grid = std::min(resident_blocks, (n + kBlockSize - 1) / kBlockSize);
  return ((n - 1) / (kBlockSize * grid * static_cast<uint64_t>(unroll)) + 1) * 4;
}

uint64_t host_seed_for(uint64_t seed, uint64_t offset) { return splitmix64(seed ^ splitmix64(offset)); }

}  // namespace emugpu
