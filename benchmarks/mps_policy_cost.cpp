// What one share report costs emugpud under --sharing mps, against the same
// report under time slicing, in the same process: each asks compute_share
// for a process among N identical ones whose kernels fall in six of the
// eight classes (the most a training job fills in practice), N - 1 = 1..7
// others. Up to three others the MPS expectation is exact (every
// combination of the others' kernels and every dispatch order), beyond
// that a mean field.
//
//     build/core/emugpud_policy_cost [REPETITIONS]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "daemon/policy.h"

namespace {

using emugpu::share::compute_share;
using emugpu::share::Sharer;
using emugpu::share::SharingConfig;
using emugpu::share::SharingPolicy;

// Microseconds per compute_share call, and the share it answered.
std::pair<double, double> time_share(const SharingConfig& config, const Sharer& me, const std::vector<Sharer>& others,
                                     int repetitions) {
  double sum = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < repetitions; ++r) sum += compute_share(config, me, others);
  const std::chrono::duration<double, std::micro> spent = std::chrono::steady_clock::now() - start;
  return {spent.count() / repetitions, sum / repetitions};
}

}  // namespace

int main(int argc, char** argv) {
  const int repetitions = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (repetitions <= 0) {
    std::fprintf(stderr, "expected a number of repetitions > 0, got '%s'\n", argv[1]);
    return 2;
  }
  Sharer job{0.9, 0, 0, 0.8, 20'000, {}};
  for (int i = 0; i < emugpu::kDemandBins; ++i) {
    if (i % emugpu::kSmBins == 0) continue;  // six classes: the three upper SM quarters, bandwidth-bound or not
    const bool bound = i >= emugpu::kSmBins;
    job.bins[static_cast<size_t>(i)] = {1.0 / 6, 0.25 * (i % emugpu::kSmBins) + 0.1, 5'000 + 10'000 * (i % 4), 200'000,
                                        bound ? 0.8 : 0.2};
  }
  SharingConfig mps, slice;
  mps.policy = SharingPolicy::kMps;
  slice.policy = SharingPolicy::kTimeSlice;
  std::printf("%7s %12s %14s %10s %9s\n", "others", "mps us", "time-slice us", "mps/slice", "mps share");
  for (size_t n = 1; n <= 7; ++n) {
    const std::vector<Sharer> others(n, job);
    const auto [mps_us, share] = time_share(mps, job, others, repetitions);
    const auto [slice_us, unused] = time_share(slice, job, others, repetitions);
    std::printf("%7zu %12.2f %14.3f %9.0fx %9.3f\n", n, mps_us, slice_us, mps_us / slice_us, share);
  }
  return 0;
}
