// Compute mode: the CPU kernel runs over host aliases of the emugpu tensors,
// so values are real while time stays the emulated one.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <vector>

#include "backend/generator.h"

namespace emugpu {

// Runs `op` on the CPU over host aliases of `args`; results in `host_results`.
// A random op draws from a host generator seeded by `draw` (generator.h).
void compute_on_host(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                     torch::jit::Stack& host_results, const std::optional<RandomDraw>& draw = std::nullopt,
                     int generator_arg = -1);
// Copies a host result into its emugpu output; where the CPU kernel's shape
// differs from the Meta kernel's (e.g. empty saved statistics in eval-mode
// batch norm), the CPU's is the one a real GPU kernel would match.
at::Tensor store_host_result(int device, const at::Tensor& out, const at::Tensor& value);

}  // namespace emugpu
