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
//  - none: every process has the GPU to itself (memory is still shared);
//  - custom: a shared library's or a program's function of the raw reports
//    (custom_policy.h), which then answers for the expectation itself.
// A share never drops below kMinShare: a starved process still progresses.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "clock.h"
#include "time_share.h"

namespace emugpu::share {

enum class SharingPolicy { kNone, kTimeSlice, kFair, kFifo, kPriority, kMps, kCustom };

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
  // A process whose clock has not moved during patience_ns (real time) of
  // the others' pacing waiting on it is not waited for again until it moves
  // (the clients give up on it after as long: DaemonTimeShare::kPatience).
  TimeNs patience_ns = 1'000'000'000;
  // mps: the fraction of the SMs a running kernel holds that a concurrent
  // kernel of another process still gets (blocks of both resident on one
  // SM, the pipes the first leaves idle). 0: the tails of waves, which the
  // model counts by itself, fit our H100's identical MPS pairs within 4.5%
  // (benchmarks/collocation_emulated.py, docs/gpu-sharing.md).
  double mps_overlap = 0.0;
  // kCustom: a policy from outside the daemon's core (custom_policy.h) and
  // its --sharing spec, which processes see as the daemon's policy.
  std::function<double(const struct Sharer&, const std::vector<struct Sharer>&)> custom;
  std::string custom_name;
  std::string name() const;
};

// What a process reported about its compute on one GPU.
struct Sharer {
  double busy = 0;          // [0, 1]
  TimeNs iteration_ns = 0;  // its compute between host waits, alone on the GPU
  int32_t priority = 0;
  double demand = 1;   // mps: the fraction of the GPU's SMs its kernels hold while they run
  TimeNs hold_ns = 0;  // mps: how long its kernels' blocks hold an SM
  // mps: its kernels by demand (time_share.h); all fractions 0: its means
  // stand for every kernel.
  DemandHistogram bins{};
};

constexpr double kMinShare = 0.01;
constexpr size_t kExactSharers = 12;

// MPS. Kernels of several processes run at once. Those that together need
// fewer SMs than the GPU has run side by side; beyond that their blocks are
// dispatched in an order (each order as likely) and each kernel gets the
// SMs those ahead of it leave. The model runs over kernels, not processes:
// a process's kernels come in classes (its demand histogram), and for each
// class of this process's kernels the expectation runs over what each other
// process is doing (no work, or a kernel of one of its classes, by its share
// of that process's kernel time) and over the orders of the kernels
// running. A kernel gets what those ahead leave, at min(1, left / its
// demand) of its speed alone; held SMs leave a fraction (mps_overlap) of
// their throughput to a concurrent kernel. Memory bandwidth is the second
// resource: every running kernel draws its share of the peak (one behind at
// its reduced speed), and where they draw more than the peak together, each
// is slowed by that total. Per class the speed is that expectation, and the
// process's share its kernel time alone over its expected time shared.
// Exact while the others' combinations times their orders number at most
// kExactMpsStates; beyond, a mean field: the others' kernels as one average
// kernel, as many running as the others' busy fractions add up to, this one
// behind each number of them alike.
constexpr size_t kExactMpsStates = 4096;

// The fraction of the GPU's speed `me` gets while it has work, in [kMinShare, 1].
double compute_share(const SharingConfig& config, const Sharer& me, const std::vector<Sharer>& others);

}  // namespace emugpu::share
