// The small GPU the core's timeline tests run on (its rates make durations easy to compute).
#pragma once

#include "catalog.h"

namespace emugpu::testing {

inline GpuSpec test_gpu() {
  GpuSpec g;
  g.name = "Test GPU";
  g.memory_bytes = 16ull << 30;
  g.fp32_flops = 10e12;
  g.memory_bandwidth = 1e12;
  g.pcie_generation = 4;
  g.pcie_width = 16;
  return g;
}

}  // namespace emugpu::testing
