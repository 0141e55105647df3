#include "regions.h"

#include <algorithm>
#include <cmath>

#include "error.h"

namespace emugpu {
namespace {

constexpr double kReserve = 0.05;  // of the expected estimate
constexpr size_t kRemembered = 8;  // occurrences whose largest estimate is expected
// Ops of one occurrence kept for the batch curve (8 MiB): a region with more
// has no curve and keeps the linear lookup.
constexpr size_t kMaxKeptOps = size_t{1} << 20;

}  // namespace

void Regions::open(const std::string& key, RegionKind kind, TimeNs target, TimeNs start, int64_t stream, bool started) {
  EMUGPU_CHECK(!active_, kRuntime, "region '", key, "' opened while '", key_, "' is still open");
  EMUGPU_CHECK(target >= 0 || target == kUnbudgeted, kValue, "region '", key,
               "': expected a target >= 0 ns (or kUnbudgeted), got ", target);
  active_ = true;
  key_ = key;
  kind_ = kind;
  target_ = target;
  start_ = start;
  stream_ = stream;
  home_stream_ = stream;
  started_ = started;
  estimated_ = 0;
  charged_ = 0;
  waited_ = 0;
  op_estimates_.clear();
  op_estimates_full_ = false;
  // The most work of the last few occurrences: loops alternate (gradient
  // accumulation steps only every k-th backward).
  auto it = recent_by_key_.find(key);
  expected_ = it == recent_by_key_.end() ? 0 : *std::max_element(it->second.begin(), it->second.end());
}

TimeNs Regions::retime(TimeNs estimate, TimeNs start, int64_t stream) {
  if (!active_) return estimate;
  stream_ = stream;
  const TimeNs before = estimated_;
  estimated_ += estimate;
  if (op_estimates_.size() < kMaxKeptOps) {
    op_estimates_.push_back(estimate);
  } else {
    op_estimates_full_ = true;
  }
  if (target_ == kUnbudgeted) {
    charged_ += estimate;
    return estimate;
  }
  const TimeNs budget = deadline() - start;
  // At the profile's pace: the estimate scaled by target / expected.
  const TimeNs paced = expected_ > 0
                           ? static_cast<TimeNs>(static_cast<double>(estimate) * static_cast<double>(target_) /
                                                 static_cast<double>(expected_))
                           : estimate;
  TimeNs duration;
  if (budget <= 0) {
    duration = paced;  // host-bound: the region's time was over before this op could start
  } else if (expected_ > 0 && before + estimate <= expected_) {
    // A reserve keeps room for more work than expected; the pad fills it otherwise.
    const double remaining = static_cast<double>(expected_ - before) + kReserve * static_cast<double>(expected_);
    duration = static_cast<TimeNs>(static_cast<double>(budget) * (static_cast<double>(estimate) / remaining));
  } else {
    // More work than last time (or the first time): never use up the whole
    // budget, so later ops still fit; the pad covers the rest.
    duration = std::min(paced, budget / 2);
  }
  charged_ += duration;
  return duration;
}

void Regions::waited(TimeNs ready, TimeNs until) {
  if (!budgeted() || until <= ready) return;
  // The profiled time still ahead of this point: by the work done against the
  // work expected; the first time, where the re-timed work stands (a stream
  // with no work yet stands at 0: the region's start bounds it).
  TimeNs ahead = std::max<TimeNs>(0, deadline() - std::max(ready, start_));
  if (expected_ > 0) {
    const double done = std::min(1.0, static_cast<double>(estimated_) / static_cast<double>(expected_));
    ahead = static_cast<TimeNs>(std::llround((1.0 - done) * static_cast<double>(target_)));
  }
  waited_ += std::max<TimeNs>(0, until + ahead - deadline());
}

TimeNs Regions::pad_needed(TimeNs pad_start) const {
  if (!active_ || target_ == kUnbudgeted) return 0;
  return std::max<TimeNs>(0, deadline() - pad_start);
}

void Regions::close(RegionOutcome outcome, TimeNs end, TimeNs pad) {
  if (!active_) return;
  active_ = false;
  RegionReport& r = reports_[key_];
  r.key = key_;
  r.kind = kind_;
  r.target = target_;
  switch (outcome) {
    case RegionOutcome::kCancelled: r.cancelled += 1; return;
    case RegionOutcome::kAborted: r.aborted += 1; return;
    case RegionOutcome::kCompleted: break;
  }
  r.occurrences += 1;
  r.last_time = std::max<TimeNs>(0, end - start_);
  r.charged = charged_;
  r.estimated = estimated_;
  r.padded = pad;
  r.waited = waited_;
  if (target_ != kUnbudgeted && r.last_time > target_ + waited_) {
    r.host_bound += 1;
    host_bound_total_ += 1;
    r.worst_excess = std::max(r.worst_excess, r.last_time - target_ - waited_);
  }
  if (op_estimates_full_) {
    last_estimates_by_key_.erase(key_);
  } else if (!op_estimates_.empty()) {
    last_estimates_by_key_[key_] = std::move(op_estimates_);
  }
  op_estimates_.clear();
  if (estimated_ > 0) {
    auto& recent = recent_by_key_[key_];
    recent.push_back(estimated_);
    if (recent.size() > kRemembered) recent.pop_front();
  }
}

const std::vector<TimeNs>* Regions::last_estimates(const std::string& key) const {
  const auto it = last_estimates_by_key_.find(key);
  return it == last_estimates_by_key_.end() ? nullptr : &it->second;
}

std::vector<RegionReport> Regions::report() const {
  std::vector<RegionReport> out;
  for (const auto& [key, r] : reports_) out.push_back(r);
  return out;
}

}  // namespace emugpu
