#include "daemon/policy.h"

#include <algorithm>
#include <bit>
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
// its demand of the GPU's SMs, its blocks' hold time, its kernels' duration
// and the share of the memory bandwidth it draws alone.
struct KernelClass {
  double fraction;
  double demand;
  double hold_ns;
  double kernel_ns;
  double bandwidth;
};

std::vector<KernelClass> kernel_classes(const Sharer& s) {
  std::vector<KernelClass> classes;
  double total = 0;
  for (const DemandBin& b : s.bins) total += std::max(b.fraction, 0.0);
  for (const DemandBin& b : s.bins) {
    if (b.fraction <= 0) continue;
    classes.push_back({b.fraction / total, std::clamp(b.demand, 0.0, 1.0),
                       static_cast<double>(std::max<TimeNs>(b.hold_ns, 0)),
                       static_cast<double>(std::max<TimeNs>(b.kernel_ns, 0)), std::clamp(b.bandwidth, 0.0, 1.0)});
  }
  if (classes.empty()) {  // no histogram: the means stand for every kernel (and no bandwidth is known)
    classes.push_back(
        {1.0, std::clamp(s.demand, 0.0, 1.0), static_cast<double>(std::max<TimeNs>(s.hold_ns, 0)), 0.0, 0.0});
  }
  return classes;
}

// What another process may be running when this one's kernel runs: with
// `probability`, a kernel of its that holds `held` of the GPU's SMs if it
// is ahead of this one and draws `bandwidth` of the memory bandwidth (or
// `behind`, at the speed it has behind this one); or none (all 0).
struct Meeting {
  double probability;
  double held;
  double bandwidth;
  double behind;
  bool running;
};

// Where kernels of several processes compete for SMs, their blocks are
// dispatched in an order (the kernel ahead first, the next getting what it
// leaves), each order as likely as another, whatever their lengths: MPS
// clients' kernels come in through separate hardware queues, which the GPU
// serves in turn. Two kernels: each is ahead half of the time.
// What a kernel ahead holds of its demand over its duration: all of it
// while blocks of its own still wait for SMs, then, in its last wave, the SMs
// still running its blocks (half of them on average, as they finish). Its
// waves: its duration over its blocks' hold time (unknown: many).
double draining(const KernelClass& c) {
  if (c.kernel_ns <= 0 || c.hold_ns <= 0) return 1.0;
  return 1.0 - 0.5 / std::max(1.0, c.kernel_ns / c.hold_ns);
}

// A kernel of demand `demand` with `held` of the SMs taken runs at what is
// left over what it needs, of its speed alone.
double sm_speed(double held, double demand) { return std::clamp((1.0 - held) / std::max(demand, 1e-6), 0.0, 1.0); }

// Its speed once the memory bandwidth is counted too: it draws `bandwidth`
// of the peak at its speed alone, so `sm` of that at its SM speed; where
// it and `others` together draw more than the peak, the memory serves each
// in proportion to what it draws (all slow alike).
double speed(double sm, double bandwidth, double others) { return sm / std::max(1.0, bandwidth * sm + others); }

// The fraction of the GPU's speed `me` gets under MPS while it has work: its
// kernels' mean speed over what the others' kernels hold against them and draw.
double mps_share(const SharingConfig& config, const Sharer& me, const std::vector<Sharer>& others) {
  const double keep = 1.0 - std::clamp(config.mps_overlap, 0.0, 1.0);
  std::vector<std::vector<KernelClass>> their(others.size());
  size_t states = 1;
  for (size_t j = 0; j < others.size(); ++j) {
    their[j] = kernel_classes(others[j]);
    // Each combination of the others' kernels, then each order of those running.
    states = states > kExactMpsStates ? states : states * (their[j].size() + 1) * 2;
  }
  double stretched = 0;  // expected time shared over time alone, summed over this process's classes
  for (const KernelClass& k : kernel_classes(me)) {
    // Per other process: one of its classes running, or none.
    const double mine = k.demand * keep * draining(k);
    std::vector<std::vector<Meeting>> meetings(others.size());
    for (size_t j = 0; j < others.size(); ++j) {
      const double busy = std::clamp(others[j].busy, 0.0, 1.0);
      for (const KernelClass& c : their[j]) {
        meetings[j].push_back({busy * c.fraction, c.demand * keep * draining(c), c.bandwidth,
                               c.bandwidth * sm_speed(mine, c.demand), true});
      }
      meetings[j].push_back({1.0 - busy, 0.0, 0.0, 0.0, false});
    }
    double mean = 0;
    if (states <= kExactMpsStates) {
      // Every combination of the others' kernels, by its probability; within
      // one, every order of the m running and this kernel: this one is r-th
      // with probability 1 / (m + 1), behind each r-subset of the running as
      // likely as another.
      std::vector<size_t> at(others.size(), 0);
      std::vector<const Meeting*> running;
      std::vector<double> by_rank, subsets;
      for (;;) {
        double p = 1;
        running.clear();
        for (size_t j = 0; j < others.size(); ++j) {
          const Meeting& m = meetings[j][at[j]];
          p *= m.probability;
          if (m.running) running.push_back(&m);
        }
        if (p > 0) {
          const size_t m = running.size();
          by_rank.assign(m + 1, 0.0);
          subsets.assign(m + 1, 0.0);
          for (uint32_t ahead = 0; ahead < (1u << m); ++ahead) {
            double held = 0, drawn = 0;
            for (size_t i = 0; i < m; ++i) {
              const bool is_ahead = (ahead >> i) & 1u;
              held += is_ahead ? running[i]->held : 0.0;
              drawn += is_ahead ? running[i]->bandwidth : running[i]->behind;
            }
            const auto r = static_cast<size_t>(std::popcount(ahead));
            by_rank[r] += speed(sm_speed(held, k.demand), k.bandwidth, drawn);
            subsets[r] += 1;
          }
          double expected = 0;
          for (size_t r = 0; r <= m; ++r) expected += by_rank[r] / subsets[r];
          mean += p * expected / static_cast<double>(m + 1);
        }
        size_t j = 0;
        while (j < at.size() && ++at[j] == meetings[j].size()) at[j++] = 0;
        if (j == at.size()) break;
      }
    } else {
      // Mean field: the others' kernels as one average kernel, of which
      // `running` run at a time on average; this kernel is r-th among them
      // with probability 1 / (m + 1), behind r average kernels.
      double running = 0, held = 0, ahead_drawn = 0, behind_drawn = 0;
      for (const auto& m : meetings) {
        for (const Meeting& x : m) {
          if (!x.running) continue;
          running += x.probability;
          held += x.probability * x.held;
          ahead_drawn += x.probability * x.bandwidth;
          behind_drawn += x.probability * x.behind;
        }
      }
      if (running > 0) {
        held /= running;
        ahead_drawn /= running;
        behind_drawn /= running;
      }
      const auto among = [&](int m) {
        double sum = 0;
        for (int r = 0; r <= m; ++r) {
          sum += speed(sm_speed(r * held, k.demand), k.bandwidth, r * ahead_drawn + (m - r) * behind_drawn);
        }
        return sum / (m + 1);
      };
      // Between the whole numbers of kernels around the mean, linearly.
      const int below = static_cast<int>(std::floor(running));
      const double over = running - below;
      mean = (1.0 - over) * among(below) + (over > 0 ? over * among(below + 1) : 0.0);
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
