// Recurrent layers as PyTorch runs them on CUDA. There, aten::lstm (and
// gru, rnn_tanh, rnn_relu) hands the whole stack to cuDNN through
// aten::_cudnn_rnn, whose autograd formula calls _cudnn_rnn_backward; on any
// other device PyTorch decomposes it into a few ops per layer and timestep,
// which would be charged (and kept in memory) op by op. Here the RNN ops take
// cuDNN's path: one _cudnn_rnn call timed by the core's RNN rule
// (core/rnn_cost.h), outputs laid out as cuDNN's, its reserve space kept for
// the backward in training and its workspace allocated for the call.
#include <ATen/ops/_cudnn_rnn.h>
#include <ATen/ops/gru_native.h>
#include <ATen/ops/lstm_native.h>
#include <ATen/ops/rnn_relu_native.h>
#include <ATen/ops/rnn_tanh_native.h>

#include <numeric>

#include "backend/ops/common.h"
#include "core/rnn_cost.h"

namespace emugpu {
namespace {

int64_t int_arg(const c10::IValue& v) { return v.isSymInt() ? v.toSymInt().expect_int() : v.toInt(); }

std::vector<int64_t> int_list_arg(const c10::IValue& v) {
  if (v.isIntList()) return v.toIntVector();
  std::vector<int64_t> out;
  for (const c10::SymInt& s : v.toSymIntVector()) out.push_back(s.expect_int());
  return out;
}

// weight_stride0: tensors per layer and direction, 4 with biases (w_ih, w_hh, b_ih, b_hh), 2 without, one more
// with projections (w_hr).
bool has_bias(int64_t weight_stride0) { return weight_stride0 == 4 || weight_stride0 == 5; }

at::Tensor optional_tensor(const c10::IValue& v) { return v.isTensor() ? v.toTensor() : at::Tensor(); }

// The arguments _cudnn_rnn and _cudnn_rnn_backward share, from `first` on
// (mode, hidden_size, proj_size, num_layers, batch_first, dropout, train,
// bidirectional, batch_sizes), with the input's sizes.
RnnShape rnn_shape(const at::Tensor& input, const std::vector<c10::IValue>& args, size_t first, bool has_bias) {
  RnnShape s;
  const int64_t mode = int_arg(args[first]);
  TORCH_CHECK_VALUE(mode >= 0 && mode <= 3, "emugpu: _cudnn_rnn expected mode 0-3 (RNN_RELU, RNN_TANH, LSTM, GRU), ",
                    "got ", mode, "; call it through nn.LSTM, nn.GRU or nn.RNN");
  s.mode = static_cast<RnnMode>(mode);
  s.hidden_size = static_cast<double>(int_arg(args[first + 1]));
  s.proj_size = static_cast<double>(int_arg(args[first + 2]));
  s.layers = static_cast<double>(args[first + 3].toInt());
  s.batch_first = args[first + 4].toBool();
  s.dropout = args[first + 5].toDouble();
  s.train = args[first + 6].toBool();
  s.bidirectional = args[first + 7].toBool();
  s.bias = has_bias;
  const std::vector<int64_t> batch_sizes = int_list_arg(args[first + 8]);
  if (!batch_sizes.empty()) {  // packed: rows of all sequences, longest first
    s.seq_len = static_cast<double>(batch_sizes.size());
    s.batch = static_cast<double>(batch_sizes.front());
    s.tokens = static_cast<double>(input.size(0));
    s.input_size = static_cast<double>(input.size(1));
    s.batch_first = false;
  } else {
    TORCH_CHECK_VALUE(input.dim() == 3, "emugpu: _cudnn_rnn expected a 3-D input, got ", input.dim(), " dims");
    s.seq_len = static_cast<double>(input.size(s.batch_first ? 1 : 0));
    s.batch = static_cast<double>(input.size(s.batch_first ? 0 : 1));
    s.tokens = s.seq_len * s.batch;
    s.input_size = static_cast<double>(input.size(2));
  }
  translate_errors([&] { check_rnn_shape(s); });
  return s;
}

DType rnn_dtype(const at::Tensor& input) {
  switch (input.scalar_type()) {
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kDouble: return DType::kFloat64;
    default: return at::globalContext().allowTF32CuDNN() ? DType::kTensorFloat32 : DType::kFloat32;
  }
}

// A time-major tensor of `rows` x `width` per step, returned batch-first
// (a transposed view) when the call is batch-first, as cuDNN's are.
at::Tensor sequence_like(const at::Tensor& input, const RnnShape& s, double width, bool packed) {
  const auto w = static_cast<int64_t>(width);
  if (packed) return at::empty({input.size(0), w}, input.options());
  const auto t = static_cast<int64_t>(s.seq_len), n = static_cast<int64_t>(s.batch);
  at::Tensor out = at::empty({t, n, w}, input.options());
  return s.batch_first ? out.transpose(0, 1) : out;
}

// Allocations that live for the call only (workspace, transposed copies):
// they raise the peak as cuDNN's do, and are freed on return.
at::Tensor scratch(const at::Tensor& like, double bytes) {
  return at::empty({static_cast<int64_t>(std::max(bytes, 0.0))}, like.options().dtype(at::kByte));
}

void charge_rnn(const at::Tensor& input, const RnnShape& s, bool backward, const char* name) {
  OpCost cost;
  cost.family = backward ? OpFamily::kRnnBackward : OpFamily::kRnn;
  cost.dtype = rnn_dtype(input);
  cost.rnn = s;
  cost.flops = rnn_flops(s, backward);
  const double es = static_cast<double>(input.element_size());
  cost.bytes = (s.tokens * (s.input_size + rnn_output_size(s) * (s.bidirectional ? 2 : 1)) + rnn_weight_count(s)) * es *
                   (backward ? 2 : 1) +
               rnn_reserve_bytes(s, es);
  const int device = input.device().index();
  Device& dev = Runtime::get().device(device);
  const KernelCost charged = translate_errors([&] { return dev.cost().kernel_cost(cost); });
  dev.ledger().record(cost, charged, name);
  translate_errors([&] { charge(device, Engine::kCompute, charged.duration, charged.occupancy); });
}

// aten::_cudnn_rnn(input, weight[], weight_stride0, weight_buf?, hx, cx?, mode, hidden_size, proj_size,
//   num_layers, batch_first, dropout, train, bidirectional, batch_sizes, dropout_state?)
//   -> (output, hy, cy, reserve, weight_buf)
void cudnn_rnn(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const EmulatorCall call(active_virtual_clock(), launched_op());
  const size_t num_args = op.schema().arguments().size();
  const std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  await_collective_writes(args);
  const at::Tensor input = args[0].toTensor(), hx = args[4].toTensor(), cx = optional_tensor(args[5]);
  const c10::DeviceGuard guard(input.device());
  const RnnShape s = rnn_shape(input, args, 6, has_bias(args[2].toInt()));
  const bool packed = !int_list_arg(args[14]).empty();
  const double es = static_cast<double>(input.element_size()), d = s.bidirectional ? 2 : 1;
  const auto layers_dirs = static_cast<int64_t>(s.layers * d), n = static_cast<int64_t>(s.batch);
  at::Tensor output = sequence_like(input, s, d * rnn_output_size(s), packed);
  at::Tensor hy = at::empty({layers_dirs, n, static_cast<int64_t>(rnn_output_size(s))}, hx.options());
  at::Tensor cy = cx.defined() ? at::empty({layers_dirs, n, static_cast<int64_t>(s.hidden_size)}, cx.options())
                               : at::empty({0}, input.options());
  at::Tensor reserve = scratch(input, rnn_reserve_bytes(s, es));
  // nn.LSTM flattens its weights into cuDNN's buffer on CUDA and the call
  // uses them in place; the backward here needs no copy of them either.
  at::Tensor weight_buf = args[3].isTensor() ? args[3].toTensor() : at::empty({0}, input.options());
  {
    const at::Tensor workspace = scratch(input, rnn_workspace_bytes(s, es));
    const at::Tensor transposed = scratch(input, s.batch_first ? s.tokens * s.input_size * es : 0);
    charge_rnn(input, s, false, "aten::_cudnn_rnn");
  }
  torch::jit::drop(*stack, static_cast<int64_t>(num_args));
  for (at::Tensor* t : {&output, &hy, &cy, &reserve, &weight_buf}) stack->emplace_back(std::move(*t));
}

// aten::_cudnn_rnn_backward(input, weight[], weight_stride0, weight_buf, hx, cx?, output, grad_output?,
//   grad_hy?, grad_cy?, mode, hidden_size, proj_size, num_layers, batch_first, dropout, train,
//   bidirectional, batch_sizes, dropout_state?, reserve, output_mask[4]) -> (dx, dhx, dcx, dw[])
void cudnn_rnn_backward(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const EmulatorCall call(active_virtual_clock(), launched_op());
  const size_t num_args = op.schema().arguments().size();
  const std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  await_collective_writes(args);
  const at::Tensor input = args[0].toTensor(), hx = args[4].toTensor(), cx = optional_tensor(args[5]);
  const c10::DeviceGuard guard(input.device());
  const std::vector<at::Tensor> weights = args[1].toTensorVector();
  RnnShape s = rnn_shape(input, args, 10, has_bias(args[2].toInt()));
  const bool packed = !int_list_arg(args[18]).empty();
  const auto mask = args[21].toBoolList();
  s.input_grad = mask.get(0);
  s.weight_grad = mask.get(3);
  const double es = static_cast<double>(input.element_size()), d = s.bidirectional ? 2 : 1;
  at::Tensor dx = s.input_grad ? sequence_like(input, s, s.input_size, packed) : at::Tensor();
  at::Tensor dhx = mask.get(1) ? at::empty(hx.sizes(), hx.options()) : at::Tensor();
  at::Tensor dcx = mask.get(2) && cx.defined() ? at::empty(cx.sizes(), cx.options()) : at::Tensor();
  std::vector<at::Tensor> dw;
  if (s.weight_grad) {
    // cuDNN writes every weight's gradient into one flat buffer; PyTorch
    // hands out views of it.
    const int64_t total = std::accumulate(weights.begin(), weights.end(), int64_t{0},
                                          [](int64_t sum, const at::Tensor& w) { return sum + w.numel(); });
    const at::Tensor flat = at::empty({total}, weights.empty() ? input.options() : weights.front().options());
    int64_t offset = 0;
    for (const at::Tensor& w : weights) {
      dw.push_back(flat.narrow(0, offset, w.numel()).view(w.sizes()));
      offset += w.numel();
    }
  }
  {
    const at::Tensor workspace = scratch(input, rnn_workspace_bytes(s, es));
    const at::Tensor transposed = scratch(input, s.batch_first ? s.tokens * d * rnn_output_size(s) * es : 0);
    charge_rnn(input, s, true, "aten::_cudnn_rnn_backward");
  }
  torch::jit::drop(*stack, static_cast<int64_t>(num_args));
  stack->emplace_back(std::move(dx));
  stack->emplace_back(std::move(dhx));
  stack->emplace_back(std::move(dcx));
  stack->emplace_back(c10::List<at::Tensor>(dw));
}

// Which RNNs take cuDNN's path: as on CUDA (at::native's cuDNN check), the
// floating types cuDNN runs, and only in timing mode (compute mode needs
// the values, which PyTorch's own decomposition computes on the host).
bool takes_cudnn_path(const at::Tensor& input, const char* name) {
  if (Runtime::get().compute_mode()) return false;
  const auto t = input.scalar_type();
  if (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) return true;
  TORCH_WARN_ONCE("emugpu: ", name, " on ", t, " runs PyTorch's per-timestep decomposition, as on CUDA (cuDNN ",
                  "has no ", t, " RNN), and is charged op by op; float32, float16 and bfloat16 take cuDNN's path.");
  return false;
}

int64_t weight_stride(bool has_biases, bool projections) { return (has_biases ? 4 : 2) + (projections ? 1 : 0); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> run_cudnn(const at::Tensor& input, const at::Tensor& batch_sizes,
                                                         const at::Tensor& hx, const at::Tensor& cx,
                                                         at::TensorList params, bool has_biases, RnnMode mode,
                                                         int64_t num_layers, double dropout, bool train,
                                                         bool bidirectional, bool batch_first) {
  int64_t hidden = hx.size(2), proj = 0;
  if (cx.defined() && cx.size(2) != hx.size(2)) hidden = cx.size(2), proj = hx.size(2);
  std::vector<int64_t> sizes;
  if (batch_sizes.defined()) {
    TORCH_CHECK_VALUE(batch_sizes.device().is_cpu() && batch_sizes.dim() == 1,
                      "emugpu: packed RNN input expected 1-D batch_sizes on the CPU, got ", batch_sizes.device(),
                      " with ", batch_sizes.dim(), " dims");
    const at::Tensor b = batch_sizes.to(at::kLong).contiguous();
    sizes.assign(b.data_ptr<int64_t>(), b.data_ptr<int64_t>() + b.numel());
  }
  auto out = at::_cudnn_rnn(input, params, weight_stride(has_biases, proj != 0), std::nullopt, hx,
                            cx.defined() ? std::optional<at::Tensor>(cx) : std::nullopt, static_cast<int64_t>(mode),
                            hidden, proj, num_layers, batch_first, dropout, train, bidirectional, sizes, std::nullopt);
  return {std::get<0>(out), std::get<1>(out), std::get<2>(out)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_input(const at::Tensor& input, at::TensorList hx,
                                                          at::TensorList params, bool has_biases, int64_t num_layers,
                                                          double dropout, bool train, bool bidirectional,
                                                          bool batch_first) {
  if (!takes_cudnn_path(input, "aten::lstm") || hx.size() != 2) {
    return at::native::lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
  }
  return run_cudnn(input, at::Tensor(), hx[0], hx[1], params, has_biases, RnnMode::kLstm, num_layers, dropout, train,
                   bidirectional, batch_first);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_data(const at::Tensor& data, const at::Tensor& batch_sizes,
                                                         at::TensorList hx, at::TensorList params, bool has_biases,
                                                         int64_t num_layers, double dropout, bool train,
                                                         bool bidirectional) {
  if (!takes_cudnn_path(data, "aten::lstm") || hx.size() != 2) {
    return at::native::lstm(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional);
  }
  return run_cudnn(data, batch_sizes, hx[0], hx[1], params, has_biases, RnnMode::kLstm, num_layers, dropout, train,
                   bidirectional, false);
}

const char* name_of(RnnMode mode) {
  return mode == RnnMode::kGru ? "aten::gru" : mode == RnnMode::kRnnTanh ? "aten::rnn_tanh" : "aten::rnn_relu";
}

// GRU and the Elman RNNs: one hidden state.
template <RnnMode kMode>
std::tuple<at::Tensor, at::Tensor> one_hidden_input(const at::Tensor& input, const at::Tensor& hx,
                                                    at::TensorList params, bool has_biases, int64_t num_layers,
                                                    double dropout, bool train, bool bidirectional, bool batch_first) {
  if (!takes_cudnn_path(input, name_of(kMode))) {
    switch (kMode) {
      case RnnMode::kGru:
        return at::native::gru(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
      case RnnMode::kRnnTanh:
        return at::native::rnn_tanh(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                                    batch_first);
      default:
        return at::native::rnn_relu(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                                    batch_first);
    }
  }
  auto out = run_cudnn(input, at::Tensor(), hx, at::Tensor(), params, has_biases, kMode, num_layers, dropout, train,
                       bidirectional, batch_first);
  return {std::get<0>(out), std::get<1>(out)};
}

template <RnnMode kMode>
std::tuple<at::Tensor, at::Tensor> one_hidden_data(const at::Tensor& data, const at::Tensor& batch_sizes,
                                                   const at::Tensor& hx, at::TensorList params, bool has_biases,
                                                   int64_t num_layers, double dropout, bool train, bool bidirectional) {
  if (!takes_cudnn_path(data, name_of(kMode))) {
    switch (kMode) {
      case RnnMode::kGru:
        return at::native::gru(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional);
      case RnnMode::kRnnTanh:
        return at::native::rnn_tanh(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
                                    bidirectional);
      default:
        return at::native::rnn_relu(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train,
                                    bidirectional);
    }
  }
  auto out = run_cudnn(data, batch_sizes, hx, at::Tensor(), params, has_biases, kMode, num_layers, dropout, train,
                       bidirectional, false);
  return {std::get<0>(out), std::get<1>(out)};
}

void register_rnns(torch::Library& m) {
  m.impl("lstm.input", TORCH_FN(lstm_input));
  m.impl("lstm.data", TORCH_FN(lstm_data));
  m.impl("gru.input", TORCH_FN(one_hidden_input<RnnMode::kGru>));
  m.impl("gru.data", TORCH_FN(one_hidden_data<RnnMode::kGru>));
  m.impl("rnn_tanh.input", TORCH_FN(one_hidden_input<RnnMode::kRnnTanh>));
  m.impl("rnn_tanh.data", TORCH_FN(one_hidden_data<RnnMode::kRnnTanh>));
  m.impl("rnn_relu.input", TORCH_FN(one_hidden_input<RnnMode::kRnnRelu>));
  m.impl("rnn_relu.data", TORCH_FN(one_hidden_data<RnnMode::kRnnRelu>));
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_cudnn_rnn", torch::CppFunction::makeFromBoxedFunction<&cudnn_rnn>());
  m.impl("_cudnn_rnn_backward", torch::CppFunction::makeFromBoxedFunction<&cudnn_rnn_backward>());
  // Under inference_mode the autograd keys are skipped: the RNN ops reach
  // the backend key, which takes the same path.
  register_rnns(m);
}

// The RNN ops are composite: on their own they would decompose before any
// emugpu kernel sees them. Taking them at the autograd key lets _cudnn_rnn's
// own autograd formula record the backward, as on CUDA.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) { register_rnns(m); }

}  // namespace emugpu
