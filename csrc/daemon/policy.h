// How emugpud divides a GPU's compute between the processes attached to it,
// as a pure function: the share of the GPU's speed that one process's
// kernels get, from what every process recently reported.
//
// Processes report how busy their compute engine was over a recent window
// (a fraction `busy`), not their kernels: the hot path stays local (and the
// handler counts a process only while its work may still run). A
// policy therefore answers in expectation. Treating the others' busy
// fractions as independent, the share a process gets while it has work is
//   E over the set S of others that have work at the same time [ share(S) ],
// exact over the 2^k sets for k <= kExactSharers others, and with the
// others' busy fractions as weights (mean field) beyond. What share(S) is
// depends on the policy:
//  - time-slice: the CUDA driver's default between contexts: round-robin
//    slices, so 1/(1+|S|) of the slices, each losing a context switch;
//  - fair: equal shares, switched at iteration boundaries (no switch loss);
//  - fifo: iteration-level first-come-first-served (GPEmu, Salus): each
//    process runs one iteration in turn, so it gets its iteration's share of
//    a round, iteration / (iteration + sum of the others' in S);
//  - priority: a process with work at a higher priority (EMUGPU_PRIORITY)
//    takes the GPU; equal priorities time-slice;
//  - mps: NVIDIA's Multi-Process Service: kernels of several processes run at
//    once (mps_share below);
//  - none: every process has the GPU to itself (memory is still shared).
// A share never drops below kMinShare: a starved process still progresses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "clock.h"

namespace emugpu::share {

enum class SharingPolicy { kNone, kTimeSlice, kFair, kFifo, kPriority, kMps };

SharingPolicy parse_sharing_policy(const std::string& name);  // throws (kValue) listing the valid names
const char* sharing_policy_name(SharingPolicy policy);

struct SharingConfig {
  SharingPolicy policy = SharingPolicy::kTimeSlice;
  TimeNs slice_ns = 2'000'000;  // time-slice: the length of a context's slice
  // What a context switch costs, state and caches together: fitted to our
  // H100's time-sliced pairs (benchmarks/collocation_emulated.py).
  TimeNs switch_ns = 200'000;  // time-slice
  // Processes report every report_ns of real time while they launch work, a
  // busy fraction averaged over window_ns of their clock; a report older
  // than stale_ns (real time) no longer counts (the process went quiet).
  TimeNs report_ns = 2'000'000;
  TimeNs window_ns = 500'000'000;
  TimeNs stale_ns = 5'000'000'000;
  // A process whose clock has not moved for patience_ns (real time) is not
  // waited for by the others' pacing (the clients give up on it after as
  // long: DaemonTimeShare::kPatience).
  TimeNs patience_ns = 1'000'000'000;
  // mps: the fraction of the SMs a running kernel holds that a concurrent
  // kernel of another process still gets (blocks of both resident on one SM,
  // the idle pipes and tails of waves): fitted to our H100's MPS pairs
  // (benchmarks/collocation_emulated.py).
  double mps_overlap = 0.15;
};

// What a process reported about its compute on one GPU.
struct Sharer {
  double busy = 0;          // [0, 1]
  TimeNs iteration_ns = 0;  // its compute between host waits, alone on the GPU
  int32_t priority = 0;
  double demand = 1;     // mps: the fraction of the GPU's SMs its kernels hold while they run
  TimeNs kernel_ns = 0;  // mps: the length of its kernel running at a random moment, alone
};

constexpr double kMinShare = 0.01;
constexpr size_t kExactSharers = 12;

// MPS. The GPU's block scheduler hands SMs to the kernels in the order they
// were launched: a kernel that started earlier keeps the SMs it holds (its
// demand), a later one gets what is left, and runs at (left / its demand)
// of its speed alone, never faster than alone. Of the others in S with work,
// another's current kernel started before this one's with probability
// L_j / (L_j + L_me) (L: the length of the kernel running at a random
// moment), so long kernels (big convolutions) hold the GPU more often than
// short ones (depthwise, elementwise). Older kernels hold their demand less
// the overlap a concurrent kernel still finds on their SMs (mps_overlap).
// One resource (SMs): two kernels that each saturate the memory bandwidth
// with few SMs are not slowed by each other here.

// The fraction of the GPU's speed `me` gets while it has work, in [kMinShare, 1].
double compute_share(const SharingConfig& config, const Sharer& me, const std::vector<Sharer>& others);

}  // namespace emugpu::share
