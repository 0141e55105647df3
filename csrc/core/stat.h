// One allocator statistic as PyTorch's allocators report it.
#pragma once

#include <cstdint>

namespace emugpu {

struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;  // cumulative increments
  int64_t freed = 0;      // cumulative decrements
  void add(int64_t amount) {
    current += amount;
    if (current > peak) peak = current;
    if (amount > 0) allocated += amount;
    if (amount < 0) freed += -amount;
  }
  void reset_peak() { peak = current; }
  void reset_accumulated() { allocated = freed = 0; }
};

}  // namespace emugpu
