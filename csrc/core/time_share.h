// A GPU's compute shared with other processes (emugpud's time sharing): the
// share of the GPU's speed this process's kernels get. The device renews it
// at a coarse grain (every report_ns() of real time while it launches work),
// reporting how busy it kept the GPU; between reports every op is placed
// locally at the last share.
#pragma once

#include "clock.h"

namespace emugpu {

class TimeShare {
 public:
  struct Report {
    double busy = 0;          // fraction of the recent window the compute engine had work
    TimeNs iteration_ns = 0;  // compute work between host waits, on the GPU alone (recent average)
    TimeNs now = 0;           // the device's clock
    TimeNs busy_until = 0;    // where the compute launched so far ends
    double demand = 1.0;      // fraction of the device's SMs its kernels hold (time-weighted recent average)
    TimeNs hold_ns = 0;       // how long its kernels' blocks hold an SM (time-weighted recent average)
  };
  virtual ~TimeShare() = default;
  // Real time between reports.
  virtual TimeNs report_ns() const = 0;
  // The clock time a reported busy fraction averages over.
  virtual TimeNs window_ns() const = 0;
  // Returns the share in (0, 1] for the work launched until the next report.
  virtual double report(const Report& report) = 0;
};

}  // namespace emugpu
