// Calibration files (`torch-emugpu calibrate`: a microbenchmark sweep on a
// real GPU) and the fit of the cost model's kernel parameters to them, or to
// any set of measured op sequences.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "catalog.h"
#include "cost_model.h"
#include "kernel_params.h"

namespace emugpu {

// Ops whose durations add up to one measured time.
struct MeasuredCase {
  std::vector<OpCost> ops;
  double seconds = 0;
  // The time may be the host's (launches back to back, Python, autograd):
  // the device took at most this long, so only over-predictions count.
  bool upper_bound = false;
};

struct Calibration {
  std::string path;
  std::string gpu;                  // as the file names it
  std::vector<MeasuredCase> cases;  // the sweep's points the cost model has a form for
  int skipped = 0;                  // points it has none for (transfers, RNNs, eval batch norms, unknown ones)
  // Families ("ssm") and ops of known families ("conv/backward_bias") this
  // version does not know, sorted: a newer sweep's points, skipped.
  std::vector<std::string> unknown;
  int unknown_points = 0;
};

// Parses a calibration file for `gpu`; throws kValue naming the file and the
// field for malformed content, for another schema, and for a file measured
// on another GPU. Points of families or ops it does not know are skipped and
// listed in `unknown` (a newer version wrote them); the file is refused only
// when no point is left to fit.
Calibration parse_calibration(std::string_view text, const std::string& path, const GpuSpec& gpu);
Calibration load_calibration(const std::string& path, const GpuSpec& gpu);
// The warning to give once for a calibration with unknown points (naming the
// file, the families and ops, and how many points were ignored); empty when
// it has none.
std::string calibration_warning(const Calibration& cal);
// The first `<dir>/<GPU folder>/calibration.json` on the search path whose
// folder names `gpu` (as `torch-emugpu calibrate` writes it: the name with
// '_' for spaces; compared loosely, as catalog lookups are).
std::optional<std::string> find_calibration(const std::vector<std::string>& directories, const GpuSpec& gpu);

// The most cases a fit runs on: 2.7x the 763 the full sweep's 899 points
// give (a fit of 2048 takes about 2 s).
constexpr size_t kMaxFitCases = 2048;

// Fits the parameters named in `names` (all of kernel_param_fields() when
// empty) to `cases`, starting from `start`: coordinate descent with a
// golden-section search per parameter over its range, minimising the mean
// |log(predicted / measured)| (over-predictions only for upper bounds).
// More than kMaxFitCases cases: fitted to kMaxFitCases of them, evenly
// spread, so that a 100000-point file fits in seconds. Polls
// check_wait_interrupt() (Ctrl-C) at every step. `source` becomes the result's source.
KernelParams fit_kernel_params(const GpuSpec& gpu, const std::vector<MeasuredCase>& cases, KernelParams start,
                               const std::vector<std::string>& names, const std::string& source);
// The loss fit_kernel_params minimises.
double mean_abs_log_error(const GpuSpec& gpu, const std::vector<MeasuredCase>& cases, const KernelParams& params);

}  // namespace emugpu
