#include "rnn_cost.h"

#include <gtest/gtest.h>

#include "cost_model.h"
#include "error.h"

namespace {

using emugpu::RnnMode;
using emugpu::RnnShape;

// The H100 SXM as the catalog lists it (the GPU the rule's constants come from).
emugpu::GpuSpec h100() {
  emugpu::GpuSpec g;
  g.name = "h100";
  g.sm_count = 132;
  g.major = 9;
  g.fp32_flops = 67e12;
  g.tf32_flops = 494.7e12;
  g.fp16_flops = g.bf16_flops = 989.4e12;
  g.memory_bandwidth = 3350e9;
  g.pcie_generation = 5;
  g.pcie_width = 16;
  return g;
}

// The LSTM language model of the H100 traces: 256 tokens, batch 64, two layers of 1024.
RnnShape lstm_lm() {
  RnnShape s;
  s.seq_len = 256;
  s.batch = 64;
  s.tokens = 256 * 64;
  s.input_size = s.hidden_size = 1024;
  s.layers = 2;
  s.batch_first = true;
  return s;
}

emugpu::RnnRates rates(double element_size = 4) {
  const auto g = h100();
  const auto p = emugpu::default_kernel_params(g);
  return {g.tf32_flops * p.tensor_efficiency * p.conv_tensor_efficiency, g.memory_bandwidth, g.sm_count, element_size};
}

double seconds(const RnnShape& s, bool backward) {
  return emugpu::rnn_time(s, backward, rates(), emugpu::default_kernel_params(h100())).seconds;
}

TEST(RnnCost, WeightCountMatchesPyTorchsParameters) {
  // nn.LSTM(1024, 1024, num_layers=2): per layer 4H x (in + H) weights and two 4H biases.
  EXPECT_DOUBLE_EQ(emugpu::rnn_weight_count(lstm_lm()), 16'793'600);
  // nn.LSTM(10, 20, proj_size=5): w_ih 80x10, w_hh 80x5, two biases of 80, w_hr 5x20.
  RnnShape p;
  p.input_size = 10, p.hidden_size = 20, p.proj_size = 5;
  EXPECT_DOUBLE_EQ(emugpu::rnn_weight_count(p), 800 + 400 + 160 + 100);
  // nn.GRU(8, 16, bidirectional=True, bias=False), two layers: the second reads both directions.
  RnnShape g;
  g.mode = RnnMode::kGru, g.input_size = 8, g.hidden_size = 16, g.layers = 2, g.bidirectional = true, g.bias = false;
  EXPECT_DOUBLE_EQ(emugpu::rnn_weight_count(g), 2 * 48 * (8 + 16) + 2 * 48 * (32 + 16));
}

TEST(RnnCost, ReserveSpaceIsKeptOnlyInTraining) {
  RnnShape s = lstm_lm();
  // Per layer and row: four gates, the cell state and the output.
  EXPECT_DOUBLE_EQ(emugpu::rnn_reserve_bytes(s, 4), 2 * 16384 * 6 * 1024 * 4.0);
  s.dropout = 0.5;  // a mask byte per element of the first layer's output
  EXPECT_DOUBLE_EQ(emugpu::rnn_reserve_bytes(s, 4), 2 * 16384 * 6 * 1024 * 4.0 + 16384 * 1024);
  s.train = false;
  EXPECT_EQ(emugpu::rnn_reserve_bytes(s, 4), 0);
  // One layer's gates and output, whether training or not.
  EXPECT_DOUBLE_EQ(emugpu::rnn_workspace_bytes(s, 2), 16384 * 5 * 1024 * 2.0);
  // A GRU keeps more per gate than an LSTM (measured peaks).
  RnnShape gru = lstm_lm();
  gru.mode = RnnMode::kGru;
  EXPECT_GT(emugpu::rnn_reserve_bytes(gru, 4), emugpu::rnn_reserve_bytes(lstm_lm(), 4));
}

TEST(RnnCost, BackwardLayersOverlapAsAWavefront) {
  RnnShape one = lstm_lm();
  one.layers = 1;
  RnnShape two = lstm_lm();
  // The second layer adds one step of latency and its GEMMs, not a whole recurrence.
  const double added = seconds(two, true) - seconds(one, true);
  EXPECT_GT(added, 0);
  EXPECT_LT(added, 0.5 * seconds(one, true));
}

TEST(RnnCost, ForwardLayersAndDirectionsRunInSeries) {
  RnnShape one = lstm_lm();
  one.layers = 1;
  RnnShape two = lstm_lm();
  // The second layer adds a whole recurrence (and its input GEMM).
  EXPECT_GT(seconds(two, false), 1.8 * seconds(one, false));
  RnnShape bi = one;
  bi.bidirectional = true;
  EXPECT_GT(seconds(bi, false), 1.8 * seconds(one, false));
}

TEST(RnnCost, BidirectionalLayersWaitForBothDirections) {
  RnnShape uni = lstm_lm();
  uni.input_size = uni.hidden_size = 256;  // step-bound: the recurrence dominates
  RnnShape bi = uni;
  bi.bidirectional = true;
  // Two layers of 256 steps in series (the directions side by side) against 257 steps of wavefront.
  EXPECT_GT(seconds(bi, false), 1.8 * seconds(uni, false));
}

TEST(RnnCost, SmallStepsCostTheirLaunchFloorAndLargeOnesTheirGemm) {
  RnnShape narrow = lstm_lm();
  narrow.input_size = narrow.hidden_size = 256;
  RnnShape wide = lstm_lm();
  wide.input_size = wide.hidden_size = 2048;
  // The forward's recurrence of 2 x 256 steps in series: at least the floor per step.
  const double floor = 512 * emugpu::default_kernel_params(h100()).rnn_step_ns * 1e-9;
  EXPECT_GT(seconds(narrow, false), floor);
  EXPECT_LT(seconds(narrow, false), 1.2 * floor);
  EXPECT_GT(seconds(wide, false), 2 * floor);  // 4 x 2048 x 2048 per step and row
}

TEST(RnnCost, TimeFollowsTheTimestepsNotTheOpsPerStep) {
  RnnShape s = lstm_lm();
  const double t256 = seconds(s, false);
  s.seq_len = 512, s.tokens = 512 * 64;
  EXPECT_NEAR(seconds(s, false) / t256, 2.0, 0.05);
}

TEST(RnnCost, TheTracedLanguageModelTakesWhatCudnnTakes) {
  // H100 trace of this model (torch 2.11, cuDNN 9.19): the LSTM's kernels
  // add up to ~31 ms per iteration; the unseen runs' synchronised forward
  // and backward leave ~10.6 ms (serial) and ~13.4 ms (the wavefront
  // overlaps the layers) for it. A per-op decomposition charges several
  // times that.
  const double forward = seconds(lstm_lm(), false), backward = seconds(lstm_lm(), true);
  EXPECT_GT(forward, 9e-3);
  EXPECT_LT(forward, 13e-3);
  EXPECT_GT(forward + backward, 20e-3);
  EXPECT_LT(forward + backward, 28e-3);
}

TEST(RnnCost, BackwardSkipsGradientsNobodyAskedFor) {
  RnnShape all = lstm_lm();
  RnnShape data_only = all;
  data_only.weight_grad = false;
  data_only.input_grad = false;
  EXPECT_LT(seconds(data_only, true), 0.8 * seconds(all, true));
  EXPECT_LT(emugpu::rnn_flops(data_only, true), emugpu::rnn_flops(all, true));
}

TEST(RnnCost, ProjectionsAddAStepGemmAndShrinkTheRecurrence) {
  RnnShape s = lstm_lm();
  s.proj_size = 256;
  // The recurrent GEMM reads 4H x P weights instead of 4H x H, plus P x H for the projection.
  EXPECT_LT(seconds(s, false), seconds(lstm_lm(), false));
  EXPECT_GT(emugpu::rnn_flops(s, false), 0);
}

TEST(RnnCost, BadShapesAreRejected) {
  RnnShape gru = lstm_lm();
  gru.mode = RnnMode::kGru;
  gru.proj_size = 128;  // projections exist for LSTMs only
  EXPECT_THROW(seconds(gru, false), emugpu::Error);
  RnnShape none = lstm_lm();
  none.layers = 0;
  EXPECT_THROW(seconds(none, false), emugpu::Error);
}

TEST(RnnCost, CostModelChargesTheWholeCallOnce) {
  const auto g = h100();
  const emugpu::CostModel model(g);
  emugpu::OpCost c;
  c.family = emugpu::OpFamily::kRnn;
  c.dtype = emugpu::DType::kTensorFloat32;
  c.rnn = lstm_lm();
  const emugpu::KernelCost k = model.kernel_cost(c);
  const auto p = emugpu::default_kernel_params(g);
  EXPECT_NEAR(static_cast<double>(k.duration), p.launch_ns + seconds(lstm_lm(), false) * 1e9, 2);
  // Per layer: an input GEMM and two kernels per step; the input's transpose.
  EXPECT_EQ(k.launches, 2 + 2 * 2 * 256 + 1);
  c.family = emugpu::OpFamily::kRnnBackward;
  EXPECT_GT(model.kernel_cost(c).duration, k.duration);
}

}  // namespace
