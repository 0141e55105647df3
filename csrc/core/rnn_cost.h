// Recurrent layers (LSTM, GRU, Elman RNNs) as PyTorch runs them on CUDA:
// one call into cuDNN (aten::_cudnn_rnn, and _cudnn_rnn_backward for the
// gradients), not a kernel per timestep op. cuDNN computes each layer's
// input projections for all timesteps in one GEMM, then walks the timesteps
// with a small recurrent GEMM and a fused cell kernel per step; with one
// direction the layers overlap as a wavefront (layer l at step t beside
// layer l+1 at step t-1), so L layers of T steps take T + L - 1 step times.
// Its buffers (workspace for the call, reserve space kept for the backward
// in training) are sized here too, so that memory follows cuDNN's.
#pragma once

#include "catalog.h"
#include "kernel_params.h"

namespace emugpu {

// cuDNN's cudnnRNNMode_t values, which PyTorch passes to _cudnn_rnn as `mode`.
enum class RnnMode { kRnnRelu = 0, kRnnTanh = 1, kLstm = 2, kGru = 3 };

struct RnnShape {
  RnnMode mode = RnnMode::kLstm;
  double seq_len = 0;  // timesteps
  double batch = 0;    // sequences per step (a packed batch: its first, largest step)
  double tokens = 0;   // rows over all steps: seq_len * batch, or a packed batch's sum of batch sizes
  double input_size = 0;
  double hidden_size = 0;
  double proj_size = 0;  // LSTM projections (0: none)
  double layers = 1;
  bool bidirectional = false;
  bool bias = true;
  double dropout = 0;        // on the outputs of all but the last layer, in training only
  bool train = true;         // training keeps the reserve space for the backward
  bool batch_first = false;  // cuDNN wants time-major data: a batch-first input is transposed (a copy)
  // Backward only: which gradients the call computes.
  bool input_grad = true;
  bool weight_grad = true;
};

// Gates per cell: 4 (LSTM), 3 (GRU), 1 (Elman).
int rnn_gates(RnnMode mode);
// Checks a shape's sizes (kValue naming the bad one).
void check_rnn_shape(const RnnShape& s);
// The width each layer passes on per direction: proj_size if set, else hidden_size.
double rnn_output_size(const RnnShape& s);
// Parameters in all layers and directions (cuDNN's flat weight buffer).
double rnn_weight_count(const RnnShape& s);
// cuDNN's reserve space in training (0 in inference): per layer, direction
// and row, the gate activations, the cell state and the output, which the
// backward reads and then overwrites with the gates' gradients, plus a
// byte per element of each dropout mask. cuDNN does not publish its sizes:
// these are fitted to measured peaks (rnn_cost.cpp).
double rnn_reserve_bytes(const RnnShape& s, double element_size);
// The workspace a call allocates and frees: one layer's gate
// pre-activations (forward) or gradients (backward) and output for all rows.
double rnn_workspace_bytes(const RnnShape& s, double element_size);
// Multiply-adds (x2) of the forward, or of the backward's asked gradients.
double rnn_flops(const RnnShape& s, bool backward);

// What the GPU offers the rule: the GEMM rate (FLOP/s, tensor cores or not,
// after the sustained efficiency), the memory bandwidth and the SMs.
struct RnnRates {
  double gemm_rate = 0;
  double memory_bandwidth = 0;
  int sm_count = 1;
  double element_size = 4;
};

struct RnnTime {
  double seconds = 0;
  double compute_seconds = 0;  // the GEMMs' part, for compute_bound
  int launches = 0;            // kernels cuDNN launches
};

// The forward (backward: false) or the backward of one _cudnn_rnn call.
RnnTime rnn_time(const RnnShape& s, bool backward, const RnnRates& rates, const KernelParams& p);

}  // namespace emugpu
