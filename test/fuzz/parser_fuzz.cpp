// Fuzz target for the JSON parsers users feed by hand: the GPU catalog,
// profile files and calibration files (whose points the cost model then
// times). The only acceptable failure is emugpu::Error; anything
// else (another exception, a crash, a sanitizer report, a parsed value that
// breaks an invariant) is a finding.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "calibration.h"
#include "catalog.h"
#include "cost_model.h"
#include "error.h"
#include "profile_db.h"

namespace {

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "emugpu_parser_fuzz: %s\n", what);
  std::abort();
}

void check_point(const emugpu::ProfilePoint& p) {
  auto ok = [](double x) { return std::isfinite(x) && x >= 0; };
  if (!ok(p.forward_s) || !ok(p.backward_s)) finding("a profile lookup gave a non-finite or negative time");
  for (const auto& v : {p.transfer_pageable_s, p.transfer_pinned_s, p.peak_bytes, p.persistent_bytes}) {
    if (v && !ok(*v)) finding("a profile lookup gave a non-finite or negative optional value");
  }
}

void fuzz_catalog(std::string_view text) {
  emugpu::Catalog catalog;
  try {
    catalog = emugpu::Catalog::from_json_text(text, "fuzz-catalog.json");
  } catch (const emugpu::Error&) {
    return;
  }
  for (const auto& g : catalog.gpus()) {
    if (g.memory_bytes == 0 || g.sm_count < 1 || !(g.fp32_flops > 0) || !std::isfinite(g.fp32_flops) ||
        !(g.memory_bandwidth > 0) || !std::isfinite(g.pcie_bandwidth()) || g.major < 0 || g.minor < 0) {
      finding("the catalog accepted a GPU with an impossible spec");
    }
    try {
      // Its own name always matches, so an Error here is a finding too.
      (void)catalog.find(g.name);
    } catch (const emugpu::Error&) {
      finding("a parsed GPU is not found under its own name");
    }
  }
}

void fuzz_profile(std::string_view text) {
  emugpu::Profile profile;
  try {
    profile = emugpu::parse_profile(text, "fuzz-profile.json");
  } catch (const emugpu::Error&) {
    return;
  }
  for (const auto& table : profile.tables) {
    if (table.points.empty()) finding("a profile table without points was accepted");
    const int64_t last = table.points.back().batch_size;
    for (int64_t b :
         {int64_t{1}, table.points.front().batch_size, last / 2 + 1, last, last + 1, last * 3, int64_t{1} << 31}) {
      check_point(emugpu::interpolate(profile, table, b).point);
    }
  }
}

// The GPU calibration files in the corpus name.
const emugpu::GpuSpec& fuzz_gpu() {
  static const emugpu::GpuSpec gpu = [] {
    emugpu::GpuSpec g;
    g.name = "Fuzz GPU";
    g.sm_count = 108;
    g.major = 8;
    g.fp32_flops = 19.5e12;
    g.tf32_flops = 156e12;
    g.fp16_flops = g.bf16_flops = 312e12;
    g.memory_bandwidth = 1.555e12;
    return g;
  }();
  return gpu;
}

void fuzz_calibration(std::string_view text) {
  emugpu::Calibration cal;
  try {
    cal = emugpu::parse_calibration(text, "fuzz-calibration.json", fuzz_gpu());
  } catch (const emugpu::Error&) {
    return;
  }
  if (cal.cases.empty()) finding("a calibration without points was accepted");
  const emugpu::CostModel model(fuzz_gpu());
  for (const auto& c : cal.cases) {
    if (c.ops.empty() || !(c.seconds > 0) || !std::isfinite(c.seconds)) finding("an impossible calibration point");
    for (const auto& op : c.ops) {
      if (model.kernel(op) < 0) finding("the cost model gave a negative time for a calibration point");
    }
  }
  if (!std::isfinite(emugpu::mean_abs_log_error(fuzz_gpu(), cal.cases, model.kernel_params()))) {
    finding("a calibration's error is not finite");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz_catalog(text);
  fuzz_profile(text);
  fuzz_calibration(text);
  return 0;
}
