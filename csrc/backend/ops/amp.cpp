// Autocast for emugpu: the casting policies torch applies on CUDA, so
// torch.autocast("emugpu") produces the dtypes (and memory) a GPU run would.
// The op lists are PyTorch's own (ATen/autocast_mode.h), the same ones its
// CUDA, XPU and MPS backends register, so they follow the installed torch.
#include <ATen/autocast_mode.h>

namespace emugpu {
namespace {

using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }

#define EMUGPU_LOWER_PRECISION(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define EMUGPU_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define EMUGPU_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define EMUGPU_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
#define EMUGPU_DIFFERENT_REDISPATCH(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE, REDISPATCH_SIGNATURE, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE,             \
                                                      REDISPATCH_SIGNATURE, POLICY)

// As on CUDA: binary_cross_entropy is refused under autocast.
Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_banned));
  AT_FORALL_LOWER_PRECISION_FP(EMUGPU_LOWER_PRECISION)
  AT_FORALL_FP32(EMUGPU_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(EMUGPU_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(EMUGPU_DIFFERENT_REDISPATCH)
  AT_FORALL_PROMOTE(EMUGPU_PROMOTE)
}

}  // namespace
}  // namespace emugpu
