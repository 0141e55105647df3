#include "catalog.h"

#include <algorithm>
#include <cctype>
#include <cmath>
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

using nlohmann::json;

constexpr size_t kDescribeLimit = 80;

// Cuts at most `limit` bytes without splitting a UTF-8 sequence: messages
// reach Python, which refuses invalid UTF-8.
std::string truncated(std::string text, size_t limit) {
  if (text.size() <= limit) return text;
  size_t n = limit - 3;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  text.resize(n);
  return text + "...";
}

std::string scalar_text(const json& v) {
  if (v.is_number_float() && !std::isfinite(v.get<double>())) {
    const double d = v.get<double>();
    return std::isnan(d) ? "nan" : d > 0 ? "infinity" : "-infinity";
  }
  if (v.is_string() && v.get_ref<const std::string&>().size() > kDescribeLimit) {
    return truncated(json(v.get_ref<const std::string&>().substr(0, kDescribeLimit))
                         .dump(-1, ' ', false, json::error_handler_t::replace),
                     kDescribeLimit);
  }
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Prints bounds as people write them: 16384, not 16384.0 or 1.6384e+04.
std::string plain(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  std::ostringstream out;
  out << x;
  return out.str();
}

template <typename Int>
Int integer_field(const json& v, int64_t lo, int64_t hi, const std::string& where, const char* field) {
  const auto n = json_integer_in(v, lo, hi);
  if (!n) {
    detail::throw_error(ErrorKind::kValue, where, ": field '", field, "': expected an integer from ", lo, " to ", hi,
                        ", found ", describe_json(v), "; correct the GPU entry");
  }
  return static_cast<Int>(*n);
}

const json& required_field(const json& entry, const char* field, const std::string& where) {
  EMUGPU_CHECK(entry.contains(field), kValue, where, ": expected field '", field,
               "', found none; add it to the GPU entry");
  return entry.at(field);
}

// A finite number in [lo, hi]; optional fields may also be 0, absent or
// null, which all read as 0 ("not published").
double number_field(const json& entry, const char* field, const std::string& where, bool required, double lo, double hi,
                    const char* unit) {
  if (!required && (!entry.contains(field) || entry.at(field).is_null())) return 0;
  const json& v = required ? required_field(entry, field, where) : entry.at(field);
  const bool ok = v.is_number() && std::isfinite(v.get<double>()) &&
                  ((v.get<double>() >= lo && v.get<double>() <= hi) || (!required && v.get<double>() == 0));
  if (!ok) {
    detail::throw_error(ErrorKind::kValue, where, ": field '", field, "': expected a number >= ", plain(lo),
                        " and <= ", plain(hi), required ? "" : " (or 0: not published)", " (", unit, "), found ",
                        describe_json(v), "; correct the GPU entry (the range holds every GPU made so far, with room)");
  }
  return v.get<double>();
}

std::string string_field(const json& entry, const char* field, const std::string& where) {
  const json& v = required_field(entry, field, where);
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
    detail::throw_error(ErrorKind::kValue, where, ": field '", field, "': expected a non-empty string, found ",
                        describe_json(v), "; correct the GPU entry");
  }
  return v.get<std::string>();
}

// "MAJOR.MINOR", each 0..99; stricter than sscanf, whose %d overflows on long
// digit runs and which ignores trailing junk.
bool parse_compute_capability(const std::string& text, int& major, int& minor) {
  const size_t dot = text.find('.');
  if (dot == std::string::npos) return false;
  auto part = [](std::string_view digits, int& out) {
    if (digits.empty() || digits.size() > 2) return false;
    out = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return false;
      out = out * 10 + (c - '0');
    }
    return true;
  };
  const std::string_view all(text);
  return part(all.substr(0, dot), major) && part(all.substr(dot + 1), minor);
}

// Calls `visit(i)` for each index of `text` outside JSON strings, until it
// returns false.
template <typename Visit>
void scan_outside_strings(std::string_view text, Visit&& visit) {
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (!visit(i)) {
      return;
    }
  }
}

// The line of the first bare NaN, Infinity or -Infinity token outside a
// string (Python's json module writes them for non-finite floats; they are
// not JSON), or 0 when there is none. (A raw newline inside a string is not
// JSON either, so counting newlines outside strings counts lines.)
size_t bare_non_finite_line(std::string_view text) {
  size_t line = 1, found = 0;
  scan_outside_strings(text, [&](size_t i) {
    if (text[i] == '\n') ++line;
    if (text.substr(i, 3) == "NaN" || text.substr(i, 8) == "Infinity") found = line;
    return found == 0;
  });
  return found;
}

}  // namespace

std::string describe_json(const json& value) {
  if (!value.is_array() && !value.is_object()) return truncated(scalar_text(value), kDescribeLimit);
  // One level only, built in a loop: the value may be nested arbitrarily deep.
  const bool array = value.is_array();
  std::string out = array ? "[" : "{";
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (out.size() > kDescribeLimit) break;
    if (it != value.begin()) out += ", ";
    if (!array) out += scalar_text(json(it.key())) + ": ";
    const json& e = it.value();
    if (e.is_array())
      out += e.empty() ? "[]" : "[...]";
    else if (e.is_object())
      out += e.empty() ? "{}" : "{...}";
    else
      out += scalar_text(e);
  }
  out += array ? "]" : "}";
  if (out.size() <= kDescribeLimit) return out;
  return truncated(out, kDescribeLimit) + " (" + (array ? "an array of " : "an object with ") +
         std::to_string(value.size()) + (array ? " elements)" : " keys)");
}

std::optional<int64_t> json_integer_in(const json& value, int64_t lo, int64_t hi) {
  int64_t n = 0;
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    if (hi < 0 || u > static_cast<uint64_t>(hi)) return std::nullopt;
    n = static_cast<int64_t>(u);
  } else if (value.is_number_integer()) {
    n = value.get<int64_t>();
  } else if (value.is_number_float()) {
    // Range before the cast: casting an out-of-range double is undefined.
    const double d = value.get<double>();
    constexpr double kExact = 9007199254740992.0;  // 2^53
    if (!std::isfinite(d) || d != std::floor(d) || d < -kExact || d > kExact) return std::nullopt;
    n = static_cast<int64_t>(d);
  } else {
    return std::nullopt;
  }
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

json parse_json_document(std::string_view text, const std::string& origin) {
  // Refused before parsing, so the nested value never exists: building (and
  // destroying) a 100000-deep value would exhaust the stack. A scan of the
  // brackets outside strings, not a parser callback: nlohmann's callback
  // parser took 10x as long (17 s for a 35 MB calibration file). Up to the
  // first syntax error the scan reads the text as the parser does, so no
  // document the parser would build deeper passes it.
  size_t depth = 0;
  scan_outside_strings(text, [&](size_t i) {
    const char c = text[i];
    if (c == '[' || c == '{') {
      if (++depth > static_cast<size_t>(kMaxJsonDepth)) {
        detail::throw_error(ErrorKind::kValue, origin, ": JSON nested deeper than ", kMaxJsonDepth,
                            " levels; expected a flat document (catalogs and profiles need 5 at most), so "
                            "the file is corrupt or not a torch-emugpu file");
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
    return true;
  });
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    if (const size_t line = bare_non_finite_line(text); line > 0) {
      detail::throw_error(ErrorKind::kValue, origin, ": not valid JSON: line ", line,
                          " holds a bare NaN or Infinity, which JSON has no token for (an older `import gpemu` and "
                          "Python's json module write them for failed measurements); replace it with a finite "
                          "number, or null where the field is optional, or remove the file");
    }
    // Also number overflow (1e400), which nlohmann reports as out_of_range.
    // Its message quotes the bytes it stopped at: throw_error makes them valid UTF-8.
    detail::throw_error(ErrorKind::kValue, origin, ": not valid JSON (", truncated(e.what(), 240),
                        "); fix the file or remove it");
  }
}

namespace {

// The "mig" object of a GPU entry: {"compute_slices", "memory_slices", "profiles": [...]}.
void parse_mig(const json& m, const std::string& where, GpuSpec& g) {
  EMUGPU_CHECK(m.is_object(), kValue, where,
               ": expected an object with compute_slices, memory_slices and profiles, found ", describe_json(m),
               "; correct the GPU entry");
  g.mig_compute_slices = integer_field<int>(required_field(m, "compute_slices", where), 1, 16, where, "compute_slices");
  g.mig_memory_slices = integer_field<int>(required_field(m, "memory_slices", where), 1, 16, where, "memory_slices");
  const json& profiles = required_field(m, "profiles", where);
  EMUGPU_CHECK(profiles.is_array() && !profiles.empty(), kValue, where,
               ": field 'profiles': expected a non-empty array of MIG profiles, found ", describe_json(profiles),
               "; correct the GPU entry");
  for (size_t k = 0; k < profiles.size(); ++k) {
    const json& p = profiles[k];
    const std::string at = where + ".profiles[" + std::to_string(k) + "]";
    EMUGPU_CHECK(p.is_object(), kValue, at, ": expected an object describing one MIG profile, found ", describe_json(p),
                 "; correct the GPU entry");
    MigProfile profile;
    profile.name = string_field(p, "name", at);
    profile.compute_slices =
        integer_field<int>(required_field(p, "compute_slices", at), 1, g.mig_compute_slices, at, "compute_slices");
    profile.memory_slices =
        integer_field<int>(required_field(p, "memory_slices", at), 1, g.mig_memory_slices, at, "memory_slices");
    profile.sm_count = integer_field<int>(required_field(p, "sm_count", at), 1, g.sm_count, at, "sm_count");
    // At most the GPU's memory (its own figure may be rounded from the same bytes).
    const double gib = static_cast<double>(g.memory_bytes) / static_cast<double>(1ull << 30) + 1e-6;
    profile.memory_bytes = static_cast<uint64_t>(number_field(p, "memory_gib", at, true, kMinMemoryGib, gib, "GiB") *
                                                 static_cast<double>(1ull << 30));
    const json& placements = required_field(p, "placements", at);
    EMUGPU_CHECK(placements.is_array() && !placements.empty(), kValue, at,
                 ": field 'placements': expected a non-empty array of first memory slices, found ",
                 describe_json(placements), "; correct the GPU entry");
    for (const json& start : placements) {
      profile.placements.push_back(integer_field<int>(start, 0, g.mig_memory_slices - profile.memory_slices, at,
                                                      "placements (first memory slice of an instance)"));
    }
    for (const MigProfile& other : g.mig_profiles) {
      EMUGPU_CHECK(normalize_gpu_name(other.name) != normalize_gpu_name(profile.name), kValue, at, ": MIG profile '",
                   profile.name, "' is listed twice; keep one");
    }
    g.mig_profiles.push_back(std::move(profile));
  }
}

}  // namespace

Catalog Catalog::from_json_text(std::string_view text, const std::string& origin) {
  const json doc = parse_json_document(text, origin);
  EMUGPU_CHECK(doc.is_object() && doc.contains("gpus") && doc.at("gpus").is_array(), kValue, origin,
               ": expected an object with a 'gpus' array");
  const json& gpus = doc.at("gpus");
  Catalog catalog;
  for (size_t i = 0; i < gpus.size(); ++i) {
    const json& e = gpus[i];
    std::string where = origin + ": gpus[" + std::to_string(i) + "]";
    EMUGPU_CHECK(e.is_object(), kValue, where, ": expected an object describing one GPU, found ", describe_json(e));
    GpuSpec g;
    g.name = string_field(e, "name", where);
    where += " (" + describe_json(e.at("name")) + ")";
    if (e.contains("aliases") && !e.at("aliases").is_null()) {
      const json& aliases = e.at("aliases");
      EMUGPU_CHECK(aliases.is_array(), kValue, where, ": field 'aliases': expected an array of names, found ",
                   describe_json(aliases), "; correct the GPU entry");
      for (size_t k = 0; k < aliases.size(); ++k) {
        EMUGPU_CHECK(aliases[k].is_string(), kValue, where, ": field 'aliases[", k, "]': expected a string, found ",
                     describe_json(aliases[k]), "; correct the GPU entry");
        g.aliases.push_back(aliases[k].get<std::string>());
      }
    }
    // Physical bounds, generous on both sides: every GPU made so far and any
    // of the next years fits them (the catalog's own span: 11-140 GiB, 13-132
    // SMs, 0.2-989 TFLOP/s, 240-4800 GB/s). They catch unit mix-ups (MiB for
    // GiB, B/s for GB/s) and rates so small that every op would take a day,
    // and keep the casts to integers in range.
    g.memory_bytes = static_cast<uint64_t>(
        number_field(e, "memory_gib", where, true, kMinMemoryGib, kMaxMemoryGib, "GiB; 1/8 GiB is 128 MiB") *
        static_cast<double>(1ull << 30));
    g.sm_count = integer_field<int>(required_field(e, "sm_count", where), 1, kMaxSmCount, where, "sm_count");
    const json& cc = required_field(e, "compute_capability", where);
    EMUGPU_CHECK(cc.is_string() && parse_compute_capability(cc.get<std::string>(), g.major, g.minor), kValue, where,
                 ": field 'compute_capability': expected 'MAJOR.MINOR' with each part an integer "
                 "0..99, found ",
                 describe_json(cc), "; correct the GPU entry");
    const char* tflops = "TFLOP/s; 1e6 is 1e18 FLOP/s";
    g.fp32_flops = number_field(e, "fp32_tflops", where, true, kMinTflops, kMaxTflops, tflops) * 1e12;
    g.tf32_flops = number_field(e, "tf32_tflops", where, false, kMinTflops, kMaxTflops, tflops) * 1e12;
    g.fp16_flops = number_field(e, "fp16_tflops", where, false, kMinTflops, kMaxTflops, tflops) * 1e12;
    g.bf16_flops = number_field(e, "bf16_tflops", where, false, kMinTflops, kMaxTflops, tflops) * 1e12;
    g.fp64_flops = number_field(e, "fp64_tflops", where, false, kMinTflops, kMaxTflops, tflops) * 1e12;
    const char* gbps = "GB/s; 100000 is 100 TB/s";
    g.memory_bandwidth =
        number_field(e, "memory_bandwidth_gbps", where, true, kMinBandwidthGBps, kMaxBandwidthGBps, gbps) * 1e9;
    g.pcie_generation = integer_field<int>(required_field(e, "pcie_generation", where), 1, 6, where, "pcie_generation");
    g.pcie_width = integer_field<int>(required_field(e, "pcie_width", where), 1, 32, where, "pcie_width");
    g.nvlink_bandwidth = number_field(e, "nvlink_gbps", where, false, kMinBandwidthGBps, kMaxBandwidthGBps, gbps) * 1e9;
    EMUGPU_CHECK(g.memory_bytes > 0, kValue, where, ": field 'memory_gib': expected at least one byte, found ",
                 describe_json(e.at("memory_gib")), "; correct the GPU entry");
    if (e.contains("mig") && !e.at("mig").is_null()) parse_mig(e.at("mig"), where + ": field 'mig'", g);
    catalog.gpus_.push_back(std::move(g));
  }
  EMUGPU_CHECK(!catalog.gpus_.empty(), kValue, origin, ": expected at least one GPU, found none");
  return catalog;
}

Catalog Catalog::from_file(const std::string& path) {
  std::ifstream in(path);
  EMUGPU_CHECK(in.good(), kValue, "cannot open the GPU catalog '", echo_input(path),
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
  // No GPU name is this long: a longer one gets no suggestion, and no
  // edit distance that would cost its length times every name's.
  constexpr size_t kMaxSuggestFrom = 256;
  for (const auto& g : gpus_) {
    known += (known.empty() ? "" : ", ") + g.name;
    if (key.size() > kMaxSuggestFrom) continue;
    std::vector<std::string> names = g.aliases;
    names.push_back(g.name);
    for (const auto& n : names) {
      const size_t d = edit_distance(key, normalize_gpu_name(n));
      if (d < best_distance) best_distance = d, best = &g;
    }
  }
  if (best == nullptr) {
    detail::throw_error(ErrorKind::kValue, "unknown GPU '", echo_input(name),
                        "'; expected one of the catalog's names. Known GPUs: ", known);
  }
  detail::throw_error(ErrorKind::kValue, "unknown GPU '", echo_input(name), "'; did you mean '", best->name,
                      "'? Known GPUs: ", known);
}

}  // namespace emugpu
