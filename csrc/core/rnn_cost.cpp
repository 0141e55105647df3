#include "rnn_cost.h"

#include <algorithm>
#include <cmath>

#include "cost_model.h"
#include "error.h"

namespace emugpu {

int rnn_gates(RnnMode mode) {
  switch (mode) {
    case RnnMode::kLstm: return 4;
    case RnnMode::kGru: return 3;
    case RnnMode::kRnnRelu:
    case RnnMode::kRnnTanh: return 1;
  }
  return 1;
}

void check_rnn_shape(const RnnShape& s) {
  const bool finite = std::isfinite(s.seq_len) && std::isfinite(s.batch) && std::isfinite(s.tokens) &&
                      std::isfinite(s.input_size) && std::isfinite(s.hidden_size) && std::isfinite(s.proj_size) &&
                      std::isfinite(s.layers) && std::isfinite(s.dropout);
  EMUGPU_CHECK(finite && s.seq_len >= 0 && s.batch >= 0 && s.tokens >= 0 && s.input_size >= 0 && s.hidden_size >= 0 &&
                   s.proj_size >= 0 && s.layers >= 1 && s.dropout >= 0 && s.dropout <= 1,
               kValue, "RNN sizes must be finite and >= 0 with at least one layer and dropout in [0, 1], got seq_len ",
               s.seq_len, ", batch ", s.batch, ", tokens ", s.tokens, ", input ", s.input_size, ", hidden ",
               s.hidden_size, ", proj ", s.proj_size, ", layers ", s.layers, ", dropout ", s.dropout);
  EMUGPU_CHECK(s.proj_size == 0 || (s.mode == RnnMode::kLstm && s.proj_size < s.hidden_size), kValue,
               "RNN projections need an LSTM with proj_size < hidden_size, got proj_size ", s.proj_size,
               " with hidden_size ", s.hidden_size, "; set proj_size=0 or make it smaller than hidden_size");
}

double rnn_output_size(const RnnShape& s) { return s.proj_size > 0 ? s.proj_size : s.hidden_size; }

namespace {

double directions(const RnnShape& s) { return s.bidirectional ? 2 : 1; }

// The input width of layer `l`: the data's for the first, both directions'
// outputs for the others.
double layer_input(const RnnShape& s, int l) { return l == 0 ? s.input_size : directions(s) * rnn_output_size(s); }

int layer_count(const RnnShape& s) { return static_cast<int>(std::clamp(s.layers, 1.0, 1e4)); }

// Dropout runs on the outputs of all but the last layer, in training only.
bool drops(const RnnShape& s) { return s.train && s.dropout > 0 && s.layers > 1; }

}  // namespace

double rnn_weight_count(const RnnShape& s) {
  const double gh = rnn_gates(s.mode) * s.hidden_size, out = rnn_output_size(s);
  double count = 0;
  for (int l = 0; l < layer_count(s); ++l) {
    double per_direction = gh * (layer_input(s, l) + out) + (s.bias ? 2 * gh : 0);
    if (s.proj_size > 0) per_direction += s.proj_size * s.hidden_size;
    count += directions(s) * per_direction;
  }
  return count;
}

double rnn_reserve_bytes(const RnnShape& s, double element_size) {
  if (!s.train) return 0;
  const double rows = s.layers * directions(s) * s.tokens;
  // Per row, in hidden widths: an LSTM's four gates, cell state and output;
  // a GRU's three gates, its reset-gated hidden term, output and two more
  // (H100 calibration sweep: peak memory of a 2-layer GRU of 1024 fits 7,
  // the LSTM's 6); an Elman cell's pre-activation and output and one more.
  const double widths = s.mode == RnnMode::kLstm ? 6 : s.mode == RnnMode::kGru ? 7 : 3;
  double bytes = rows * widths * s.hidden_size * element_size;
  if (drops(s)) bytes += (s.layers - 1) * directions(s) * s.tokens * rnn_output_size(s);
  return bytes;
}

double rnn_workspace_bytes(const RnnShape& s, double element_size) {
  // One layer's gate pre-activations (or gradients) and its output for all
  // rows (the same sweep: within 5% of the peak of 2-layer LSTMs of 1024,
  // training and inference; 10-25% under for a 4-layer one of 512).
  return directions(s) * s.tokens * (rnn_gates(s.mode) + 1) * s.hidden_size * element_size;
}

double rnn_flops(const RnnShape& s, bool backward) {
  const double gh = rnn_gates(s.mode) * s.hidden_size, out = rnn_output_size(s);
  double flops = 0;
  for (int l = 0; l < layer_count(s); ++l) {
    double recurrent = 2 * s.tokens * gh * out + (s.proj_size > 0 ? 2 * s.tokens * s.hidden_size * s.proj_size : 0);
    const double input = 2 * s.tokens * gh * layer_input(s, l);
    if (!backward) {
      flops += directions(s) * (input + recurrent);
      continue;
    }
    // The recurrence always runs backward; the input gradient of the first
    // layer only when asked, the weight gradients (one more GEMM per weight) when asked.
    double per_direction = recurrent + (l > 0 || s.input_grad ? input : 0);
    if (s.weight_grad) per_direction += input + recurrent;
    flops += directions(s) * per_direction;
  }
  return flops;
}

RnnTime rnn_time(const RnnShape& s, bool backward, const RnnRates& r, const KernelParams& p) {
  check_rnn_shape(s);
  RnnTime t;
  if (s.tokens <= 0 || s.hidden_size <= 0 || r.gemm_rate <= 0 || r.memory_bandwidth <= 0) return t;
  const double es = r.element_size, gh = rnn_gates(s.mode) * s.hidden_size, out = rnn_output_size(s);
  const double d = directions(s);
  const int layers = layer_count(s);
  auto gemm = [&](double m, double n, double k) {
    const double seconds = gemm_compute_seconds({1, m, n, k, false}, r.gemm_rate, r.sm_count, p);
    t.compute_seconds += seconds;
    t.launches += 1;
    return seconds;
  };
  auto stream = [&](double bytes, double efficiency) {
    t.launches += 1;
    return bytes / (r.memory_bandwidth * efficiency);
  };
  // One timestep of one layer: a recurrent GEMM of `batch` rows, then the
  // fused cell kernel, launched in series: a floor (rnn_step_ns) plus the
  // GEMM's FLOPs at cuDNN's rate. The backward's step also zeroes its state
  // gradients (H100 trace: four kernels against the forward's two; 1.5 times
  // the floor). Projections add a GEMM of P x H per step.
  auto step_gemm = [&](double n, double k) { return 2 * s.batch * n * k / r.gemm_rate; };
  double step = p.rnn_step_ns * 1e-9 * (backward ? 1.5 : 1.0) + step_gemm(gh, out);
  if (s.proj_size > 0) step += step_gemm(s.proj_size, s.hidden_size);
  // The forward runs every layer and direction in series on one stream
  // (H100: the sweep's 2- and 4-layer forward calls, and the synchronised
  // forwards of the unseen runs' LSTM language models, take the serial sum
  // of their steps: 2 x 256 steps of ~21 us in ~11 ms). The backward
  // overlaps the layers as a wavefront (the traced iteration is ~10 ms
  // shorter than its kernels' sum, and the unseen runs' backwards match
  // T + L - 1 steps); the two directions of a bidirectional layer run side
  // by side there, but the next layer waits for both.
  const double path_steps = !backward         ? d * s.layers * s.seq_len
                            : s.bidirectional ? s.layers * s.seq_len
                                              : s.seq_len + s.layers - 1;
  double seconds = path_steps * step;
  t.launches += static_cast<int>(std::min(d * s.layers * s.seq_len * (backward ? 4.0 : 2.0), 1e6));
  for (int l = 0; l < layers; ++l) {
    const double in = layer_input(s, l);
    for (int dir = 0; dir < static_cast<int>(d); ++dir) {
      if (!backward) {
        seconds += gemm(s.tokens, gh, in);  // input projections of all timesteps
        continue;
      }
      if (l > 0 || s.input_grad) seconds += gemm(s.tokens, in, gh);  // the input gradient
      if (!s.weight_grad) continue;
      seconds += gemm(gh, in, s.tokens) + gemm(gh, out, s.tokens);  // dW_ih, dW_hh over all rows
      if (s.proj_size > 0) seconds += gemm(s.proj_size, s.hidden_size, s.tokens);
      // Bias gradients: column sums of the gates' gradients, in a slow
      // strided kernel (H100 trace: 268 MB in 575 us).
      if (s.bias) seconds += stream(s.tokens * gh * es, p.rnn_bias_grad_efficiency);
    }
  }
  if (backward && s.weight_grad) seconds += stream(rnn_weight_count(s) * es, p.memory_efficiency);  // dw zeroed
  // Dropout between layers: a pass over each inner layer's output, and its mask.
  if (drops(s)) seconds += stream((s.layers - 1) * d * s.tokens * out * (2 * es + 1), p.memory_efficiency);
  // cuDNN wants time-major rows: a batch-first input (forward) or output
  // gradient (backward) is transposed into a contiguous copy first.
  if (s.batch_first) {
    const double width = backward ? d * out : s.input_size;
    seconds += stream(2 * s.tokens * width * es, p.memory_efficiency);
  }
  t.seconds = seconds;
  return t;
}

}  // namespace emugpu
