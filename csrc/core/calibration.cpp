#include "calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "clock.h"
#include "error.h"

namespace emugpu {
namespace {

using nlohmann::json;

constexpr std::string_view kSchema = "torch-emugpu calibration v1";
constexpr size_t kMaxPoints = 100'000;

[[noreturn]] void bad(const std::string& path, const std::string& field, const std::string& what) {
  detail::throw_error(ErrorKind::kValue, "calibration ", path, ": field '", field, "': ", what,
                      "; measure it again with `torch-emugpu calibrate` or remove the file");
}

const json& need(const json& obj, const char* key, const std::string& path, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) bad(path, where + key, "missing");
  return obj.at(key);
}

std::string need_string(const json& obj, const char* key, const std::string& path, const std::string& where) {
  const json& v = need(obj, key, path, where);
  if (!v.is_string()) bad(path, where + key, "expected a string, got " + describe_json(v));
  return v.get<std::string>();
}

// A finite number in [lo, hi].
double need_number(const json& obj, const char* key, double lo, double hi, const std::string& path,
                   const std::string& where) {
  const json& v = need(obj, key, path, where);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < lo || v.get<double>() > hi) {
    std::ostringstream range;
    range << "expected a number >= " << lo << " and <= " << hi << ", got " << describe_json(v);
    bad(path, where + key, range.str());
  }
  return v.get<double>();
}

bool flag(const json& m, const char* key) {
  const auto flags = m.find("flags");
  if (flags == m.end() || !flags->is_object()) return false;
  const auto it = flags->find(key);
  return it != flags->end() && it->is_boolean() && it->get<bool>();
}

DType dtype_of(const std::string& name, bool tf32, const std::string& path, const std::string& where) {
  if (name == "float32") return tf32 ? DType::kTensorFloat32 : DType::kFloat32;
  if (name == "bfloat16") return DType::kBFloat16;
  if (name == "float16") return DType::kFloat16;
  if (name == "float64") return DType::kFloat64;
  bad(path, where + "dtype", "expected float32, bfloat16, float16 or float64, got '" + name + "'");
}

constexpr double kMaxSize = 1e12;  // any one dimension or count in a sweep

double dim(const json& shape, const char* key, const std::string& path, const std::string& where) {
  return need_number(shape, key, 0, kMaxSize, path, where + "shape.");
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

double itemsize(DType d) {
  switch (d) {
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat64: return 8;
    default: return 4;
  }
}

// Every family `torch-emugpu calibrate` writes (torch_emugpu/calibrate.py's
// GENERATORS); a file may hold others from a newer version.
constexpr std::string_view kFamilies[] = {"launch",    "elementwise", "reduction", "copy",      "gemm",
                                          "bmm",       "conv",        "norm",      "softmax",   "cross_entropy",
                                          "attention", "rnn",         "embedding", "optimizer", "transfer"};

// The OpCosts the emulator would charge for one measured point, as the
// glue's estimate() builds them (backend/ops/estimate.cpp), or none for a
// point the cost model has no form for. A point of a family, or an op of a
// known family, that this version does not know sets `unknown` to its name
// ("family" or "family/op") and is none too: its other fields may follow
// rules this version does not know either, so they are not checked.
std::vector<OpCost> point_ops(const json& m, const std::string& path, const std::string& where, std::string& unknown) {
  const std::string family = need_string(m, "family", path, where);
  const std::string op = need_string(m, "op", path, where);
  if (std::find(std::begin(kFamilies), std::end(kFamilies), family) == std::end(kFamilies)) {
    unknown = family;
    return {};
  }
  auto unknown_op = [&]() -> std::vector<OpCost> {
    unknown = family + "/" + op;
    return {};
  };
  const json& shape = need(m, "shape", path, where);
  if (!shape.is_object()) bad(path, where + "shape", "expected an object, got " + describe_json(shape));
  const bool tf32 = flag(m, "tf32") || flag(m, "cudnn_tf32");
  OpCost c;
  c.dtype = dtype_of(need_string(m, "dtype", path, where), tf32, path, where);
  c.flops = need_number(m, "flops", 0, 1e18, path, where);
  c.bytes = need_number(m, "bytes", 0, 1e15, path, where);
  const json& kernels = m.contains("kernels") ? m.at("kernels") : json();
  if (!kernels.is_null()) c.kernels = static_cast<int>(need_number(m, "kernels", 0, 1e6, path, where));
  c.kernels = std::max(c.kernels, 1);
  auto d = [&](const char* key) { return dim(shape, key, path, where); };
  if (family == "launch" || family == "elementwise") {
    c.family = OpFamily::kElementwise;
    // A per-channel scale broadcast over NCHW planes: PyTorch's
    // non-vectorised kernel, as estimate() marks it.
    if (op == "mul_broadcast") {
      c.strided = true;
      c.elements = d("N") * d("C") * d("H") * d("W");
    }
  } else if (family == "reduction") {
    c.family = OpFamily::kReduction;
  } else if (family == "softmax" || family == "cross_entropy") {
    // As estimate() charges them: long rows read once per pass, and cross
    // entropy as PyTorch runs it (log-softmax, nll_loss's gather, its
    // backward's zero-fill and scatter, log-softmax's backward, and the
    // loss gradient's seed).
    c.family = OpFamily::kReduction;
    const double es = itemsize(c.dtype), tokens = d("tokens"), n = tokens * d("classes");
    const double row = d("classes") * es;
    if (family == "softmax") {
      if (op != "forward" && op != "backward") return unknown_op();
      const bool backward = op == "backward";
      c.bytes += (softmax_row_reads(row, backward) - 1) * (backward ? 2 : 1) * n * es;
      return {c};
    }
    if (op != "forward_backward") return unknown_op();
    OpCost forward = c, nll = c, nll_backward = c, backward = c, seed = c;
    for (OpCost* o : {&forward, &nll, &nll_backward, &backward, &seed}) o->kernels = 1;
    forward.flops = backward.flops = n;
    nll.flops = nll_backward.flops = tokens;
    seed.flops = 1;
    forward.bytes = (1 + softmax_row_reads(row, false)) * n * es;
    nll.bytes = tokens * (8 + es) + 2 * es;
    nll_backward.bytes = n * es + tokens * 8 + 2 * es;
    backward.bytes = (2 + softmax_row_reads(row, true)) * n * es;
    seed.family = OpFamily::kElementwise;
    seed.bytes = es;
    return {forward, nll, nll_backward, backward, seed};
  } else if (family == "copy") {
    c.family = OpFamily::kCopy;
  } else if (family == "embedding") {
    c.family = OpFamily::kGather;
  } else if (family == "optimizer") {
    c.family = OpFamily::kOptimizer;
  } else if (family == "norm") {
    // An eval-mode batch norm, as estimate() charges it: one normalising
    // pass over planes of H*W elements (the eval rule's parameters).
    if (op == "batch_norm_eval") {
      c.family = OpFamily::kBatchNorm;
      c.running_stats = true;
      c.channels = d("C");
      c.plane = d("H") * d("W");
      return {c};
    }
    c.family = op.starts_with("batch_norm") ? OpFamily::kBatchNorm : OpFamily::kNorm;
    // estimate() charges batch norm's second read of its input (statistics, then normalisation).
    // and charges 16-bit batch norms as 32-bit ones (their kernels run at a rate of elements).
    if (c.family == OpFamily::kBatchNorm) {
      c.channels = d("C");
      c.backward = op.find("backward") != std::string::npos;
      c.bytes += d("N") * d("C") * d("H") * d("W") * itemsize(c.dtype);
      c.bytes *= 4 / itemsize(c.dtype);
    } else if (op == "layer_norm_backward") {
      // Its weight and bias gradients' kernel reads dy and x once more.
      c.bytes += 2 * d("tokens") * d("width") * itemsize(c.dtype);
    }
  } else if (family == "gemm" || family == "bmm") {
    c.family = family == "gemm" ? OpFamily::kMm : OpFamily::kBmm;
    c.gemm_count = 1;
    c.gemms[0] = {family == "bmm" ? d("batch") : 1.0, d("M"), d("N"), d("K"), false};
  } else if (family == "conv") {
    const bool forward = op == "forward";
    const bool input_grad = op == "backward_input";
    if (!forward && !input_grad && op != "backward_weight") return unknown_op();
    c.family = forward ? OpFamily::kConv : OpFamily::kConvBackward;
    c.conv = {d("N"),     d("C"), d("H"), d("W"), d("K"), d("R"), d("S"), d("P"), d("Q"), std::max(d("groups"), 1.0),
              d("stride")};
    // As estimate() reads the input's memory format: NCHW tensor-core
    // convolutions pay for layout transforms, NHWC ones do not.
    c.conv.channels_last = flag(m, "channels_last");
    c.gemm_count = conv_gemms(c.conv, forward, input_grad, !forward && !input_grad, c.gemms.data());
    // One kernel per pass, as estimate() counts them: the cost model adds
    // the layout transforms' kernels (which the file's count includes) itself.
    c.kernels = c.gemm_count;
  } else if (family == "attention") {
    const bool causal = flag(m, "causal");
    const double b_h = d("B") * d("H") * (causal ? 0.5 : 1.0), l = d("L"), e = d("E");
    OpCost fwd = c;
    fwd.family = OpFamily::kAttention;
    fwd.kernels = 1;
    fwd.gemm_count = 1;
    fwd.gemms[0] = {b_h, l, l, 2 * e, false};
    if (op == "forward") return {fwd};
    if (op != "forward_backward") return unknown_op();
    OpCost bwd = fwd;
    bwd.family = OpFamily::kAttentionBackward;
    bwd.kernels = std::max(c.kernels - 1, 1);
    bwd.gemms[0].k = 2 * e * 2.5;
    fwd.flops = c.flops / 3.5;  // the file counts forward + 2.5x forward
    bwd.flops = c.flops - fwd.flops;
    fwd.bytes = bwd.bytes = c.bytes / 2;
    return {fwd, bwd};
  } else if (family == "transfer") {
    return {};  // host<->device copies: measured transfer rates, not kernels
  } else if (family == "rnn") {
    // nn.LSTM / nn.GRU (batch_first) as cuDNN runs them: "<mode>_<op>" with
    // op forward (training), inference, or forward_backward (both calls).
    const auto split = op.find('_');
    if (split == std::string::npos) return unknown_op();
    const std::string mode = op.substr(0, split), pass = op.substr(split + 1);
    if ((mode != "lstm" && mode != "gru") || (pass != "forward" && pass != "inference" && pass != "forward_backward")) {
      return unknown_op();
    }
    c.family = OpFamily::kRnn;
    c.rnn.mode = mode == "lstm" ? RnnMode::kLstm : RnnMode::kGru;
    c.rnn.seq_len = d("seq");
    c.rnn.batch = d("batch");
    c.rnn.tokens = c.rnn.seq_len * c.rnn.batch;
    c.rnn.input_size = d("input");
    c.rnn.hidden_size = d("hidden");
    c.rnn.layers = std::max(d("layers"), 1.0);
    c.rnn.batch_first = true;
    c.rnn.train = pass != "inference";
    if (pass != "forward_backward") return {c};
    OpCost backward = c;
    backward.family = OpFamily::kRnnBackward;
    c.flops = rnn_flops(c.rnn, false);
    backward.flops = rnn_flops(backward.rnn, true);
    c.bytes = backward.bytes = c.bytes / 2;
    return {c, backward};
  } else {
    unknown = family;  // in kFamilies but not here: nothing to fit it to either
    return {};
  }
  return {c};
}

}  // namespace

Calibration parse_calibration(std::string_view text, const std::string& path, const GpuSpec& gpu) {
  const json doc = parse_json_document(text, "calibration " + path);
  if (!doc.is_object()) bad(path, "", "expected a JSON object at the top level");
  const std::string schema = need_string(doc, "schema", path, "");
  if (schema != kSchema) bad(path, "schema", "expected '" + std::string(kSchema) + "', got '" + schema + "'");
  Calibration cal;
  cal.path = path;
  cal.gpu = need_string(doc, "gpu", path, "");
  if (normalize_gpu_name(cal.gpu) != normalize_gpu_name(gpu.name)) {
    bad(path, "gpu", "measured on '" + cal.gpu + "', but the emulated GPU is '" + gpu.name + "'");
  }
  const json& points = need(doc, "measurements", path, "");
  if (!points.is_array()) bad(path, "measurements", "expected an array, got " + describe_json(points));
  if (points.size() > kMaxPoints) bad(path, "measurements", "more than 100000 points");
  std::vector<std::string> groups;  // per case: its op, dtype and flags
  std::set<std::string> unknown;
  for (size_t i = 0; i < points.size(); ++i) {
    if (i % 4096 == 4095) check_wait_interrupt();  // 100000 points take a while
    const std::string where = "measurements[" + std::to_string(i) + "].";
    const json& m = points[i];
    if (!m.is_object()) bad(path, where, "expected an object, got " + describe_json(m));
    const double seconds = need_number(m, "time_s", 1e-9, 3600, path, where);
    std::string unknown_name;
    std::vector<OpCost> ops = point_ops(m, path, where, unknown_name);
    if (!unknown_name.empty()) {
      unknown.insert(unknown_name);
      ++cal.unknown_points;
    }
    if (ops.empty()) {
      ++cal.skipped;
      continue;
    }
    cal.cases.push_back({std::move(ops), seconds, false});
    groups.push_back(need_string(m, "family", path, where) + "/" + need_string(m, "op", path, where) + "/" +
                     need_string(m, "dtype", path, where) + "/" +
                     (m.contains("flags") ? m.at("flags").dump() : std::string()));
  }
  // A point within 1.5x of the fastest of its op's sizes sits at the floor
  // that launches back to back (or Python) set, not at what its size costs
  // the device.
  std::map<std::string, double> floor;
  for (size_t i = 0; i < groups.size(); ++i) {
    auto [it, fresh] = floor.emplace(groups[i], cal.cases[i].seconds);
    if (!fresh) it->second = std::min(it->second, cal.cases[i].seconds);
  }
  for (size_t i = 0; i < groups.size(); ++i) cal.cases[i].upper_bound = cal.cases[i].seconds < 1.5 * floor[groups[i]];
  cal.unknown.assign(unknown.begin(), unknown.end());
  EMUGPU_CHECK(!cal.cases.empty(), kValue, "calibration ", path,
               ": field 'measurements': no point the cost model can be fitted to",
               cal.unknown.empty() ? "" : " (this version does not know ", join(cal.unknown),
               cal.unknown.empty() ? "" : ")", "; measure one with `torch-emugpu calibrate`");
  return cal;
}

std::string calibration_warning(const Calibration& cal) {
  if (cal.unknown.empty()) return "";
  std::ostringstream out;
  out << "calibration " << cal.path << ": " << cal.unknown_points << " point" << (cal.unknown_points == 1 ? "" : "s")
      << " of families or ops this version does not know (" << join(cal.unknown) << ") ignored; the fit uses the other "
      << cal.cases.size() << " (a newer torch-emugpu wrote them, and can use them)";
  return out.str();
}

Calibration load_calibration(const std::string& path, const GpuSpec& gpu) {
  std::ifstream in(path);
  EMUGPU_CHECK(in.good(), kValue, "cannot read calibration ", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_calibration(text.str(), path, gpu);
}

std::optional<std::string> find_calibration(const std::vector<std::string>& directories, const GpuSpec& gpu) {
  namespace fs = std::filesystem;
  const std::string want = normalize_gpu_name(gpu.name);
  for (const std::string& dir : directories) {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_directory(ec) || normalize_gpu_name(it->path().filename().string()) != want) continue;
      const fs::path file = it->path() / "calibration.json";
      if (fs::is_regular_file(file, ec)) return file.string();
    }
  }
  return std::nullopt;
}

double mean_abs_log_error(const GpuSpec& gpu, const std::vector<MeasuredCase>& cases, const KernelParams& params) {
  const CostModel model(gpu, {}, params);
  double sum = 0;
  for (const MeasuredCase& c : cases) {
    double ns = 0;
    for (const OpCost& op : c.ops) ns += static_cast<double>(model.kernel(op));
    const double log_ratio = std::log(std::max(ns, 1.0) * 1e-9 / c.seconds);
    sum += c.upper_bound ? std::max(log_ratio, 0.0) : std::abs(log_ratio);
  }
  return cases.empty() ? 0 : sum / static_cast<double>(cases.size());
}

namespace {

// `count` of `cases`, evenly spread over them in their order (the file's:
// grouped by family, op and dtype, each group from small to large sizes).
std::vector<MeasuredCase> evenly_spread(const std::vector<MeasuredCase>& cases, size_t count) {
  std::vector<MeasuredCase> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i) out.push_back(cases[i * cases.size() / count]);
  return out;
}

}  // namespace

KernelParams fit_kernel_params(const GpuSpec& gpu, const std::vector<MeasuredCase>& all_cases, KernelParams start,
                               const std::vector<std::string>& names, const std::string& source) {
  // The fit's time is cases x parameters x steps: a 90000-point file took a
  // minute. Beyond kMaxFitCases it fits to that many, evenly spread; files
  // up to that size (the full sweep has 899 points) fit exactly as before.
  const std::vector<MeasuredCase> spread =
      all_cases.size() > kMaxFitCases ? evenly_spread(all_cases, kMaxFitCases) : std::vector<MeasuredCase>{};
  const std::vector<MeasuredCase>& cases = spread.empty() ? all_cases : spread;
  std::vector<const KernelParamField*> fields;
  for (const KernelParamField& f : kernel_param_fields()) {
    if (names.empty() || std::find(names.begin(), names.end(), f.name) != names.end()) fields.push_back(&f);
  }
  if (!names.empty() && fields.size() != names.size()) {
    std::string known;
    for (const KernelParamField& f : kernel_param_fields()) known += std::string(known.empty() ? "" : ", ") + f.name;
    EMUGPU_CHECK(false, kValue, "unknown kernel parameter among those to fit; known: ", known);
  }
  KernelParams best = start;
  double best_loss = mean_abs_log_error(gpu, cases, best);
  constexpr int kRounds = 3;
  constexpr int kSteps = 24;
  const double golden = (std::sqrt(5.0) - 1) / 2;
  for (int round = 0; round < kRounds; ++round) {
    for (const KernelParamField* f : fields) {
      // In log space for ranges over decades (launch_ns), linear otherwise.
      const bool log_scale = f->lo > 0 && f->hi / f->lo > 50;
      auto to_value = [&](double x) { return log_scale ? std::exp(x) : x; };
      double a = log_scale ? std::log(f->lo) : f->lo;
      double b = log_scale ? std::log(f->hi) : f->hi;
      // Each step's interior points are mostly the last step's, bit for
      // bit: remembered, they are not computed again (the same losses, so
      // the same result, in about half the time).
      std::array<std::pair<double, double>, 4> seen{};
      size_t seen_count = 0;
      auto loss_at = [&](double x) {
        for (size_t k = 0; k < std::min(seen_count, seen.size()); ++k) {
          if (seen[k].first == x) return seen[k].second;
        }
        KernelParams p = best;
        p.*(f->member) = std::clamp(to_value(x), f->lo, f->hi);
        const double loss = mean_abs_log_error(gpu, cases, p);
        seen[seen_count++ % seen.size()] = {x, loss};
        return loss;
      };
      for (int i = 0; i < kSteps; ++i) {
        check_wait_interrupt();  // Ctrl-C: each step costs two passes over the cases
        const double c = b - golden * (b - a), d = a + golden * (b - a);
        if (loss_at(c) < loss_at(d)) {
          b = d;
        } else {
          a = c;
        }
      }
      KernelParams trial = best;
      trial.*(f->member) = std::clamp(to_value((a + b) / 2), f->lo, f->hi);
      const double loss = mean_abs_log_error(gpu, cases, trial);
      if (loss < best_loss) best = trial, best_loss = loss;
    }
  }
  best.source = source;
  return best;
}

}  // namespace emugpu
