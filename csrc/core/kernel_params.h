// How real kernels of one GPU fall short of its peak rates: a handful of
// parameters per GPU architecture (kernel_params.cpp cites where each row
// comes from), replaced by a calibration file's fit where one exists.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "catalog.h"

namespace emugpu {

struct KernelParams {
  // Fraction of the peak FP32 (and FP64) rate large GEMM-shaped kernels
  // (cuBLAS SGEMM, cuDNN's implicit-GEMM convolutions) sustain on CUDA cores.
  double simt_efficiency = 0.75;
  // The same on tensor cores (FP16, BF16, TF32 where the architecture has them).
  double tensor_efficiency = 0.6;
  // What cuDNN's tensor-core convolutions keep of that rate (their implicit
  // GEMM gathers its operand tile by tile; H100 sweep, cudnn.benchmark off: 0.6).
  double conv_tensor_efficiency = 1.0;
  // Fused attention kernels' fraction of the rate GEMMs reach (softmax and
  // masking between their two products, the backward's recomputation).
  double attention_efficiency = 0.6;
  // Fraction of the peak DRAM bandwidth streaming kernels (elementwise,
  // copies, and ops with no family) sustain.
  double memory_efficiency = 0.8;
  // The same for row reductions, softmax and losses (each row read once per
  // pass its kernel makes: the glue charges long softmax rows' extra passes
  // as bytes; H100 sweep: 0.94, sums and softmax alike),
  double reduction_efficiency = 0.6;
  // layer, group and RMS norms (a row per block, kept on chip),
  double norm_efficiency = 0.6;
  // batch norms (per-channel statistics over a strided N*H*W, then
  // normalisation; the second read of the input is charged as bytes),
  double batch_norm_efficiency = 0.6;
  // with C channels a batch norm forward runs at C / (C + this * SMs) of
  // that (a backward at C / (C + 3 * this * SMs)),
  double batch_norm_channels_per_sm = 0.75;
  // A 16-bit batch norm that PyTorch runs on its own kernels (bfloat16, or
  // half weights; OpCost::cudnn is false) takes this many times the float32
  // one's time, forward and backward (H100 sweep, bfloat16: 1.4-1.8x
  // forward, 1.05-1.3x backward). Every 16-bit one is charged float32's bytes.
  double batch_norm_16bit_forward = 1.0;
  double batch_norm_16bit_backward = 1.0;
  // An eval-mode batch norm (running statistics) is one elementwise pass:
  // it reads its input and writes its output once, at this fraction of the
  // peak bandwidth for 32-bit tensors (H100 sweep: 2.35-2.43 TB/s, 0.72),
  // and a 16-bit one takes this share of the 32-bit one's time (the same
  // per-element float math; the sweep: 0.74-0.91 of float32's time, not
  // half). A plane of H*W elements per image and channel smaller than
  // `batch_norm_eval_plane` leaves the kernel's threads idle: the rate is
  // scaled by plane / (plane + this) (the sweep at batch 256: 7x7 planes at
  // 0.18 of the 112x112 planes' element rate, 14x14 at 0.6).
  double batch_norm_eval_efficiency = 0.7;
  double batch_norm_eval_16bit = 0.8;
  double batch_norm_eval_plane = 0;
  // and optimizer steps (foreach and fused multi-tensor kernels).
  double optimizer_efficiency = 0.7;
  // Fraction of the peak bandwidth kernels with scattered reads sustain
  // (embedding lookups and their backward, index and scatter ops).
  double gather_efficiency = 0.4;
  // Fraction of the peak bandwidth depthwise convolutions (one input channel
  // per group: cuDNN's direct kernels) sustain.
  double depthwise_efficiency = 0.35;
  // The fraction of the CUDA-core FP32 peak the multiply-adds of 32-bit
  // ones reach on NHWC tensors (a forward or input gradient; with a 7x7
  // filter they are compute-bound: H100 trace of ConvNeXt-T fp32, 13.5
  // GFLOP in 2.7 ms, and the H100 sweep: 0.075), and the share of that
  // they keep on NCHW tensors (the sweep: 0.46-0.57),
  double depthwise_compute_efficiency = 0.075;
  double depthwise_nchw_factor = 0.5;
  // and the same for the weight gradient of a filter beyond 5x5 (generic
  // kernels), NHWC, layout transforms included (the trace: 13.5 GFLOP in
  // 36 ms; the sweep: 0.006), and NCHW (the sweep: 0.022, bf16 alike).
  double depthwise_wgrad_efficiency = 0.006;
  double depthwise_wgrad_nchw_efficiency = 0.022;
  // How much faster than its implicit GEMM cuDNN runs a 3x3 stride-1 FP32
  // convolution (forward and input gradient) with Winograd, which it picks
  // there on CUDA cores; 1 where it does not.
  double winograd_gain = 1.0;
  // The fraction of the tensor-core rate cuBLAS keeps when a matrix's
  // contiguous dimension (N or K) is not a multiple of 16 bytes: without
  // vectorised loads it picks slower kernels (GPT-2's 50257-word head).
  // This is the rate for 4-byte operands (TF32); 16-bit ones keep half.
  double unaligned_efficiency = 0.3;
  // cuDNN's RNNs (rnn_cost.h): each timestep of a layer launches its
  // recurrent GEMM and its fused cell kernel in series, which take at least
  // this long together, the GEMM's FLOPs at cuDNN's rate coming on top
  // (H100 calibration sweep, fp32 and bf16 forward: 20-23 us per step and
  // layer for hidden sizes 256-1024, 59 us at 2048; the backward's step,
  // with two memsets more, 1.5 times it),
  double rnn_step_ns = 20'000;
  // and the bias gradients' column sums over all rows read the gates'
  // gradients at this fraction of the bandwidth (H100 trace of an LSTM
  // language model: 268 MB in 575 us, 0.14).
  // Every architecture takes these H100 values until a calibration fits its own.
  double rnn_bias_grad_efficiency = 0.14;
  // PyTorch's column reductions (a sum over rows that keeps the contiguous
  // columns: bias and scale gradients) spread each thread's loads along a
  // row, so narrow rows leave too few loads in flight: the bandwidth share
  // falls as row bytes / (row bytes + this). H100 traces, each within 5%:
  // 10000 fp32 columns at 0.82 of the peak (an LSTM head's bias gradient),
  // 768-3072 bf16 columns at 0.30-0.35 (GPT-2, ViT-B/16), 96-3072 fp32 ones
  // at 0.24 (ConvNeXt-T). Every architecture takes this H100 value.
  double column_reduction_half_bytes = 3'000;
  // PyTorch's layer norm kernels run a block per row, whose barriers and
  // block-wide sums take about this long per SM whatever the row's width:
  // short rows (ConvNeXt's 96-768 channels) leave the bandwidth idle. H100
  // trace of ConvNeXt-T fp32: 1.34 M rows per iteration's forward in 2.24 ms
  // on 132 SMs.
  double norm_row_ns = 220;
  // The elements per nanosecond and SM PyTorch's non-vectorised elementwise
  // kernels (strided, broadcast or mixed-dtype operands) process: H100
  // sweep, 16-bit broadcast multiplies at 375 G elements/s (1.5 TB/s where
  // contiguous ones reach 2.8), 2.8 per SM.
  double strided_elements_per_sm_ns = 2.8;
  // Device time of a kernel that does no work: launch, ramp-up and drain.
  double launch_ns = 4'000;
  // A GEMM's reduction length at which its tiles' main loop is as long as
  // their prologue and epilogue (short reductions run far below peak).
  double gemm_k_half = 32;
  // Where the values come from: "table: volta", "calibration: <file>".
  std::string source;
};

// The row of the architecture table for `gpu`'s compute capability.
KernelParams default_kernel_params(const GpuSpec& gpu);

// The parameters by name, for calibration fits and the fitting benchmark.
struct KernelParamField {
  const char* name;
  double KernelParams::*member;
  double lo;  // the range a fit may move it in
  double hi;
};
const std::vector<KernelParamField>& kernel_param_fields();
// Sets the parameter `name`; throws kValue for an unknown name or a value
// outside the field's range.
void set_kernel_param(KernelParams& params, std::string_view name, double value);

}  // namespace emugpu
