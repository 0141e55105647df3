#include "catalog.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "error.h"

namespace emugpu {

double GpuSpec::peak_flops(DType dtype) const {
  switch (dtype) {
    case DType::kTensorFloat32: return tf32_flops > 0 ? tf32_flops : fp32_flops;
    case DType::kFloat16: return fp16_flops > 0 ? fp16_flops : fp32_flops;
    case DType::kBFloat16: return bf16_flops > 0 ? bf16_flops : fp32_flops;
    case DType::kFloat64: return fp64_flops > 0 ? fp64_flops : fp32_flops / 32;
    case DType::kFloat32:
    case DType::kInteger: return fp32_flops;
  }
  return fp32_flops;
}

double GpuSpec::pcie_bandwidth() const {
  // Per-lane payload rate in bytes/s after encoding, by PCIe generation.
  static constexpr double kLane[] = {0, 0.25e9, 0.5e9, 0.985e9, 1.969e9, 3.938e9, 7.563e9};
  const int gen = std::clamp(pcie_generation, 1, 6);
  return kLane[gen] * std::max(pcie_width, 1) * 0.8;
}

std::string normalize_gpu_name(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
  }
  for (std::string_view prefix : {"nvidia", "tesla", "quadro", "geforce"}) {
    if (out.size() > prefix.size() && out.compare(0, prefix.size(), prefix) == 0) {
      out.erase(0, prefix.size());
    }
  }
  return out;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

namespace {

template <typename T>
T required(const nlohmann::json& entry, const char* field, const std::string& where) {
  EMUGPU_CHECK(entry.contains(field), kValue, where, ": expected field '", field,
               "', found none; add it to the GPU entry");
  try {
    return entry.at(field).get<T>();
  } catch (const nlohmann::json::exception&) {
    detail::throw_error(ErrorKind::kValue, where, ": field '", field,
                        "' has the wrong type (found ", entry.at(field).dump(), ")");
  }
}

}  // namespace

Catalog Catalog::from_json_text(std::string_view text, const std::string& origin) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    detail::throw_error(ErrorKind::kValue, origin, ": not valid JSON (", e.what(), ")");
  }
  EMUGPU_CHECK(doc.is_object() && doc.contains("gpus") && doc["gpus"].is_array(), kValue,
               origin, ": expected an object with a 'gpus' array");
  Catalog catalog;
  for (size_t i = 0; i < doc["gpus"].size(); ++i) {
    const auto& e = doc["gpus"][i];
    const std::string where = origin + ": gpus[" + std::to_string(i) + "]";
    GpuSpec g;
    g.name = required<std::string>(e, "name", where);
    g.aliases = e.value("aliases", std::vector<std::string>{});
    g.memory_bytes = static_cast<uint64_t>(required<double>(e, "memory_gib", where) * (1ull << 30));
    g.sm_count = required<int>(e, "sm_count", where);
    const auto cc = required<std::string>(e, "compute_capability", where);
    EMUGPU_CHECK(std::sscanf(cc.c_str(), "%d.%d", &g.major, &g.minor) == 2, kValue, where,
                 ": compute_capability: expected 'MAJOR.MINOR', found '", cc, "'");
    g.fp32_flops = required<double>(e, "fp32_tflops", where) * 1e12;
    g.tf32_flops = e.value("tf32_tflops", 0.0) * 1e12;
    g.fp16_flops = e.value("fp16_tflops", 0.0) * 1e12;
    g.bf16_flops = e.value("bf16_tflops", 0.0) * 1e12;
    g.fp64_flops = e.value("fp64_tflops", 0.0) * 1e12;
    g.memory_bandwidth = required<double>(e, "memory_bandwidth_gbps", where) * 1e9;
    g.pcie_generation = required<int>(e, "pcie_generation", where);
    g.pcie_width = required<int>(e, "pcie_width", where);
    g.nvlink_bandwidth = e.value("nvlink_gbps", 0.0) * 1e9;
    EMUGPU_CHECK(g.memory_bytes > 0 && g.sm_count > 0 && g.fp32_flops > 0 && g.memory_bandwidth > 0,
                 kValue, where, " (", g.name,
                 "): memory, SM count, FP32 rate and bandwidth must be positive");
    catalog.gpus_.push_back(std::move(g));
  }
  EMUGPU_CHECK(!catalog.gpus_.empty(), kValue, origin, ": expected at least one GPU, found none");
  return catalog;
}

Catalog Catalog::from_file(const std::string& path) {
  std::ifstream in(path);
  EMUGPU_CHECK(in.good(), kValue, "cannot open the GPU catalog '", path,
               "'; set EMUGPU_CATALOG to a readable gpus.json");
  std::stringstream text;
  text << in.rdbuf();
  return from_json_text(text.str(), path);
}

const GpuSpec& Catalog::find(std::string_view name) const {
  const std::string key = normalize_gpu_name(name);
  for (const auto& g : gpus_) {
    if (normalize_gpu_name(g.name) == key) return g;
    for (const auto& a : g.aliases) {
      if (normalize_gpu_name(a) == key) return g;
    }
  }
  const GpuSpec* best = nullptr;
  size_t best_distance = SIZE_MAX;
  std::string known;
  for (const auto& g : gpus_) {
    known += (known.empty() ? "" : ", ") + g.name;
    std::vector<std::string> names = g.aliases;
    names.push_back(g.name);
    for (const auto& n : names) {
      const size_t d = edit_distance(key, normalize_gpu_name(n));
      if (d < best_distance) best_distance = d, best = &g;
    }
  }
  detail::throw_error(ErrorKind::kValue, "unknown GPU '", name, "'; did you mean '",
                      best ? best->name : "", "'? Known GPUs: ", known);
}

}  // namespace emugpu
