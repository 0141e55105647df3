// scaled_dot_product_attention's kernel on emugpu, chosen as PyTorch chooses
// it on CUDA: so DTensor's sharding rules (written for the flash, efficient
// and cuDNN ops) apply, and torch.nn.attention.sdpa_kernel is honoured.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "core/catalog.h"

namespace emugpu {

// The fused-kernel inputs the choice looks at (aten::_fused_sdp_choice's).
struct SdpInputs {
  at::Tensor query, key, value;
  bool has_mask = false;
  double dropout = 0;
  bool is_causal = false;
  bool enable_gqa = false;
};

// Why `backend` (an at::SDPBackend) cannot take these inputs on `gpu`, or
// nothing when it can. Only the backend's own rules: not whether it is
// enabled.
std::optional<std::string> sdp_refusal(int backend, const SdpInputs& in, const GpuSpec& gpu);

// The first backend of the context's priority order (flash, efficient,
// math, cuDNN by default) that is enabled and takes the inputs; raises
// RuntimeError naming each enabled backend's reason when none does, as CUDA
// does. Compute mode takes math (its host kernels give the values: CUDA's
// fused ops have no CPU kernel), and refuses where math is disabled.
int64_t choose_sdp_backend(const SdpInputs& in, const GpuSpec& gpu, bool compute_mode);

}  // namespace emugpu
