#include "host_prices.h"

#include <algorithm>
#include <cmath>

namespace emugpu {

namespace {

TimeNs micros_to_ns(double us) { return static_cast<TimeNs>(std::llround(us * 1e3)); }

}  // namespace

HostCost modelled_host_cost(const HostProfile& measured, double speed, TimeNs read_ns) {
  HostCost cost{HostModel::kModelled, speed, kModelledOpNs, read_ns, kModelledBackwardOpNs, kModelledListTensorNs};
  if (measured.module_op_us) cost.op_ns = micros_to_ns(*measured.module_op_us);
  if (measured.autograd_op_us) cost.backward_op_ns = micros_to_ns(*measured.autograd_op_us);
  if (measured.optimizer_param_us) {
    const double op_us = static_cast<double>(cost.op_ns) / 1e3;
    const double per_op_us = *measured.optimizer_param_us * kProbeOptimizerParams / kProbeOptimizerForeachOps;
    cost.list_tensor_ns = micros_to_ns(std::max(0.0, (per_op_us - op_us) / (kProbeOptimizerParams - 1)));
  }
  return cost;
}

}  // namespace emugpu
