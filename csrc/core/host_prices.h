// The modelled host's prices per op (virtual_clock.h's HostCost) from a
// host's measured costs (torch_emugpu/measure/host_cost.py), so that the
// virtual clock's host is a named machine's, the same on every rerun.
#pragma once

#include "profile_db.h"
#include "virtual_clock.h"

namespace emugpu {

// Where nothing else is measured: an H100 machine's host launching eager
// PyTorch ops on CUDA (benchmarks/data/h100/host_cost.json): 22.2 us per op
// of a module's forward, 22.7 us per op of autograd's backward, and 19.5 us
// per parameter of a foreach AdamW step, which gives 2.24 us per list tensor
// (host_cost_from below).
constexpr TimeNs kModelledOpNs = 22'200;
constexpr TimeNs kModelledBackwardOpNs = 22'700;
constexpr TimeNs kModelledListTensorNs = 2'240;
// The host_cost probe's optimizer step: AdamW(foreach=True) over 100
// parameters, which launches 8 foreach ops.
constexpr double kProbeOptimizerParams = 100;
constexpr double kProbeOptimizerForeachOps = 8;

// The modelled host's prices from `measured`: per op the module figure,
// per backward op the autograd one, and per list tensor beyond a foreach
// op's first what the probe's optimizer step leaves after its ops' own
// price: (optimizer_param_us * 100 / 8 - op) / 99, at least 0. A figure not
// measured keeps the default above.
HostCost modelled_host_cost(const HostProfile& measured, double speed, TimeNs read_ns);

}  // namespace emugpu
