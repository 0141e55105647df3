// The cost-model input of one op: bytes its tensors move, FLOPs by family
// (core/op_cost.h), and the dtype class that picks the peak rate.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "backend/ops/op_info.h"
#include "core/cost_model.h"

namespace emugpu {

OpCost estimate(const OpInfo& info, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                const std::vector<c10::IValue>& args);

}  // namespace emugpu
