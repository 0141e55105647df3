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

// An op on sparse tensors: sparse x dense products by their stored entries
// (core/op_cost.h: spmm_*), everything else by the bytes of the members and
// dense tensors it reads and writes.
OpCost estimate_sparse(const OpInfo& info, const std::vector<c10::IValue>& args,
                       const std::vector<at::Tensor>& outputs);

}  // namespace emugpu
