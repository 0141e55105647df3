// Profiled regions: a model's forward, and its backward + update, each
// charged exactly its measured time.
//
// A region opened at device time S with target t must end at S + t, unless
// the host itself keeps the device idle past that point (host-bound: its last
// work is launched after S + t). Compute work inside the region is re-timed
// as it is launched: each op gets its share of the budget still left, in
// proportion to its cost-model estimate against the estimate still expected
// (learnt from the key's recent complete occurrences), so host gaps early
// in the region shrink the ops after them; a small reserve is kept for more
// work than expected, and what is still missing when the region closes is
// charged as one pad. A wait for work outside the region (a collective, a
// copy on another stream) that a GPU at the profile's pace would still be
// waiting for moves the region's end: its remaining work keeps its profiled
// share (a single-GPU profile measured no such wait).
// Not thread-safe: Device serialises every call.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "clock.h"

namespace emugpu {

enum class RegionKind { kForward, kBackward };

// The target of a model's region that no profile covers: its ops keep their
// cost-model times (no re-timing, no pad), and the region only records how
// long its work took on the device, for region_report().
constexpr TimeNs kUnbudgeted = -1;

// How a region closed: with its full time, given up before its work ran (a
// backward region whose backward never came), or cut short by an exception.
enum class RegionOutcome { kCompleted, kCancelled, kAborted };

struct RegionReport {
  std::string key;
  RegionKind kind = RegionKind::kForward;
  TimeNs target = 0;        // profiled time (kUnbudgeted: cost model)
  TimeNs last_time = 0;     // device time of the last complete occurrence
  TimeNs charged = 0;       // by its ops, re-timed (last complete occurrence)
  TimeNs estimated = 0;     // by its ops, cost model (last complete occurrence)
  TimeNs padded = 0;        // pad at its end (last complete occurrence)
  TimeNs waited = 0;        // its end moved by waits (last complete occurrence)
  TimeNs worst_excess = 0;  // largest overrun of target + waited seen (host-bound)
  int64_t occurrences = 0;  // complete ones
  int64_t host_bound = 0;   // complete occurrences that overran their target
  int64_t cancelled = 0;
  int64_t aborted = 0;
};

class Regions {
 public:
  bool active() const { return active_; }
  // Active and profiled (its end moves with waits; a cost-model region's does not).
  bool budgeted() const { return active_ && target_ != kUnbudgeted; }
  const std::string& key() const { return key_; }
  RegionKind kind() const { return kind_; }
  // A backward region has started once autograd reached its model.
  bool started() const { return started_; }
  void mark_started() { started_ = true; }
  int64_t stream() const { return stream_; }
  // The stream it opened on (the model's): where its own work waits.
  int64_t home_stream() const { return home_stream_; }

  // Opens `key`; its work starts on the device at `start`.
  void open(const std::string& key, RegionKind kind, TimeNs target, TimeNs start, int64_t stream, bool started);
  // The duration of compute work with cost-model `estimate` that starts at
  // `start` on the device, inside the active region.
  TimeNs retime(TimeNs estimate, TimeNs start, int64_t stream);
  // The active region's home stream, whose work so far ends at `ready`,
  // waits until `until` for work outside the region.
  void waited(TimeNs ready, TimeNs until);
  // The pad that makes the active region end at its target, if the pad can
  // start at `pad_start`.
  TimeNs pad_needed(TimeNs pad_start) const;
  // Closes the active region, whose work ends at `end` on the device.
  void close(RegionOutcome outcome, TimeNs end, TimeNs pad);

  std::vector<RegionReport> report() const;
  // The cost-model estimates of the compute ops of `key`'s last complete
  // occurrence, in launch order (batch_curve.h bends profiled times with
  // them); nullptr before one completed or when it ran too many ops to keep.
  const std::vector<TimeNs>* last_estimates(const std::string& key) const;
  // Complete occurrences of every region that overran their target.
  int64_t host_bound_total() const { return host_bound_total_; }

 private:
  bool active_ = false;
  std::string key_;
  RegionKind kind_ = RegionKind::kForward;
  TimeNs target_ = 0;
  TimeNs start_ = 0;
  int64_t stream_ = 0;  // of its latest op
  int64_t home_stream_ = 0;
  bool started_ = false;
  TimeNs estimated_ = 0;
  TimeNs charged_ = 0;
  TimeNs expected_ = 0;  // estimate of the whole region, from its last complete occurrence
  TimeNs waited_ = 0;    // added to the target by waits

  std::vector<TimeNs> op_estimates_;  // of the open occurrence
  bool op_estimates_full_ = false;    // it ran more ops than are kept

  TimeNs deadline() const { return start_ + target_ + waited_; }
  std::map<std::string, std::vector<TimeNs>> last_estimates_by_key_;
  std::map<std::string, std::deque<TimeNs>> recent_by_key_;  // estimates of complete occurrences
  std::map<std::string, RegionReport> reports_;
  int64_t host_bound_total_ = 0;
};

}  // namespace emugpu
