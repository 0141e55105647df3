#include "philox.h"

#include <gtest/gtest.h>

#include "error.h"

namespace {

using emugpu::PhiloxState;

TEST(Philox, ReserveRoundsIncrementsUpToMultiplesOfFour) {
  PhiloxState s{7, 0};
  EXPECT_EQ(s.reserve(4), 0u);
  EXPECT_EQ(s.reserve(1), 4u);  // 1 takes 4
  EXPECT_EQ(s.reserve(6), 8u);  // 6 takes 8
  EXPECT_EQ(s.offset, 16u);
  EXPECT_EQ(s.seed, 7u);
}

TEST(Philox, StateRoundTripsThroughCudasSixteenByteLayout) {
  const PhiloxState s{0x0102030405060708ULL, 0x40};
  const auto bytes = emugpu::encode_philox_state(s);
  EXPECT_EQ(bytes[0], 0x08);  // little-endian seed first
  EXPECT_EQ(bytes[8], 0x40);  // then the offset
  const PhiloxState back = emugpu::decode_philox_state(bytes.data(), bytes.size());
  EXPECT_EQ(back.seed, s.seed);
  EXPECT_EQ(back.offset, s.offset);
}

TEST(Philox, EightByteStateIsASeedWithOffsetZero) {
  const auto bytes = emugpu::encode_philox_state(PhiloxState{99, 12});
  const PhiloxState back = emugpu::decode_philox_state(bytes.data(), 8);
  EXPECT_EQ(back.seed, 99u);
  EXPECT_EQ(back.offset, 0u);
}

TEST(Philox, WrongSizesAndUnalignedOffsetsAreRefused) {
  const auto bytes = emugpu::encode_philox_state(PhiloxState{1, 6});
  try {
    emugpu::decode_philox_state(bytes.data(), 5056);
    FAIL() << "a CPU generator's state was accepted";
  } catch (const emugpu::Error& e) {
    EXPECT_EQ(e.kind(), emugpu::ErrorKind::kRuntime);  // RuntimeError, as CUDA's
    EXPECT_NE(std::string(e.what()).find("got 5056"), std::string::npos) << e.what();
  }
  EXPECT_THROW(emugpu::decode_philox_state(bytes.data(), bytes.size()), emugpu::Error);  // offset 6
}

TEST(Philox, IncrementFollowsCudasGridStridePolicy) {
  // H100 SXM: 132 SMs of 2048 threads hold 1056 blocks of 256.
  EXPECT_EQ(emugpu::philox_increment(0, 4, 132, 2048), 0u);
  EXPECT_EQ(emugpu::philox_increment(1, 4, 132, 2048), 4u);
  EXPECT_EQ(emugpu::philox_increment(1056 * 256 * 4, 4, 132, 2048), 4u);  // one draw of 4 per thread
  EXPECT_EQ(emugpu::philox_increment(1056 * 256 * 4 + 1, 4, 132, 2048), 8u);
  EXPECT_EQ(emugpu::philox_increment(1056 * 256 * 4, 2, 132, 2048), 8u);  // doubles: 2 per draw
  // Fewer SMs: more loop iterations for the same tensor.
  EXPECT_GT(emugpu::philox_increment(1 << 26, 4, 40, 1024), emugpu::philox_increment(1 << 26, 4, 132, 2048));
}

TEST(Philox, ThreadsPerSmFollowTheArchitecture) {
  EXPECT_EQ(emugpu::max_threads_per_sm(7, 5), 1024);  // T4
  EXPECT_EQ(emugpu::max_threads_per_sm(8, 0), 2048);  // A100
  EXPECT_EQ(emugpu::max_threads_per_sm(8, 6), 1536);  // A10, A40
  EXPECT_EQ(emugpu::max_threads_per_sm(8, 9), 1536);  // L4
  EXPECT_EQ(emugpu::max_threads_per_sm(9, 0), 2048);  // H100
}

TEST(Philox, HostSeedsDependOnSeedAndOffset) {
  EXPECT_EQ(emugpu::host_seed_for(1, 8), emugpu::host_seed_for(1, 8));
  EXPECT_NE(emugpu::host_seed_for(1, 8), emugpu::host_seed_for(1, 12));
  EXPECT_NE(emugpu::host_seed_for(1, 8), emugpu::host_seed_for(2, 8));
}

}  // namespace
