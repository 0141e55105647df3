// One emulated GPU: its memory, its cost model, its timeline and its
// profiled regions. Every piece of work is charged through launch(), and the
// host blocks only in the wait calls, so collectives, copies, preprocessing
// and other processes all meet on one timeline with one set of invariants:
//
// - work on a stream runs in launch order; the compute engine runs one
//   kernel at a time, the two copy engines overlap it;
// - the host runs at most `queue_depth` unfinished launches ahead;
// - a profiled region ends at its start plus its profiled time unless the
//   host launched its work later than that (regions.h); a region that follows
//   a complete one starts where it ended, so an iteration is its profiled
//   regions back to back;
// - every host wait first closes a backward + update region whose backward
//   ran, so the loop's sync point sees the full iteration;
// - a stream that waits for a time not known yet (a deferred collective's
//   end, pending_time.h) holds the device: its later launches, waits, event
//   records and region steps, on every stream, queue in host order with
//   their host times and are placed as they would have been once that time
//   is known. The host blocks for it only where it blocks anyway (host
//   waits, a full launch queue) or where it needs a time only it gives (an
//   event's time read, a collective's start).
//
// Thread-safe: autograd's device threads and the host thread share it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "batch_curve.h"
#include "caching_allocator.h"
#include "catalog.h"
#include "clock.h"
#include "cost_ledger.h"
#include "cost_model.h"
#include "host_bound.h"
#include "pcie_links.h"
#include "pending_time.h"
#include "regions.h"
#include "time_share.h"

namespace emugpu {

// What CUDA keeps out of cudaMalloc's reach on every GPU (its context).
constexpr uint64_t kCudaContextBytes = 300ull << 20;
// What cudaMalloc can hand out on `gpu`: its memory less the context's.
inline uint64_t usable_memory_bytes(const GpuSpec& gpu) {
  return gpu.memory_bytes > kCudaContextBytes ? gpu.memory_bytes - kCudaContextBytes : gpu.memory_bytes;
}
// CUDA's stream pool: 32 streams per priority, handed out round robin.
constexpr int64_t kPoolStreams = 32;

class Device {
 public:
  Device(int index, const GpuSpec& gpu, Clock& clock = steady_clock(), size_t queue_depth = 1024,
         CostModelParams cost = {});
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int index() const { return index_; }
  const GpuSpec& gpu() const { return gpu_; }
  CachingAllocator& allocator() { return allocator_; }
  CostModel& cost() { return cost_; }
  const CostModel& cost() const { return cost_; }
  CostLedger& ledger() { return ledger_; }
  Clock& clock() { return clock_; }

  // Enqueues work whose cost-model duration is `estimate`; compute work in a
  // profiled region is re-timed. Blocks only while the launch queue is full.
  // Returns the time the work ends on the device, or kNotYet while the
  // device is held (it is placed later).
  // `occupancy`: what compute work holds of the GPU (cost_model.h), for MPS.
  static constexpr TimeNs kNotYet = -1;
  TimeNs launch(int64_t stream, Engine engine, TimeNs estimate, Occupancy occupancy = {});

  // Emulates a host that spends `ns` per op it launches (Python, framework,
  // driver): pace_host(), called before such a launch, returns at least `ns`
  // after the previous call in host time, waiting out what this host did
  // faster. 0: this host's own pace.
  void set_host_pace(TimeNs ns);
  TimeNs host_pace() const { return host_pace_.load(); }
  void pace_host();

  // Host<->device copies of this GPU cross `uplink` of `links`, shared with
  // other GPUs: each occupies it for its duration x `occupancy_factor` (the
  // GPU's link rate over the uplink's) and lasts at least that long.
  // Set before the device is used.
  void attach_pcie(std::shared_ptr<PcieLinks> links, int uplink, double occupancy_factor);

  // The GPU's compute is shared with other processes (time_share.h): compute
  // work runs at the share `share` grants, which the device renews as it
  // launches; a profiled region's time stretches by the share at its start.
  // Copies and collectives keep their engines' full rates. Set before the
  // device is used; nullptr: the GPU is this process's alone.
  void share_time(std::shared_ptr<TimeShare> share);
  // The share of the GPU's speed compute work launched now gets.
  double compute_share() const { return rate_.load(std::memory_order_relaxed); }

  // A collective across ranks (backend `emu`), in two steps. collective_start
  // is when the collective launched now on `stream` would start on this device
  // (the stream, the collective engine and the host all reached it): ranks
  // exchange it. collective_launch enqueues it on `stream` from `start` (the
  // latest over ranks; possibly in the host's past: it may be placed when the
  // last rank's start arrives) for `duration` on the collective engine, never re-timed
  // by a profiled region (its time belongs to the network, not the model).
  // Blocks only while the launch queue is full. Returns its end.
  // Blocks while held work launched before it waits for a time not known
  // yet (forcing it): call it from the thread that launches the collective.
  TimeNs collective_start(int64_t stream);
  // `waiter` waits for an event on `stream` now (NCCL's stream follows the
  // caller's); returns that event's time, known later while the device is
  // held. Blocks only while held work fills the launch queue: call it from
  // the launching thread. `settles`: the event is a sync point (see
  // settle()); false for a collective that autograd launches inside the
  // backward (DDP's buckets), which belongs to the backward region.
  std::shared_ptr<PendingTime> follow(int64_t waiter, int64_t stream, bool settles = true);
  // collective_start for a collective launched at `host_time` whose
  // follow() time is known: work held after it does not count.
  TimeNs collective_start_at(int64_t stream, TimeNs host_time);
  TimeNs collective_launch(int64_t stream, TimeNs start, TimeNs duration);

  // Host waits. Each is a sync point: it first closes a finished backward +
  // update region (see settle()).
  void synchronize();
  void synchronize_stream(int64_t stream);
  // A blocking launch (a D2H copy, .item(), a pageable H2D copy): settle,
  // launch, wait for it.
  TimeNs launch_and_wait(int64_t stream, Engine engine, TimeNs estimate);
  // Blocks until `t` (an event's time).
  void wait_until(TimeNs t);
  // A sync point with no wait of its own.
  void settle();

  // Events: the time `stream` reaches now (closing a finished backward
  // region first: an event after optimizer.step() sees the whole step).
  // record() blocks while the device is held; record_pending() does not:
  // its time becomes known when the held work is placed (forcing it resolves
  // this device). `settles` false: not a sync point (an event that a
  // backward hook records belongs to the backward region).
  TimeNs record(int64_t stream);
  std::shared_ptr<PendingTime> record_pending(int64_t stream, bool settles = true);
  // Where `stream`'s work launched so far ends (no sync point), known later if held.
  std::shared_ptr<PendingTime> stream_ready_pending(int64_t stream);
  // A profiled region on `stream` budgets a wait for a collective's end
  // (work no profile measured: regions.h); waits for work its own profile
  // covers (DataParallel's replicas, copies between its devices, the loop's
  // streams) do not move its end.
  void stream_wait(int64_t stream, TimeNs t);
  // Later work on `stream` waits for `t`; while `t` is not known the device
  // is held (see the file comment).
  void stream_wait(int64_t stream, const std::shared_ptr<PendingTime>& t);
  // Forces every pending time the device's held work waits for and places
  // that work (blocks). A pending time whose force throws counts as 0 (its
  // wait is dropped) and the error propagates.
  void resolve();
  // As resolve(), until `target` (a time this device's held work sets) is known.
  void resolve_until(const PendingTime* target);
  // Places the held work that can be placed now, without blocking; returns
  // whether the device is still held.
  bool poll();
  bool held() const;
  bool reached(TimeNs t) const { return clock_.now() >= t; }
  // Both resolve first.
  TimeNs stream_ready(int64_t stream);
  TimeNs device_ready();

  // Profiled regions, driven by the model-level planner. A forward begins
  // (closing what was open; a backward region whose backward never ran is
  // cancelled, not padded) and ends, opening its backward + update region if
  // autograd will run; backward_reached() says autograd reached the model.
  // `called_at` is when the host called the model (its own Python overhead
  // before the first kernel belongs to the forward, as in a profile measured
  // synchronized); 0 for now. Returns how many region occurrences so far were
  // host-bound.
  int64_t forward_begin(int64_t stream, const std::string& key, TimeNs target, TimeNs called_at = 0);
  void forward_end(int64_t stream, const std::string& backward_key, TimeNs backward_target, bool expects_backward);
  void backward_reached(int64_t stream, const std::string& backward_key, TimeNs backward_target);
  // An exception inside a region: closes it without a pad.
  void region_abort();
  std::vector<RegionReport> region_report() const;
  // The cost model's time of region `key` as a function of batch size, from
  // its last complete occurrence, run at `observed_batch`; nullopt before one
  // completed (a close still held counts as not yet).
  std::optional<BatchCostCurve> region_cost_curve(const std::string& key, int64_t observed_batch) const;

  // Statistics.
  EngineStats engine_stats(Engine engine) const;
  TimeNs host_blocked_ns() const;
  // Whether the device sat idle waiting for the host (host_bound.h), judged
  // at host waits (reset_stats starts the windows over); host_idle_ns is the
  // total idle time so far.
  HostBoundStats host_bound_stats() const;
  TimeNs host_idle_ns() const;
  // Percent of the last second (host time) the compute engine was busy, as
  // nvmlDeviceGetUtilizationRates reports it.
  int utilization() const;
  void reset_stats();

  // The next stream of the pool (ids 1..32 low priority, 33..64 high).
  int64_t pool_stream(bool high_priority);

 private:
  // Work queued while the device is held: `apply` runs under the lock with
  // its host time once every earlier entry ran and `gate` (if any) is known.
  struct Held {
    TimeNs host_time;
    std::shared_ptr<PendingTime> gate;
    std::function<void(TimeNs)> apply;
  };
  // Runs the held work that can run now; returns whether the device is still held.
  bool replay_locked();
  // Replays, then whether held work fills the launch queue (it counts as launched).
  bool held_queue_full_locked();
  // Runs `apply` now, or queues it while the device is held.
  template <typename Apply>
  void apply_or_hold_locked(TimeNs now, Apply&& apply);
  TimeNs launch_locked(int64_t stream, Engine engine, TimeNs estimate, TimeNs now, Occupancy occupancy = {});
  // point(host time) under the lock: now, or when the held work reaches it.
  template <typename Point>
  std::shared_ptr<PendingTime> pending_point(Point&& point);
  void settle_locked(TimeNs now);
  // `stream` waits for `t` (see stream_wait).
  void wait_locked(int64_t stream, TimeNs t);
  // Whether `t` is one of the latest collective ends (or of side-stream work
  // that began at one: place_locked).
  bool collective_end(TimeNs t) const;
  void remember_collective_end(TimeNs t);
  TimeNs place_locked(int64_t stream, Engine engine, TimeNs start, TimeNs duration, TimeNs now);
  // Calls place(now) under the lock once the launch queue has room, blocking
  // while it is full (of placed work, or of held work when `count_held`).
  template <typename Place>
  TimeNs place_when_queued(Place&& place, bool count_held = true);
  // Returns whether a region closed complete.
  bool close_locked(RegionOutcome outcome, TimeNs now);
  // A chained region starts where the one before ended; otherwise at `host_time`.
  void open_locked(int64_t stream, const std::string& key, RegionKind kind, TimeNs target, bool started, bool chained,
                   TimeNs now, TimeNs host_time = 0);
  void forward_begin_locked(int64_t stream, const std::string& key, TimeNs target, TimeNs called_at, TimeNs now);
  void forward_end_locked(int64_t stream, const std::string& backward_key, TimeNs backward_target,
                          bool expects_backward, TimeNs now);
  void backward_reached_locked(int64_t stream, const std::string& backward_key, TimeNs backward_target, TimeNs now);
  void block_until(TimeNs t);
  // Renews the compute share when a report is due (outside the lock: a round trip).
  void report_share();
  TimeShare::Report share_report_locked(TimeNs now);
  // `estimate` of compute work at the current share.
  TimeNs shared_locked(TimeNs estimate) const;

  const int index_;
  const GpuSpec& gpu_;
  Clock& clock_;
  CachingAllocator allocator_;
  CostModel cost_;
  CostLedger ledger_;

  mutable std::mutex mutex_;
  Timeline timeline_;
  std::deque<Held> held_;
  Regions regions_;
  static constexpr size_t kCollectiveEnds = 256;  // more than DDP's buckets or FSDP's groups per step
  std::deque<TimeNs> collective_ends_;            // the latest ones placed (collective_end)
  std::deque<std::pair<TimeNs, TimeNs>> busy_;    // recent compute intervals, merged
  TimeNs blocked_ns_ = 0;
  HostBoundMonitor host_bound_;
  int64_t next_pool_[2] = {0, 0};
  std::shared_ptr<PcieLinks> pcie_;
  int uplink_ = 0;
  double occupancy_factor_ = 1.0;
  std::atomic<TimeNs> host_pace_{0};
  std::atomic<TimeNs> last_launch_{0};  // host time of the last pace_host()
  std::shared_ptr<TimeShare> share_;
  std::atomic<double> rate_{1.0};
  std::atomic<TimeNs> next_report_{0};        // real time
  std::atomic<TimeNs> next_report_clock_{0};  // clock time
  std::atomic<bool> reporting_{false};
  TimeNs share_from_ = 0;  // clock time of the last report
  double busy_average_ = 0;
  double unweighted_ = 1.0;
  TimeNs iteration_average_ = 0;
  TimeNs work_since_wait_ = 0;  // compute work on the GPU alone since the last sync point
  // Compute launched on the GPU alone, decayed as busy_average_ is: sums of
  // Per demand bin (time_share.h), d, demand * d, hold * d, d * d and
  // bandwidth * d over its kernels of duration d: their time-weighted means
  // go to MPS.
  std::array<double, kDemandBins> kernel_sum_{}, demand_sum_{}, hold_sum_{}, duration_sum_{}, bandwidth_sum_{};
};

}  // namespace emugpu
