// How a profiled time bends between and beyond the batch sizes a profile
// measured. A profile fixes the totals at its batch sizes; the cost model says
// how time grows with the batch: its estimate of a region, taken from one
// occurrence at the running batch size, splits into launch floors (one per op,
// not growing with the batch) and work that grows in proportion to it.
//
// Between two profiled points (D0, t0) and (D1, t1), where D is the cost
// model's time at their batch sizes, the target at cost-model time D follows
//   t(D) = (H^p + (k D)^p)^(1/p),  p = kCurveExponent (batch_curve.cpp),
// with H and k solved exactly from the two points: a host floor H (a small
// batch is launch-bound: its time no longer shrinks with the batch) joined
// smoothly with device time proportional to the cost model's. Where the two
// points show no floor (H^p <= 0), time is linear in D through them. Beyond
// the table the two nearest points' curve continues.
#pragma once

#include <cstdint>
#include <vector>

namespace emugpu {

// A region's cost-model time as a function of batch size, from one occurrence
// at `observed_batch`: fixed_ns of launch floors plus variable_ns scaled by
// batch / observed_batch.
struct BatchCostCurve {
  double fixed_ns = 0;
  double variable_ns = 0;
  int64_t observed_batch = 1;

  double at(double batch) const;
};

// The curve of an occurrence whose ops had cost-model `estimates`: each op's
// first `launch_floor_ns` (its launch) does not grow with the batch. Kept apart
// from the region bookkeeping so it can be tested alone.
BatchCostCurve cost_curve(const std::vector<int64_t>& estimates, double launch_floor_ns, int64_t observed_batch);

// The time at cost-model time `d` on the curve through (d0, t0) and (d1, t1).
double through_two(double d0, double t0, double d1, double t1, double d);

enum class CurveMethod {
  kExact,         // a profiled batch size
  kInterpolated,  // between two profiled batch sizes, along the cost model's curve
  kExtrapolated,  // beyond the table, along the curve of its two nearest points
  kScaled,        // a one-point table: in proportion to the cost model's time
};

struct CurveTarget {
  double seconds = 0;
  CurveMethod method = CurveMethod::kExact;
  int64_t below = 0;  // the profiled batch sizes it was made from (equal when exact or scaled)
  int64_t above = 0;
};

struct MeasuredPoint {
  int64_t batch_size = 0;
  double seconds = 0;
};

// The target at `batch` from measured `points` (strictly increasing batch
// sizes, at least one) and the cost model's `curve`. Never below a tenth of
// the nearest measurement, as the linear lookup (profile_db.h).
CurveTarget curve_target(const std::vector<MeasuredPoint>& points, int64_t batch, const BatchCostCurve& curve);

}  // namespace emugpu
