#include "pending_time.h"

#include "error.h"

namespace emugpu {

void PendingTime::set(TimeNs t) {
  EMUGPU_CHECK(t >= 0, kValue, "expected a known device time >= 0 ns, got ", t);
  TimeNs unknown = kUnknown;
  time_.compare_exchange_strong(unknown, t, std::memory_order_acq_rel);
}

TimeNs PendingTime::force() {
  if (known()) return value();
  EMUGPU_CHECK(force_ != nullptr, kRuntime,
               "a pending device time has no way to become known (expected a force function, got none)");
  const TimeNs t = force_();
  set(t);
  return value();
}

}  // namespace emugpu
