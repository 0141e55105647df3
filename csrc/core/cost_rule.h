// Which of the cost model's rules timed an op, for `torch-emugpu explain`:
// a finer family than OpFamily (a depthwise 7x7 convolution, an LSTM) and
// the rule's name. Kept out of cost_model.h so that naming a rule rebuilds
// only its users; defined beside kernel_cost() in cost_model.cpp, from the
// same tests.
#pragma once

#include <string>

#include "catalog.h"
#include "cost_model.h"

namespace emugpu {

struct CostRule {
  std::string family;  // "lstm", "conv depthwise 7x7", "matmul", "elementwise", ...
  std::string rule;    // "cuDNN RNN wavefront rule", "GEMM tile rule", "bandwidth rule", ...
};

CostRule cost_rule(const OpCost& cost, const GpuSpec& gpu);

}  // namespace emugpu
