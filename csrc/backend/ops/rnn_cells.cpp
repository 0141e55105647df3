// The fused LSTM and GRU cells. PyTorch's per-timestep RNN decomposition
// (compute mode, and dtypes cuDNN has no RNN for) calls them on every
// accelerator, PrivateUse1 included, but implements them for CUDA only, so
// compute mode found no CPU kernel to compute them with on the host. In
// timing mode they stay one fused kernel of the boxed fallback; in compute
// mode they are made of device ops (each computed and charged), in CUDA's
// layouts: the workspace holds what the backward reads, the LSTM's four
// activated gates and the GRU's reset, update and new gates, hx and hn.
#include <ATen/ATen.h>

#include "backend/ops/common.h"

namespace emugpu {
namespace {

at::Tensor tensor_or_undefined(const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::Tensor(); }

at::Tensor plus_bias(at::Tensor gates, const at::Tensor& bias) { return bias.defined() ? gates + bias : gates; }

std::vector<c10::IValue> lstm_cell(const std::vector<c10::IValue>& a) {
  const at::Tensor cx = a[2].toTensor();
  at::Tensor gates =
      plus_bias(plus_bias(a[0].toTensor() + a[1].toTensor(), tensor_or_undefined(a[3])), tensor_or_undefined(a[4]));
  const auto g = gates.chunk(4, 1);
  const at::Tensor in = g[0].sigmoid(), forget = g[1].sigmoid(), cell = g[2].tanh(), out = g[3].sigmoid();
  const at::Tensor cy = forget * cx + in * cell;
  const at::Tensor hy = out * cy.tanh();
  return {hy, cy, at::cat({in, forget, cell, out}, 1)};
}

// (grad_hy?, grad_cy?, cx, cy, workspace, has_bias) -> (grad_gates, grad_cx, grad_bias)
std::vector<c10::IValue> lstm_cell_backward(const std::vector<c10::IValue>& a) {
  const at::Tensor grad_hy = tensor_or_undefined(a[0]), grad_cy = tensor_or_undefined(a[1]);
  if (!grad_hy.defined() && !grad_cy.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
  const at::Tensor cx = a[2].toTensor(), cy = a[3].toTensor(), workspace = a[4].toTensor();
  const auto g = workspace.chunk(4, 1);
  const at::Tensor &in = g[0], &forget = g[1], &cell = g[2], &out = g[3];
  const at::Tensor tanh_cy = cy.tanh();
  at::Tensor grad_c = grad_cy.defined() ? grad_cy : at::zeros_like(cy);
  at::Tensor grad_out = at::zeros_like(out);
  if (grad_hy.defined()) {
    grad_c = grad_c + grad_hy * out * (1 - tanh_cy * tanh_cy);
    grad_out = grad_hy * tanh_cy * out * (1 - out);
  }
  const at::Tensor grad_gates = at::cat(
      {grad_c * cell * in * (1 - in), grad_c * cx * forget * (1 - forget), grad_c * in * (1 - cell * cell), grad_out},
      1);
  const at::Tensor grad_bias = a[5].toBool() ? grad_gates.sum(0) : at::Tensor();
  return {grad_gates, grad_c * forget, grad_bias};
}

std::vector<c10::IValue> gru_cell(const std::vector<c10::IValue>& a) {
  const at::Tensor hx = a[2].toTensor();
  const auto i = plus_bias(a[0].toTensor(), tensor_or_undefined(a[3])).chunk(3, 1);
  const auto h = plus_bias(a[1].toTensor(), tensor_or_undefined(a[4])).chunk(3, 1);
  const at::Tensor reset = (i[0] + h[0]).sigmoid(), update = (i[1] + h[1]).sigmoid();
  const at::Tensor hn = h[2];
  const at::Tensor fresh = (i[2] + reset * hn).tanh();
  const at::Tensor hy = fresh + update * (hx - fresh);
  return {hy, at::cat({reset, update, fresh, hx, hn}, 1)};
}

// (grad_hy, workspace, has_bias) -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)
std::vector<c10::IValue> gru_cell_backward(const std::vector<c10::IValue>& a) {
  const at::Tensor grad_hy = a[0].toTensor();
  const auto w = a[1].toTensor().chunk(5, 1);
  const at::Tensor &reset = w[0], &update = w[1], &fresh = w[2], &hx = w[3], &hn = w[4];
  const at::Tensor grad_update = grad_hy * (hx - fresh) * update * (1 - update);
  const at::Tensor grad_fresh = grad_hy * (1 - update) * (1 - fresh * fresh);
  const at::Tensor grad_reset = grad_fresh * hn * reset * (1 - reset);
  const at::Tensor grad_input = at::cat({grad_reset, grad_update, grad_fresh}, 1);
  const at::Tensor grad_hidden = at::cat({grad_reset, grad_update, grad_fresh * reset}, 1);
  const bool bias = a[2].toBool();
  return {grad_input, grad_hidden, grad_hy * update, bias ? grad_input.sum(0) : at::Tensor(),
          bias ? grad_hidden.sum(0) : at::Tensor()};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", torch::CppFunction::makeFromBoxedFunction<&fallback_or_device_ops<&lstm_cell>>());
  m.impl("_thnn_fused_lstm_cell_backward_impl",
         torch::CppFunction::makeFromBoxedFunction<&fallback_or_device_ops<&lstm_cell_backward>>());
  m.impl("_thnn_fused_gru_cell", torch::CppFunction::makeFromBoxedFunction<&fallback_or_device_ops<&gru_cell>>());
  m.impl("_thnn_fused_gru_cell_backward",
         torch::CppFunction::makeFromBoxedFunction<&fallback_or_device_ops<&gru_cell_backward>>());
}

}  // namespace emugpu
