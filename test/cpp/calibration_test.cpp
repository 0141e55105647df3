#include "calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include "clock.h"
#include "error.h"

namespace {

using emugpu::DType;
using emugpu::OpCost;
using emugpu::OpFamily;

emugpu::GpuSpec h100() {
  emugpu::GpuSpec g;
  g.name = "NVIDIA H100 80GB HBM3";
  g.sm_count = 132;
  g.major = 9;
  g.fp32_flops = 67e12;
  g.tf32_flops = 495e12;
  g.bf16_flops = 989e12;
  g.fp16_flops = 989e12;
  g.memory_bandwidth = 3.35e12;
  return g;
}

std::string error_of(const std::string& text, const emugpu::GpuSpec& gpu) {
  try {
    emugpu::parse_calibration(text, "cal.json", gpu);
  } catch (const emugpu::Error& e) {
    return e.what();
  }
  return "";
}

const char* kPoints = R"([
  {"family": "gemm", "op": "mm", "shape": {"M": 4096, "N": 4096, "K": 4096}, "dtype": "float32",
   "flags": {"tf32": true}, "time_s": 0.0004, "flops": 137438953472, "bytes": 201326592, "kernels": 1},
  {"family": "elementwise", "op": "add", "shape": {"numel": 1048576}, "dtype": "float32", "flags": {},
   "time_s": 1.2e-5, "flops": 1048576, "bytes": 12582912, "kernels": 1},
  {"family": "conv", "op": "backward_weight", "shape": {"N": 32, "C": 64, "H": 56, "W": 56, "K": 64, "R": 3,
   "S": 3, "stride": 1, "pad": 1, "groups": 1, "P": 56, "Q": 56}, "dtype": "bfloat16", "flags": {},
   "time_s": 2e-4, "flops": 7e9, "bytes": 1e7, "kernels": 1},
  {"family": "transfer", "op": "h2d", "shape": {"bytes": 4096}, "dtype": "float32", "flags": {"pinned": true},
   "time_s": 1e-5, "flops": 0, "bytes": 4096, "kernels": 1}
])";

std::string document(const std::string& gpu, const std::string& points) {
  return R"({"schema": "torch-emugpu calibration v1", "gpu": ")" + gpu + R"(", "measurements": )" + points + "}";
}

TEST(Calibration, ParsesTheSweepIntoTheOpsTheEmulatorCharges) {
  const auto gpu = h100();
  const auto cal = emugpu::parse_calibration(document("NVIDIA H100 80GB HBM3", kPoints), "cal.json", gpu);
  ASSERT_EQ(cal.cases.size(), 3u);
  EXPECT_EQ(cal.skipped, 1);  // the transfer
  const OpCost& mm = cal.cases[0].ops.at(0);
  EXPECT_EQ(mm.family, OpFamily::kMm);
  EXPECT_EQ(mm.dtype, DType::kTensorFloat32);  // the tf32 flag
  EXPECT_EQ(mm.gemms[0].k, 4096);
  EXPECT_EQ(cal.cases[1].ops.at(0).family, OpFamily::kElementwise);
  const OpCost& wgrad = cal.cases[2].ops.at(0);
  EXPECT_EQ(wgrad.family, OpFamily::kConvBackward);
  ASSERT_EQ(wgrad.gemm_count, 1);
  EXPECT_EQ(wgrad.gemms[0].k, 32 * 56 * 56);  // the weight gradient reduces over N*P*Q
  EXPECT_EQ(cal.cases[2].seconds, 2e-4);
  EXPECT_TRUE(cal.cases[0].upper_bound);  // alone in its group: its own floor
}

TEST(Calibration, PointsAtTheirOpsFloorOnlyBoundTheDeviceTime) {
  const auto gpu = h100();
  const auto cal = emugpu::parse_calibration(document(gpu.name, R"([
    {"family": "elementwise", "op": "add", "shape": {"numel": 1024}, "dtype": "float32", "time_s": 8e-6,
     "flops": 1024, "bytes": 12288},
    {"family": "elementwise", "op": "add", "shape": {"numel": 4096}, "dtype": "float32", "time_s": 9e-6,
     "flops": 4096, "bytes": 49152},
    {"family": "elementwise", "op": "add", "shape": {"numel": 268435456}, "dtype": "float32", "time_s": 1.2e-3,
     "flops": 268435456, "bytes": 3221225472}])"),
                                             "cal.json", gpu);
  ASSERT_EQ(cal.cases.size(), 3u);
  EXPECT_TRUE(cal.cases[0].upper_bound);
  EXPECT_TRUE(cal.cases[1].upper_bound);  // within 1.5x of the fastest: launch-bound
  EXPECT_FALSE(cal.cases[2].upper_bound);
  // An upper bound counts only when the model predicts more.
  auto fast = emugpu::default_kernel_params(gpu);
  fast.launch_ns = 1'000;
  std::vector<emugpu::MeasuredCase> small = {cal.cases[0]};
  EXPECT_EQ(emugpu::mean_abs_log_error(gpu, small, fast), 0);
  fast.launch_ns = 20'000;
  EXPECT_GT(emugpu::mean_abs_log_error(gpu, small, fast), 0.5);
}

TEST(Calibration, LossAndSoftmaxPointsAreChargedAsTheirKernelsReadRows) {
  const auto gpu = h100();
  const auto cal = emugpu::parse_calibration(document(gpu.name, R"([
    {"family": "softmax", "op": "forward", "shape": {"tokens": 8192, "classes": 50257}, "dtype": "float32",
     "time_s": 2e-3, "flops": 1e9, "bytes": 3293642752},
    {"family": "softmax", "op": "forward", "shape": {"tokens": 8192, "classes": 1000}, "dtype": "float32",
     "time_s": 3e-5, "flops": 1e7, "bytes": 65536000},
    {"family": "cross_entropy", "op": "forward_backward", "shape": {"tokens": 8192, "classes": 50257},
     "dtype": "float32", "time_s": 5e-3, "flops": 1e9, "bytes": 3293708288, "kernels": 6},
    {"family": "norm", "op": "layer_norm_backward", "shape": {"tokens": 16384, "width": 2048},
     "dtype": "float32", "time_s": 3e-4, "flops": 1e9, "bytes": 402677760}])"),
                                             "cal.json", gpu);
  ASSERT_EQ(cal.cases.size(), 4u);
  const double logits = 8192.0 * 50257 * 4;
  EXPECT_DOUBLE_EQ(cal.cases[0].ops.at(0).bytes, 2 * logits + 2 * logits);  // the row read thrice
  EXPECT_DOUBLE_EQ(cal.cases[1].ops.at(0).bytes, 65536000);                 // on chip: once
  // Log-softmax, nll_loss (a gather), its backward (a zero-fill), log-softmax's
  // backward, the seed: the logits move 4 + 0 + 1 + 4 times, not twice.
  const auto& ce = cal.cases[2].ops;
  ASSERT_EQ(ce.size(), 5u);
  double bytes = 0;
  for (const OpCost& o : ce) bytes += o.bytes;
  EXPECT_NEAR(bytes / logits, 9, 0.01);
  EXPECT_LT(ce[1].bytes, 1e6);
  EXPECT_EQ(ce[4].family, OpFamily::kElementwise);
  // Layer norm's backward reads dy and x once more for the weight gradients.
  EXPECT_DOUBLE_EQ(cal.cases[3].ops.at(0).bytes, 402677760 + 2.0 * 16384 * 2048 * 4);
}

TEST(Calibration, RefusesAFileMeasuredOnAnotherGpu) {
  const std::string e = error_of(document("NVIDIA A100-SXM4-40GB", kPoints), h100());
  EXPECT_NE(e.find("cal.json"), std::string::npos) << e;
  EXPECT_NE(e.find("field 'gpu'"), std::string::npos) << e;
  EXPECT_NE(e.find("A100"), std::string::npos) << e;
}

TEST(Calibration, NamesTheFileAndFieldOfMalformedContent) {
  const auto gpu = h100();
  std::string points = kPoints;
  points.replace(points.find("\"time_s\": 0.0004"), 16, "\"time_s\": -1");
  std::string e = error_of(document(gpu.name, points), gpu);
  EXPECT_NE(e.find("measurements[0].time_s"), std::string::npos) << e;
  e = error_of(R"({"schema": "torch-emugpu profile v1", "gpu": "x", "measurements": []})", gpu);
  EXPECT_NE(e.find("field 'schema'"), std::string::npos) << e;
  e = error_of(document(gpu.name, R"([{"family": "gemm", "op": "mm", "shape": {"M": 1, "N": 1}, "dtype": "float32",
                                      "time_s": 1e-5, "flops": 2, "bytes": 12}])"),
               gpu);
  EXPECT_NE(e.find("measurements[0].shape.K"), std::string::npos) << e;
  e = error_of("{not json", gpu);
  EXPECT_NE(e.find("cal.json"), std::string::npos) << e;
  e = error_of(document(gpu.name, "[]"), gpu);
  EXPECT_NE(e.find("no point"), std::string::npos) << e;
}

TEST(Calibration, UnknownFamilyIsSkippedWithWarning) {
  // A newer sweep's file: a family and a conv op this version does not know
  // (with a dtype it does not know either) are skipped, the rest is fitted.
  const auto gpu = h100();
  std::string points = kPoints;
  points.insert(points.rfind(']'), R"(,
    {"family": "ssm_scan", "op": "forward", "shape": {"L": 4096}, "dtype": "float8_e4m3fn", "time_s": 1e-4,
     "flops": 1e9, "bytes": 1e7},
    {"family": "ssm_scan", "op": "backward", "shape": {}, "dtype": "float32", "time_s": 2e-4, "flops": 2e9,
     "bytes": 2e7},
    {"family": "conv", "op": "backward_bias", "shape": {}, "dtype": "float32", "time_s": 1e-5, "flops": 0,
     "bytes": 1e6})");
  const auto cal = emugpu::parse_calibration(document(gpu.name, points), "cal.json", gpu);
  EXPECT_EQ(cal.cases.size(), 3u);
  EXPECT_EQ(cal.skipped, 4);  // the transfer and the three unknown points
  EXPECT_EQ(cal.unknown_points, 3);
  EXPECT_EQ(cal.unknown, (std::vector<std::string>{"conv/backward_bias", "ssm_scan"}));
  const std::string w = emugpu::calibration_warning(cal);
  EXPECT_NE(w.find("cal.json"), std::string::npos) << w;
  EXPECT_NE(w.find("3 points"), std::string::npos) << w;
  EXPECT_NE(w.find("(conv/backward_bias, ssm_scan)"), std::string::npos) << w;
  EXPECT_NE(w.find("the other 3"), std::string::npos) << w;
  // Nothing to warn about in a file this version knows all of.
  EXPECT_EQ(emugpu::calibration_warning(emugpu::parse_calibration(document(gpu.name, kPoints), "cal.json", gpu)), "");
  // With nothing left to fit the file is refused, naming what was not known.
  const std::string e = error_of(document(gpu.name, R"([{"family": "fft", "op": "x", "shape": {},
      "dtype": "float32", "time_s": 1e-5, "flops": 2, "bytes": 12}])"),
                                 gpu);
  EXPECT_NE(e.find("no point"), std::string::npos) << e;
  EXPECT_NE(e.find("does not know fft"), std::string::npos) << e;
}

TEST(Calibration, NewFamiliesAreFittedOnlyWhereTheCostModelHasTheirRule) {
  const auto gpu = h100();
  auto cal = emugpu::parse_calibration(document(gpu.name, R"([
    {"family": "rnn", "op": "lstm_forward_backward", "shape": {"seq": 256, "batch": 64, "input": 1024,
     "hidden": 1024, "layers": 2}, "dtype": "float32", "flags": {"cudnn_tf32": true}, "time_s": 0.02,
     "flops": 1.6e12, "bytes": 1e9, "kernels": 3000, "peak_bytes": 900000000, "backend": "cudnn"},
    {"family": "norm", "op": "batch_norm_eval", "shape": {"N": 256, "C": 64, "H": 112, "W": 112},
     "dtype": "bfloat16", "time_s": 3e-4, "flops": 4e8, "bytes": 8e8},
    {"family": "conv", "op": "forward", "shape": {"N": 64, "C": 96, "H": 56, "W": 56, "K": 96, "R": 7, "S": 7,
     "stride": 1, "pad": 3, "groups": 96, "P": 56, "Q": 56}, "dtype": "float32",
     "flags": {"cudnn_tf32": true, "channels_last": true}, "time_s": 5e-4, "flops": 1.8e9, "bytes": 1.5e8},
    {"family": "attention", "op": "forward", "shape": {"B": 8, "H": 32, "Hkv": 8, "L": 1024, "E": 128},
     "dtype": "bfloat16", "flags": {"causal": true, "gqa": true}, "time_s": 2e-4, "flops": 1.4e11,
     "bytes": 1.7e8, "kernels": 1, "backend": "flash"}])"),
                                       "cal.json", gpu);
  // An eval-mode batch norm is fitted with the eval rule's form: one pass
  // over planes of H*W elements, running statistics.
  EXPECT_EQ(cal.skipped, 0);
  EXPECT_TRUE(cal.unknown.empty());
  ASSERT_EQ(cal.cases.size(), 4u);
  const OpCost& eval = cal.cases[1].ops.at(0);
  EXPECT_EQ(eval.family, OpFamily::kBatchNorm);
  EXPECT_TRUE(eval.running_stats);
  EXPECT_FALSE(eval.backward);
  EXPECT_EQ(eval.plane, 112 * 112);
  EXPECT_EQ(eval.bytes, 8e8);  // read and written once, as measured
  cal.cases.erase(cal.cases.begin() + 1);
  // An RNN's forward and backward are the two cuDNN calls the rule times (rnn_cost.h).
  const auto& rnn = cal.cases[0].ops;
  ASSERT_EQ(rnn.size(), 2u);
  EXPECT_EQ(rnn[0].family, OpFamily::kRnn);
  EXPECT_EQ(rnn[1].family, OpFamily::kRnnBackward);
  EXPECT_EQ(rnn[0].rnn.tokens, 256 * 64);
  EXPECT_TRUE(rnn[0].rnn.batch_first && rnn[0].rnn.train);
  EXPECT_EQ(rnn[0].dtype, DType::kTensorFloat32);
  EXPECT_TRUE(cal.cases[1].ops.at(0).conv.channels_last);
  EXPECT_EQ(cal.cases[1].ops.at(0).conv.groups, 96);
  const OpCost& gqa = cal.cases[2].ops.at(0);
  EXPECT_EQ(gqa.family, OpFamily::kAttention);
  EXPECT_EQ(gqa.gemms[0].batch, 8 * 32 * 0.5);  // by query heads, causal
}

TEST(Calibration, BroadcastMultipliesAreStridedElementwiseKernels) {
  const auto gpu = h100();
  const auto cal = emugpu::parse_calibration(document(gpu.name, R"([
    {"family": "elementwise", "op": "mul_broadcast", "shape": {"N": 64, "C": 144, "H": 56, "W": 56},
     "dtype": "bfloat16", "time_s": 7.7e-5, "flops": 2.9e7, "bytes": 1.2e8},
    {"family": "elementwise", "op": "mul", "shape": {"numel": 1048576}, "dtype": "bfloat16",
     "time_s": 1.6e-5, "flops": 1048576, "bytes": 6291456}])"),
                                             "cal.json", gpu);
  ASSERT_EQ(cal.cases.size(), 2u);
  // PyTorch cannot vectorise a broadcast operand: the strided rule, by elements.
  EXPECT_TRUE(cal.cases[0].ops.at(0).strided);
  EXPECT_EQ(cal.cases[0].ops.at(0).elements, 64.0 * 144 * 56 * 56);
  EXPECT_FALSE(cal.cases[1].ops.at(0).strided);
}

TEST(Calibration, TheFitRecoversTheParametersThatMadeTheData) {
  const auto gpu = h100();
  emugpu::KernelParams truth = emugpu::default_kernel_params(gpu);
  truth.tensor_efficiency = 0.45;
  truth.memory_efficiency = 0.55;
  truth.launch_ns = 7'000;
  const emugpu::CostModel model(gpu, {}, truth);
  std::vector<emugpu::MeasuredCase> cases;
  for (double n : {256.0, 1024.0, 4096.0, 8192.0}) {
    OpCost mm{2 * n * n * n, 6 * n * n, DType::kBFloat16, OpFamily::kMm};
    mm.gemm_count = 1;
    mm.gemms[0] = {1, n, n, n, false};
    cases.push_back({{mm}, static_cast<double>(model.kernel(mm)) * 1e-9});
  }
  for (double bytes : {1e3, 1e6, 1e8, 1e9}) {
    const OpCost add{bytes / 12, bytes, DType::kFloat32, OpFamily::kElementwise};
    cases.push_back({{add}, static_cast<double>(model.kernel(add)) * 1e-9});
  }
  const auto start = emugpu::default_kernel_params(gpu);
  EXPECT_GT(emugpu::mean_abs_log_error(gpu, cases, start), 0.05);
  const auto fit = emugpu::fit_kernel_params(gpu, cases, start, {"tensor_efficiency", "memory_efficiency", "launch_ns"},
                                             "calibration: test");
  EXPECT_NEAR(fit.tensor_efficiency, 0.45, 0.02);
  EXPECT_NEAR(fit.memory_efficiency, 0.55, 0.02);
  EXPECT_NEAR(fit.launch_ns, 7'000, 300);
  EXPECT_LT(emugpu::mean_abs_log_error(gpu, cases, fit), 0.01);
  EXPECT_EQ(fit.source, "calibration: test");
  EXPECT_THROW(emugpu::fit_kernel_params(gpu, cases, start, {"warp_speed"}, "x"), emugpu::Error);
}

TEST(Calibration, IsFoundInTheGpusFolderOnTheSearchPath) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("emugpu-cal-" + std::to_string(::getpid()));
  fs::create_directories(root / "second" / "NVIDIA_H100_80GB_HBM3");
  fs::create_directories(root / "first" / "NVIDIA_A100-SXM4-40GB");
  std::ofstream(root / "first" / "NVIDIA_A100-SXM4-40GB" / "calibration.json") << "{}";
  std::ofstream(root / "second" / "NVIDIA_H100_80GB_HBM3" / "calibration.json") << "{}";
  const auto found = emugpu::find_calibration({(root / "first").string(), (root / "second").string()}, h100());
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(fs::path(*found), root / "second" / "NVIDIA_H100_80GB_HBM3" / "calibration.json");
  EXPECT_FALSE(emugpu::find_calibration({(root / "first").string(), "/nonexistent"}, h100()).has_value());
  fs::remove_all(root);
}

// Cheap synthetic cases: elementwise ops of growing size, times from a model
// with other parameters than the defaults, a little noise by index.
std::vector<emugpu::MeasuredCase> synthetic_cases(const emugpu::GpuSpec& gpu, size_t count) {
  emugpu::KernelParams truth = emugpu::default_kernel_params(gpu);
  truth.memory_efficiency = 0.55;
  truth.launch_ns = 7'000;
  const emugpu::CostModel model(gpu, {}, truth);
  std::vector<emugpu::MeasuredCase> cases;
  for (size_t i = 0; i < count; ++i) {
    const double bytes = 4096.0 * static_cast<double>(1 + i % 4000);
    const OpCost add{bytes / 12, bytes, DType::kFloat32, OpFamily::kElementwise};
    const double noise = 1 + 0.02 * static_cast<double>(i % 7) / 7;
    cases.push_back({{add}, static_cast<double>(model.kernel(add)) * 1e-9 * noise});
  }
  return cases;
}

TEST(CalibrationFit, ALargeFileIsFittedToKMaxFitCasesEvenlySpread) {
  const auto gpu = h100();
  const auto cases = synthetic_cases(gpu, 3 * emugpu::kMaxFitCases + 5);
  std::vector<emugpu::MeasuredCase> spread;
  for (size_t i = 0; i < emugpu::kMaxFitCases; ++i) spread.push_back(cases[i * cases.size() / emugpu::kMaxFitCases]);
  const std::vector<std::string> names = {"memory_efficiency", "launch_ns"};
  const auto start = emugpu::default_kernel_params(gpu);
  const auto all = emugpu::fit_kernel_params(gpu, cases, start, names, "x");
  const auto subset = emugpu::fit_kernel_params(gpu, spread, start, names, "x");
  // Exactly the subset's fit: the fit's time no longer grows with the file.
  EXPECT_EQ(all.memory_efficiency, subset.memory_efficiency);
  EXPECT_EQ(all.launch_ns, subset.launch_ns);
  EXPECT_NEAR(all.memory_efficiency, 0.55, 0.1);
}

TEST(CalibrationFit, LongFitsAndParsesPollTheInterruptCheck) {
  const auto gpu = h100();
  int polls = 0;
  emugpu::set_wait_interrupt_check([&polls] {
    if (++polls > 5) throw std::runtime_error("interrupted");
  });
  const auto cases = synthetic_cases(gpu, 200);
  EXPECT_THROW(emugpu::fit_kernel_params(gpu, cases, emugpu::default_kernel_params(gpu), {}, "x"), std::runtime_error);
  EXPECT_GT(polls, 5);
  // 30000 points of a parse poll too.
  std::string points = "[";
  for (int i = 0; i < 30'000; ++i) {
    points += std::string(i ? "," : "") +
              R"({"family": "elementwise", "op": "add", "shape": {"numel": 1024}, "dtype": "float32", )"
              R"("time_s": 1e-5, "flops": 1024, "bytes": 12288})";
  }
  polls = 0;
  EXPECT_THROW(emugpu::parse_calibration(document(gpu.name, points + "]"), "cal.json", gpu), std::runtime_error);
  EXPECT_GT(polls, 5);
  emugpu::set_wait_interrupt_check(nullptr);
  EXPECT_NO_THROW(emugpu::parse_calibration(document(gpu.name, points + "]"), "cal.json", gpu));
}

TEST(CalibrationFit, NonFiniteTimesAreRefusedNamingTheFile) {
  const auto gpu = h100();
  for (const char* bad : {"NaN", "Infinity", "1e400"}) {
    std::string text = document(gpu.name, kPoints);
    text.replace(text.find("0.0004"), 6, bad);
    const std::string msg = error_of(text, gpu);
    EXPECT_NE(msg.find("calibration cal.json"), std::string::npos) << bad << ": " << msg;
  }
}

}  // namespace
