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
    case SharingPolicy::kMps: return 1.0;  // not reached: compute_share asks mps_share
  }
  return 1.0;
}

// A class of a process's kernels: its share of the process's kernel time,
// its demand of the GPU's SMs, its blocks' hold time, its kernels' duration.
struct KernelClass {
  double fraction;
  double demand;
  double hold_ns;
  double kernel_ns;
};

std::vector<KernelClass> kernel_classes(const Sharer& s) {
  std::vector<KernelClass> classes;
  double total = 0;
  for (const DemandBin& b : s.bins) total += std::max(b.fraction, 0.0);
  for (const DemandBin& b : s.bins) {
    if (b.fraction <= 0) continue;
    classes.push_back({b.fraction / total, std::clamp(b.demand, 0.0, 1.0),
                       static_cast<double>(std::max<TimeNs>(b.hold_ns, 0)),
                       static_cast<double>(std::max<TimeNs>(b.kernel_ns, 0))});
  }
  if (classes.empty()) {  // no histogram: the means stand for every kernel
    classes.push_back({1.0, std::clamp(s.demand, 0.0, 1.0), static_cast<double>(std::max<TimeNs>(s.hold_ns, 0)), 0.0});
  }
  return classes;
}

// A way another process may meet this one's kernel: with `probability`, a
// kernel of its holding `held` of the GPU's SMs against it (0: none holds).
struct Meeting {
  double probability;
  double held;
};

// Where kernels of two processes compete for SMs, each is ahead (its
// blocks dispatched first, the other's getting what is left) half of the
// time, whatever their lengths: MPS clients' kernels come in through
// separate hardware queues, which the GPU serves in turn.
constexpr double kAhead = 0.5;

// What a kernel ahead holds of its demand over its duration: all of it
// while blocks of its own wait for SMs, then, in its last wave, the SMs
// still running its blocks (half of them on average, as they finish). Its
// waves: its duration over its blocks' hold time (unknown: many).
double draining(const KernelClass& c) {
  if (c.kernel_ns <= 0 || c.hold_ns <= 0) return 1.0;
  return 1.0 - 0.5 / std::max(1.0, c.kernel_ns / c.hold_ns);
}

// The fraction of the GPU's speed `me` gets under MPS while it has work: its
// kernels' mean speed over what the others' kernels hold against them.
double mps_share(const SharingConfig& config, const Sharer& me, const std::vector<Sharer>& others) {
  const double keep = 1.0 - std::clamp(config.mps_overlap, 0.0, 1.0);
  std::vector<std::vector<KernelClass>> their(others.size());
  size_t states = 1;
  for (size_t j = 0; j < others.size(); ++j) {
    their[j] = kernel_classes(others[j]);
    states = states > kExactMpsStates ? states : states * (their[j].size() + 1);
  }
  const auto speed = [](double held, double demand) {
    return std::clamp((1.0 - held) / std::max(demand, 1e-6), 0.0, 1.0);
  };
  double stretched = 0;  // expected time shared over time alone, summed over this process's classes
  for (const KernelClass& k : kernel_classes(me)) {
    // Per other process: one of its classes holding SMs against this kernel, or none.
    std::vector<std::vector<Meeting>> meetings(others.size());
    for (size_t j = 0; j < others.size(); ++j) {
      const double busy = std::clamp(others[j].busy, 0.0, 1.0);
      double none = 1.0;
      for (const KernelClass& c : their[j]) {
        const double p = busy * c.fraction * kAhead;
        meetings[j].push_back({p, c.demand * keep * draining(c)});
        none -= p;
      }
      meetings[j].push_back({std::max(none, 0.0), 0.0});
    }
    double mean = 0;
    if (states <= kExactMpsStates) {
      // Every combination of the others' states, by its probability.
      std::vector<size_t> at(others.size(), 0);
      for (;;) {
        double p = 1, held = 0;
        for (size_t j = 0; j < others.size(); ++j) {
          p *= meetings[j][at[j]].probability;
          held += meetings[j][at[j]].held;
        }
        if (p > 0) mean += p * speed(held, k.demand);
        size_t j = 0;
        while (j < at.size() && ++at[j] == meetings[j].size()) at[j++] = 0;
        if (j == at.size()) break;
      }
    } else {
      double held = 0;
      for (const auto& m : meetings)
        for (const Meeting& x : m) held += x.probability * x.held;
      mean = speed(held, k.demand);
    }
    stretched += k.fraction / std::max(mean, kMinShare);
  }
  return 1.0 / stretched;
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
  if (config.policy == SharingPolicy::kMps) return std::clamp(mps_share(config, me, others), kMinShare, 1.0);
  std::vector<double> weights(others.size(), 0.0);
  std::vector<double> present(others.size());
  for (size_t j = 0; j < others.size(); ++j) present[j] = std::clamp(others[j].busy, 0.0, 1.0);
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
