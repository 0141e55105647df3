#include "backend/ops/sdp_choice.h"

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>

#include <sstream>

namespace emugpu {

namespace {

using at::SDPBackend;

bool enabled(SDPBackend b) {
  const auto& ctx = at::globalContext();
  switch (b) {
    case SDPBackend::flash_attention: return ctx.userEnabledFlashSDP();
    case SDPBackend::efficient_attention: return ctx.userEnabledMemEfficientSDP();
    case SDPBackend::math: return ctx.userEnabledMathSDP();
    case SDPBackend::cudnn_attention: return ctx.userEnabledCuDNNSDP();
    case SDPBackend::overrideable: return ctx.userEnabledOverrideableSDP();
    default: return false;
  }
}

const char* name_of(SDPBackend b) {
  switch (b) {
    case SDPBackend::flash_attention: return "FLASH_ATTENTION";
    case SDPBackend::efficient_attention: return "EFFICIENT_ATTENTION";
    case SDPBackend::math: return "MATH";
    case SDPBackend::cudnn_attention: return "CUDNN_ATTENTION";
    case SDPBackend::overrideable: return "OVERRIDEABLE";
    default: return "ERROR";
  }
}

bool half_precision(c10::ScalarType t) { return t == c10::kHalf || t == c10::kBFloat16; }

// What every fused kernel needs: dense 4-D (batch, heads, length, dim)
// inputs of one dtype, unit stride in the last dim, no empty sequence.
std::optional<std::string> dense_4d(const SdpInputs& in) {
  const at::Tensor* all[] = {&in.query, &in.key, &in.value};
  for (const at::Tensor* t : all) {
    if (t->is_nested() || t->layout() != c10::kStrided) return "its inputs are nested or not strided";
    if (t->dim() != 4) return "query, key and value must be 4-D (batch, heads, length, dim)";
    if (t->scalar_type() != in.query.scalar_type()) return "query, key and value must share one dtype";
    if (t->stride(-1) != 1 && t->size(-1) != 1) return "the last dimension must have stride 1";
    if (t->size(-2) == 0) return "a sequence length is 0";
  }
  if (in.key.size(0) != in.query.size(0) || in.value.size(0) != in.query.size(0)) return "batch sizes differ";
  return std::nullopt;
}

// Heads: equal, or (enable_gqa, where the kernel supports it) key/value
// heads dividing the query's.
std::optional<std::string> heads(const SdpInputs& in, bool supports_gqa) {
  const int64_t hq = in.query.size(1), hk = in.key.size(1), hv = in.value.size(1);
  if (hq == hk && hq == hv) return std::nullopt;
  if (!supports_gqa || !in.enable_gqa) return "query, key and value have different numbers of heads";
  if (hk != hv || hq % hk != 0) return "key/value heads must be equal and divide the query's";
  return std::nullopt;
}

}  // namespace

std::optional<std::string> sdp_refusal(int backend, const SdpInputs& in, const GpuSpec& gpu) {
  const auto b = static_cast<SDPBackend>(backend);
  if (b == SDPBackend::math || b == SDPBackend::overrideable) return std::nullopt;
  if (auto why = dense_4d(in)) return why;
  const c10::ScalarType dtype = in.query.scalar_type();
  const int64_t d = in.query.size(-1), dv = in.value.size(-1);
  const bool grad = in.query.requires_grad() || in.key.requires_grad() || in.value.requires_grad();
  if (b == SDPBackend::flash_attention) {
    if (gpu.major < 8) return "flash attention needs sm80 or newer";
    if (!half_precision(dtype)) return "flash attention takes float16 or bfloat16 only";
    if (in.has_mask) return "flash attention takes no attn_mask";
    if (d != in.key.size(-1) || d != dv || d > 256) return "flash attention needs equal head dims of at most 256";
    if (in.is_causal && in.query.size(-2) != in.key.size(-2))
      return "flash attention's causal mask needs equal query and key lengths";
    if (gpu.major == 8 && (gpu.minor == 6 || gpu.minor == 9) && grad && d > 192)
      return "flash attention's backward on sm86/sm89 takes head dims of at most 192";
    return heads(in, /*supports_gqa=*/false);
  }
  if (b == SDPBackend::efficient_attention) {
    if (gpu.major < 5) return "memory-efficient attention needs sm50 or newer";
    if (!(half_precision(dtype) || dtype == c10::kFloat))
      return "memory-efficient attention takes float16, bfloat16 or float32";
    if (dtype == c10::kBFloat16 && gpu.major < 8) return "memory-efficient attention takes bfloat16 on sm80 or newer";
    if (d != in.key.size(-1)) return "memory-efficient attention needs equal query and key head dims";
    return heads(in, /*supports_gqa=*/false);
  }
  if (b == SDPBackend::cudnn_attention) {
    if (gpu.major < 8) return "cuDNN attention needs sm80 or newer";
    if (!half_precision(dtype)) return "cuDNN attention takes float16 or bfloat16 only";
    if (d != in.key.size(-1) || d != dv || d > 128 || d % 8 != 0)
      return "cuDNN attention needs equal head dims, multiples of 8, of at most 128";
    return heads(in, /*supports_gqa=*/false);
  }
  return "unknown backend";
}

int64_t choose_sdp_backend(const SdpInputs& in, const GpuSpec& gpu, bool compute_mode) {
  if (compute_mode) {  // the fused kernels have no CPU kernel under CUDA's op names
    TORCH_CHECK(enabled(SDPBackend::math),
                "compute mode computes scaled_dot_product_attention by the math path, which is disabled; "
                "enable SDPBackend.MATH in torch.nn.attention.sdpa_kernel, or use timing mode");
    return static_cast<int64_t>(SDPBackend::math);
  }
  std::ostringstream reasons;
  for (const SDPBackend b : at::globalContext().sDPPriorityOrder()) {
    if (!enabled(b)) continue;
    const auto why = sdp_refusal(static_cast<int>(b), in, gpu);
    if (!why) return static_cast<int64_t>(b);
    reasons << "; " << name_of(b) << ": " << *why;
  }
  TORCH_CHECK(false, "No available kernel for scaled_dot_product_attention on ", gpu.name,
              " (as on CUDA, each enabled backend refused these inputs", reasons.str(),
              "); enable another with torch.nn.attention.sdpa_kernel, e.g. SDPBackend.MATH");
}

}  // namespace emugpu
