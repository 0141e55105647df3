#include "daemon/policy.h"

#include <algorithm>
#include <cmath>

#include "error.h"

namespace emugpu::share {

namespace {

constexpr const char* kPolicies = "none, time-slice, fair, fifo, priority";

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
    case SharingPolicy::kNone: return 1.0;
    case SharingPolicy::kTimeSlice: return count > 0 ? switching / (1.0 + count) : 1.0;
    case SharingPolicy::kFair: return 1.0 / (1.0 + count);
    case SharingPolicy::kFifo: {
      const double mine = static_cast<double>(std::max<TimeNs>(me.iteration_ns, 1));
      return mine / (mine + iterations);
    }
    case SharingPolicy::kPriority:
      // A higher priority with work takes the GPU (a fraction of it, in mean field).
      return std::max(0.0, 1.0 - higher) * (equal > 0 ? switching / (1.0 + equal) : 1.0);
  }
  return 1.0;
}

}  // namespace

SharingPolicy parse_sharing_policy(const std::string& name) {
  if (name == "none") return SharingPolicy::kNone;
  if (name == "time-slice") return SharingPolicy::kTimeSlice;
  if (name == "fair") return SharingPolicy::kFair;
  if (name == "fifo") return SharingPolicy::kFifo;
  if (name == "priority") return SharingPolicy::kPriority;
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
  }
  return "unknown";
}

double compute_share(const SharingConfig& config, const Sharer& me, const std::vector<Sharer>& others) {
  std::vector<double> weights(others.size(), 0.0);
  double share = 0;
  if (others.size() <= kExactSharers) {
    // Exact: every set of others with work at the same time, by its probability.
    const uint32_t sets = 1u << others.size();
    for (uint32_t set = 0; set < sets; ++set) {
      double p = 1;
      for (size_t j = 0; j < others.size(); ++j) {
        const bool in = (set >> j) & 1u;
        const double busy = std::clamp(others[j].busy, 0.0, 1.0);
        p *= in ? busy : 1.0 - busy;
        weights[j] = in ? 1.0 : 0.0;
      }
      if (p > 0) share += p * share_of(config, me, others, weights);
    }
  } else {
    for (size_t j = 0; j < others.size(); ++j) weights[j] = std::clamp(others[j].busy, 0.0, 1.0);
    share = share_of(config, me, others, weights);
  }
  return std::clamp(std::isfinite(share) ? share : 1.0, kMinShare, 1.0);
}

}  // namespace emugpu::share
