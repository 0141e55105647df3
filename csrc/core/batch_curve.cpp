#include "batch_curve.h"

#include <algorithm>
#include <cmath>

#include "error.h"

namespace emugpu {

namespace {

// The joint's sharpness: p = 1 adds the host floor to the device time, a large
// p takes the larger of the two. Chosen on the leave-one-out benchmark of the
// shipped H100 profiles (benchmarks/batch_curve.py, docs/benchmarks.md): 3
// halves the worst case of the straight line for a median a point worse.
constexpr double kCurveExponent = 3.0;

}  // namespace

double BatchCostCurve::at(double batch) const {
  return fixed_ns + variable_ns * batch / static_cast<double>(std::max<int64_t>(observed_batch, 1));
}

BatchCostCurve cost_curve(const std::vector<int64_t>& estimates, double launch_floor_ns, int64_t observed_batch) {
  EMUGPU_CHECK(observed_batch >= 1, kValue, "a cost curve needs the batch size it was observed at (>= 1), got ",
               observed_batch);
  BatchCostCurve c;
  c.observed_batch = observed_batch;
  for (const int64_t e : estimates) {
    const double ns = static_cast<double>(std::max<int64_t>(e, 0));
    const double fixed = std::min(ns, std::max(launch_floor_ns, 0.0));
    c.fixed_ns += fixed;
    c.variable_ns += ns - fixed;
  }
  return c;
}

double through_two(double d0, double t0, double d1, double t1, double d) {
  if (d1 == d0) return t0 + (t1 - t0) / 2;  // the cost model cannot tell them apart
  const double p = kCurveExponent;
  const double kp = (std::pow(t1, p) - std::pow(t0, p)) / (std::pow(d1, p) - std::pow(d0, p));
  const double hp = std::pow(t0, p) - kp * std::pow(d0, p);
  // A floor shows only where the smaller batch took longer than the larger
  // one's pace allows; otherwise time is linear in the cost model's.
  if (kp > 0 && hp > 0) return std::pow(hp + kp * std::pow(std::max(d, 0.0), p), 1.0 / p);
  return t0 + (t1 - t0) * (d - d0) / (d1 - d0);
}

CurveTarget curve_target(const std::vector<MeasuredPoint>& points, int64_t batch, const BatchCostCurve& curve) {
  EMUGPU_CHECK(!points.empty(), kValue, "a curve target needs at least one measured point, got none");
  EMUGPU_CHECK(batch >= 1, kValue, "batch size must be >= 1 for a curve target, got ", batch);
  for (size_t i = 1; i < points.size(); ++i) {
    EMUGPU_CHECK(points[i].batch_size > points[i - 1].batch_size, kValue,
                 "measured points must have strictly increasing batch sizes; ", points[i].batch_size, " follows ",
                 points[i - 1].batch_size);
  }
  auto it = std::lower_bound(points.begin(), points.end(), batch,
                             [](const MeasuredPoint& p, int64_t b) { return p.batch_size < b; });
  CurveTarget out;
  if (it != points.end() && it->batch_size == batch) {
    out.seconds = it->seconds;
    out.below = out.above = batch;
    return out;
  }
  const double d = curve.at(static_cast<double>(batch));
  if (points.size() == 1) {
    const MeasuredPoint& p = points[0];
    const double dp = curve.at(static_cast<double>(p.batch_size));
    out.method = CurveMethod::kScaled;
    out.below = out.above = p.batch_size;
    out.seconds =
        dp > 0 ? p.seconds * d / dp : p.seconds * static_cast<double>(batch) / static_cast<double>(p.batch_size);
    out.seconds = std::max(out.seconds, 0.1 * p.seconds);
    return out;
  }
  size_t lo;
  if (it == points.begin()) {
    lo = 0, out.method = CurveMethod::kExtrapolated;
  } else if (it == points.end()) {
    lo = points.size() - 2, out.method = CurveMethod::kExtrapolated;
  } else {
    lo = static_cast<size_t>(it - points.begin()) - 1, out.method = CurveMethod::kInterpolated;
  }
  const MeasuredPoint& a = points[lo];
  const MeasuredPoint& b = points[lo + 1];
  out.below = a.batch_size;
  out.above = b.batch_size;
  const double t = through_two(curve.at(static_cast<double>(a.batch_size)), a.seconds,
                               curve.at(static_cast<double>(b.batch_size)), b.seconds, d);
  const MeasuredPoint& near = batch < a.batch_size ? a : b;
  out.seconds = std::max(t, 0.1 * near.seconds);
  return out;
}

}  // namespace emugpu
