// Output shapes of an op: its Meta kernel over mirrored meta tensors, or a
// data-dependent shape rule (upper bounds where values decide sizes).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <vector>

#include "backend/ops/op_info.h"
#include "backend/ops/shape_cache.h"

namespace emugpu {

// The outputs' metadata; NotImplementedError naming the op when it has no rule.
std::vector<OutDesc> run_shape_rule(const OpInfo& info, const c10::OperatorHandle& op,
                                    const std::vector<c10::IValue>& args, size_t num_args);

}  // namespace emugpu
