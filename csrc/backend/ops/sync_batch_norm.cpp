// The five batch-norm kernels of nn.SyncBatchNorm (per-rank statistics,
// their combination across ranks, normalisation, and the two backward
// passes). PyTorch implements them for CUDA only: no Meta kernel gives their
// shapes and no CPU kernel computes them. Here Meta kernels give their
// outputs as CUDA's, so timing mode runs each as one kernel of the boxed
// fallback, charged by the bytes it moves; compute mode makes them of
// device ops (each computed and charged), with CUDA's formulas.
#include <ATen/ATen.h>

#include "backend/ops/common.h"

namespace emugpu {
namespace {

at::Tensor defined_or_none(const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::Tensor(); }

// CUDA keeps 16-bit inputs' statistics in float32.
at::ScalarType stat_type(const at::Tensor& input) {
  const auto t = input.scalar_type();
  return t == at::kHalf || t == at::kBFloat16 ? at::kFloat : t;
}

// Every dim but the channels (dim 1).
std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel [C] tensor, broadcast against `input`.
at::Tensor per_channel(const at::Tensor& c, const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = c.numel();
  return c.view(shape);
}

at::Tensor like_input(const at::Tensor& input) { return at::empty_like(input, input.suggest_memory_format()); }

// --- shapes (Meta) --------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> stats_meta(const at::Tensor& input, double /*eps*/) {
  const auto options = input.options().dtype(stat_type(input));
  return {at::empty({input.size(1)}, options), at::empty({input.size(1)}, options)};
}

std::tuple<at::Tensor, at::Tensor> gather_meta(const at::Tensor& /*input*/, const at::Tensor& mean,
                                               const at::Tensor& /*invstd*/, const std::optional<at::Tensor>&,
                                               const std::optional<at::Tensor>&, double, double,
                                               const at::Tensor& /*counts*/) {
  return {at::empty({mean.size(-1)}, mean.options()), at::empty({mean.size(-1)}, mean.options())};
}

at::Tensor elemt_meta(const at::Tensor& input, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                      const at::Tensor&, const at::Tensor&, double) {
  return like_input(input);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_reduce_meta(
    const at::Tensor& /*grad_out*/, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& /*invstd*/,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  const int64_t c = input.size(1);
  const auto w = weight.has_value() && weight->defined() ? weight->options() : mean.options();
  return {input_g ? at::empty({c}, mean.options()) : at::Tensor(),
          input_g ? at::empty({c}, mean.options()) : at::Tensor(), weight_g ? at::empty({c}, w) : at::Tensor(),
          bias_g ? at::empty({c}, w) : at::Tensor()};
}

at::Tensor backward_elemt_meta(const at::Tensor& /*grad_out*/, const at::Tensor& input, const at::Tensor&,
                               const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,
                               const at::Tensor&, const at::Tensor&) {
  return like_input(input);
}

// --- values (compute mode) -------------------------------------------------------

// (input, eps) -> (mean, invstd)
std::vector<c10::IValue> stats(const std::vector<c10::IValue>& a) {
  const at::Tensor x = a[0].toTensor().to(stat_type(a[0].toTensor()));
  auto [var, mean] = at::var_mean(x, reduced_dims(x), /*correction=*/0);
  return {mean, (var + a[1].toDouble()).rsqrt()};
}

// (input, mean[W,C], invstd[W,C], running_mean?, running_var?, momentum, eps, counts[W]) -> (mean, invstd); the
// running statistics are updated in place (unbiased variance), as CUDA's kernel does.
std::vector<c10::IValue> gather(const std::vector<c10::IValue>& a) {
  const at::Tensor means = a[1].toTensor(), invstds = a[2].toTensor();
  const double momentum = a[5].toDouble(), eps = a[6].toDouble();
  const at::Tensor counts = a[7].toTensor().to(means.scalar_type()).view({-1, 1});
  const at::Tensor total = counts.sum();
  const at::Tensor mean = (means * counts).sum(0) / total;
  const at::Tensor vars = invstds.pow(-2) - eps;
  const at::Tensor var = ((vars + (means - mean).square()) * counts).sum(0) / total;  // biased, over all ranks
  const at::Tensor running_mean = defined_or_none(a[3]), running_var = defined_or_none(a[4]);
  if (running_mean.defined()) running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()) * momentum);
  if (running_var.defined()) {
    const at::Tensor unbiased = var * total / (total - 1);
    running_var.mul_(1 - momentum).add_(unbiased.to(running_var.scalar_type()) * momentum);
  }
  return {mean, (var + eps).rsqrt()};
}

// (input, weight?, bias?, mean, invstd, eps) -> output
std::vector<c10::IValue> elemt(const std::vector<c10::IValue>& a) {
  const at::Tensor x = a[0].toTensor(), weight = defined_or_none(a[1]), bias = defined_or_none(a[2]);
  at::Tensor y = (x - per_channel(a[3].toTensor(), x)) * per_channel(a[4].toTensor(), x);
  if (weight.defined()) y = y * per_channel(weight, x);
  if (bias.defined()) y = y + per_channel(bias, x);
  return {y.to(x.scalar_type()).contiguous(x.suggest_memory_format())};
}

// (grad_out, input, mean, invstd, weight?, input_g, weight_g, bias_g) -> (sum_dy, sum_dy_xmu, grad_weight, grad_bias)
std::vector<c10::IValue> backward_reduce(const std::vector<c10::IValue>& a) {
  const at::Tensor mean = a[2].toTensor(), invstd = a[3].toTensor(), weight = defined_or_none(a[4]);
  const at::Tensor x = a[1].toTensor().to(mean.scalar_type()), dy = a[0].toTensor().to(mean.scalar_type());
  const auto dims = reduced_dims(x);
  const at::Tensor sum_dy = dy.sum(dims), sum_dy_xmu = (dy * (x - per_channel(mean, x))).sum(dims);
  const auto w = weight.defined() ? weight.scalar_type() : mean.scalar_type();
  return {a[5].toBool() ? sum_dy : at::Tensor(), a[5].toBool() ? sum_dy_xmu : at::Tensor(),
          a[6].toBool() ? (sum_dy_xmu * invstd).to(w) : at::Tensor(), a[7].toBool() ? sum_dy.to(w) : at::Tensor()};
}

// (grad_out, input, mean, invstd, weight?, sum_dy, sum_dy_xmu, count[W]) -> grad_input, with the sums and counts
// of every rank
std::vector<c10::IValue> backward_elemt(const std::vector<c10::IValue>& a) {
  const at::Tensor mean = a[2].toTensor(), invstd = a[3].toTensor(), weight = defined_or_none(a[4]);
  const at::Tensor x = a[1].toTensor(), dy = a[0].toTensor();
  const at::Tensor total = a[7].toTensor().sum().to(mean.scalar_type());
  const at::Tensor mean_dy = a[5].toTensor() / total, mean_dy_xmu = a[6].toTensor() / total;
  const at::Tensor xmu = x.to(mean.scalar_type()) - per_channel(mean, x);
  at::Tensor scale = per_channel(invstd, x);
  if (weight.defined()) scale = scale * per_channel(weight.to(mean.scalar_type()), x);
  const at::Tensor g =
      (dy.to(mean.scalar_type()) - per_channel(mean_dy, x) - xmu * per_channel(invstd.square() * mean_dy_xmu, x)) *
      scale;
  return {g.to(x.scalar_type()).contiguous(x.suggest_memory_format())};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("batch_norm_stats", TORCH_FN(stats_meta));
  m.impl("batch_norm_gather_stats_with_counts", TORCH_FN(gather_meta));
  m.impl("batch_norm_elemt", TORCH_FN(elemt_meta));
  m.impl("batch_norm_backward_reduce", TORCH_FN(backward_reduce_meta));
  m.impl("batch_norm_backward_elemt", TORCH_FN(backward_elemt_meta));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", torch::CppFunction::makeFromBoxedFunction<&fallback_or_device_ops<&stats>>());
  m.impl("batch_norm_gather_stats_with_counts",
         torch::CppFunction::makeFromBoxedFunction<&fallback_or_device_ops<&gather>>());
  m.impl("batch_norm_elemt", torch::CppFunction::makeFromBoxedFunction<&fallback_or_device_ops<&elemt>>());
  m.impl("batch_norm_backward_reduce",
         torch::CppFunction::makeFromBoxedFunction<&fallback_or_device_ops<&backward_reduce>>());
  m.impl("batch_norm_backward_elemt",
         torch::CppFunction::makeFromBoxedFunction<&fallback_or_device_ops<&backward_elemt>>());
}

}  // namespace emugpu
