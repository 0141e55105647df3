#include "daemon/policy.h"

#include <algorithm>
#include <cmath>

#include "error.h"

namespace emugpu::share {

namespace {

constexpr const char* kPolicies = "none, time-slice, fair, fifo, priority, mps";

// The share `me` gets while the others in `busy` (a bitmask over `others`,
// or the mean-field weights when `weights` is given) also have work.
double share_of(const SharingConfig& config, const Sharer& me, const std::vector<Sharer>& others,
                const std::vector<double>& weights) {
  double count = 0, iterations = 0, higher = 0, equal = 0;
  for (size_t j = 0; j < others.size(); ++j) {
    const double w = weights[j];
    if (w <= 0) continue;
    count += w;
    iterations += w * static_cast<double>(std::max<TimeNs>(others[j].iteration_ns, 1));
    if (others[j].priority > me.priority) higher += w;
    if (others[j].priority == me.priority) equal += w;
  }
  const double switching =
      static_cast<double>(config.slice_ns) / static_cast<double>(config.slice_ns + config.switch_ns);
  switch (config.policy) {
    case SharingPolicy::kNone:
    case SharingPolicy::kCustom: return 1.0;
    case SharingPolicy::kTimeSlice: return count > 0 ? switching / (1.0 + count) : 1.0;
    case SharingPolicy::kFair: return 1.0 / (1.0 + count);
    case SharingPolicy::kFifo: {
      const double mine = static_cast<double>(std::max<TimeNs>(me.iteration_ns, 1));
      return mine / (mine + iterations);
    }
    case SharingPolicy::kPriority:
      // A higher priority with work takes the GPU (a fraction of it, in mean field).
      return std::max(0.0, 1.0 - higher) * (equal > 0 ? switching / (1.0 + equal) : 1.0);
    case SharingPolicy::kMps: {
      // `weights` mark the others whose kernels hold SMs against this one's.
      double held = 0;
      for (size_t j = 0; j < others.size(); ++j) {
        held += weights[j] * std::clamp(others[j].demand, 0.0, 1.0) * (1.0 - config.mps_overlap);
      }
      const double mine = std::clamp(me.demand, 1e-6, 1.0);
      return std::min(1.0, std::max(0.0, 1.0 - held) / mine);
    }
  }
  return 1.0;
}

// The probability that `other`'s kernel holds the SMs `me`'s kernel competes for.
double holds(const Sharer& me, const Sharer& other) {
  const double a = static_cast<double>(std::max<TimeNs>(other.hold_ns, 0));
  const double b = static_cast<double>(std::max<TimeNs>(me.hold_ns, 0));
  return a + b > 0 ? a / (a + b) : 0.5;
}

}  // namespace

SharingPolicy parse_sharing_policy(const std::string& name) {
  if (name == "none") return SharingPolicy::kNone;
  if (name == "time-slice") return SharingPolicy::kTimeSlice;
  if (name == "fair") return SharingPolicy::kFair;
  if (name == "fifo") return SharingPolicy::kFifo;
  if (name == "priority") return SharingPolicy::kPriority;
  if (name == "mps") return SharingPolicy::kMps;
  detail::throw_error(ErrorKind::kValue, "emugpud: expected a sharing policy (", kPolicies, "), got \"",
                      echo_input(name), "\"");
}

const char* sharing_policy_name(SharingPolicy policy) {
  switch (policy) {
    case SharingPolicy::kNone: return "none";
    case SharingPolicy::kTimeSlice: return "time-slice";
    case SharingPolicy::kFair: return "fair";
    case SharingPolicy::kFifo: return "fifo";
    case SharingPolicy::kPriority: return "priority";
    case SharingPolicy::kMps: return "mps";
    case SharingPolicy::kCustom: return "custom";
  }
  return "unknown";
}

std::string SharingConfig::name() const {
  return policy == SharingPolicy::kCustom ? custom_name : sharing_policy_name(policy);
}

double compute_share(const SharingConfig& config, const Sharer& me, const std::vector<Sharer>& others) {
  if (config.policy == SharingPolicy::kCustom && config.custom) {
    const double share = config.custom(me, others);
    return std::clamp(std::isfinite(share) ? share : 1.0, kMinShare, 1.0);
  }
  std::vector<double> weights(others.size(), 0.0);
  // Under MPS only the others whose kernels hold SMs against this one's slow
  // it: the set enumerated is theirs, each in it with busy x holds.
  std::vector<double> present(others.size());
  for (size_t j = 0; j < others.size(); ++j) {
    const double busy = std::clamp(others[j].busy, 0.0, 1.0);
    present[j] = config.policy == SharingPolicy::kMps ? busy * holds(me, others[j]) : busy;
  }
  double share = 0;
  if (others.size() <= kExactSharers) {
    // Exact: every set of others with work at the same time, by its probability.
    const uint32_t sets = 1u << others.size();
    for (uint32_t set = 0; set < sets; ++set) {
      double p = 1;
      for (size_t j = 0; j < others.size(); ++j) {
        const bool in = (set >> j) & 1u;
        p *= in ? present[j] : 1.0 - present[j];
        weights[j] = in ? 1.0 : 0.0;
      }
      if (p > 0) share += p * share_of(config, me, others, weights);
    }
  } else {
    weights = present;
    share = share_of(config, me, others, weights);
  }
  return std::clamp(std::isfinite(share) ? share : 1.0, kMinShare, 1.0);
}

}  // namespace emugpu::share
