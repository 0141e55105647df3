#include "profile_db.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "error.h"

namespace emugpu {

namespace {

using nlohmann::json;

[[noreturn]] void bad_in(const char* kind, const std::string& path, const std::string& field, const std::string& what) {
  detail::throw_error(ErrorKind::kValue, kind, " ", path, ": field '", field, "': ", what);
}

[[noreturn]] void bad(const std::string& path, const std::string& field, const std::string& what) {
  bad_in("profile", path, field, what);
}

const json& need(const json& obj, const char* key, const std::string& path, const std::string& where) {
  if (!obj.is_object() || !obj.contains(key)) bad(path, where + key, "missing");
  return obj.at(key);
}

std::string need_string(const json& obj, const char* key, const std::string& path, const std::string& where) {
  const json& v = need(obj, key, path, where);
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
    bad(path, where + key, "expected a non-empty string, got " + describe_json(v));
  }
  return v.get<std::string>();
}

int64_t need_integer(const json& v, int64_t lo, int64_t hi, const std::string& path, const std::string& field) {
  const auto n = json_integer_in(v, lo, hi);
  if (!n) {
    bad(path, field,
        "expected an integer >= " + std::to_string(lo) + " and <= " + std::to_string(hi) + ", got " + describe_json(v));
  }
  return *n;
}

// Bounds far beyond any real measurement: they catch unit mix-ups (ms for s)
// and keep interpolated values finite.
constexpr double kMaxSeconds = 3600;                 // one iteration
constexpr double kMaxBytes = 1152921504606846976.0;  // 2^60

double need_seconds(const json& obj, const char* key, const std::string& path, const std::string& where) {
  const json& v = need(obj, key, path, where);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0 || v.get<double>() > kMaxSeconds) {
    bad(path, where + key, "expected a number of seconds > 0 and <= 3600 (one iteration), got " + describe_json(v));
  }
  return v.get<double>();
}

// Absent or null, or a finite number from 0 to `max` (`max` itself only when `max_included`).
std::optional<double> maybe_in(const json& obj, const char* key, double max, bool max_included, const char* expected,
                               const std::string& path, const std::string& where, const char* kind = "profile") {
  if (!obj.contains(key) || obj.at(key).is_null()) return std::nullopt;
  const json& v = obj.at(key);
  const bool in_range = v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() >= 0 &&
                        (max_included ? v.get<double>() <= max : v.get<double>() < max);
  if (!in_range) {
    bad_in(kind, path, where + key, std::string(expected) + " or null, got " + describe_json(v));
  }
  return v.get<double>();
}

std::optional<double> maybe_seconds(const json& obj, const char* key, const std::string& path,
                                    const std::string& where) {
  return maybe_in(obj, key, kMaxSeconds, true, "expected a number of seconds >= 0 and <= 3600", path, where);
}

std::optional<double> maybe_bytes(const json& obj, const char* key, const std::string& path, const std::string& where) {
  return maybe_in(obj, key, kMaxBytes, false, "expected a number of bytes >= 0 and < 2^60", path, where);
}

// Far beyond any host (a launch takes microseconds): catches seconds or
// nanoseconds written where microseconds belong.
constexpr double kMaxHostMicroseconds = 1e6;

// provenance.host (or a host cost file's top level, `where` empty): unknown
// keys are passed over, so later tools may add figures.
HostProfile parse_host(const json& host, const std::string& path, const char* kind = "profile",
                       const std::string& where = "provenance.host.") {
  const std::string field = where.empty() ? "(top level)" : where.substr(0, where.size() - 1);
  if (!host.is_object()) {
    bad_in(kind, path, field,
           "expected an object (the measuring host's per-op costs) or null, got " + describe_json(host));
  }
  const auto micros = [&](const char* key) {
    return maybe_in(host, key, kMaxHostMicroseconds, true, "expected a number of microseconds >= 0 and <= 1e6", path,
                    where, kind);
  };
  HostProfile h;
  h.python_op_us = micros("python_op_us");
  h.module_op_us = micros("module_op_us");
  h.autograd_op_us = micros("autograd_op_us");
  h.optimizer_param_us = micros("optimizer_param_us");
  if (host.contains("cpu") && !host.at("cpu").is_null()) {
    if (!host.at("cpu").is_string()) {
      bad_in(kind, path, where + "cpu",
             "expected the CPU's model name as a string or null, got " + describe_json(host.at("cpu")));
    }
    h.cpu = host.at("cpu").get<std::string>();
  }
  return h;
}

ProfileTable parse_table(const json& batches, int gpu_count, const std::string& path, const std::string& where) {
  if (!batches.is_array()) bad(path, where, "expected an array of batch entries, got " + describe_json(batches));
  if (batches.empty()) bad(path, where, "expected at least one batch entry, found none");
  ProfileTable table;
  table.gpu_count = gpu_count;
  for (size_t i = 0; i < batches.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "].";
    const json& b = batches[i];
    ProfilePoint p;
    p.batch_size = need_integer(need(b, "batch_size", path, at), 1, int64_t{1} << 31, path, at + "batch_size");
    if (!table.points.empty() && p.batch_size <= table.points.back().batch_size) {
      bad(path, at + "batch_size",
          "batch sizes must increase strictly; " + std::to_string(p.batch_size) + " follows " +
              std::to_string(table.points.back().batch_size));
    }
    p.forward_s = need_seconds(b, "forward_s", path, at);
    p.backward_s = need_seconds(b, "backward_s", path, at);
    p.transfer_pageable_s = maybe_seconds(b, "transfer_pageable_s", path, at);
    p.transfer_pinned_s = maybe_seconds(b, "transfer_pinned_s", path, at);
    p.peak_bytes = maybe_bytes(b, "peak_bytes", path, at);
    p.persistent_bytes = maybe_bytes(b, "persistent_bytes", path, at);
    table.points.push_back(p);
  }
  return table;
}

double lerp(double x0, double y0, double x1, double y1, double x) {
  return x1 == x0 ? y0 : y0 + (y1 - y0) * (x - x0) / (x1 - x0);
}

std::optional<double> lerp_opt(const std::optional<double>& y0, const std::optional<double>& y1, double x0, double x1,
                               double x) {
  if (!y0 || !y1) return std::nullopt;
  return std::max(0.0, lerp(x0, *y0, x1, *y1, x));
}

}  // namespace

const ProfileTable* Profile::table(int gpu_count) const {
  for (const auto& t : tables) {
    if (t.gpu_count == gpu_count) return &t;
  }
  return nullptr;
}

namespace {

// Other torch-emugpu data on the search path (calibrations, preprocessing
// tables) has its own schema and loader; the profile scan passes over it.
bool other_kind(const json& doc) {
  if (!doc.is_object()) return false;
  const auto it = doc.find("schema");
  if (it == doc.end() || !it->is_string()) return false;
  const auto& schema = it->get_ref<const std::string&>();
  return schema.starts_with("torch-emugpu ") && !schema.starts_with("torch-emugpu profile");
}

// The file's bytes, or nullopt with `why` set when it cannot be opened or a
// read fails part-way (a device file, an I/O error).
std::optional<std::string> try_read(const std::string& path, std::string& why) {
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    why = std::strerror(errno);
    return std::nullopt;
  }
  std::string text;
  char chunk[1 << 16];
  while (in.read(chunk, sizeof chunk) || in.gcount() > 0) text.append(chunk, static_cast<size_t>(in.gcount()));
  if (in.bad()) {
    why = "a read failed part-way";
    return std::nullopt;
  }
  return text;
}

std::string read_text(const std::string& path) {
  std::string why;
  auto text = try_read(path, why);
  EMUGPU_CHECK(text.has_value(), kValue, "cannot read profile ", path, " (", why, "); make it readable or remove it");
  return std::move(*text);
}

Profile from_document(const json& doc, const std::string& path) {
  if (!doc.is_object()) bad(path, "", "expected a JSON object at the top level");
  Profile p;
  p.path = path;
  p.gpu = need_string(doc, "gpu", path, "");
  p.model = need_string(doc, "model", path, "");
  const json& prov = need(doc, "provenance", path, "");
  for (const char* key : {"tool", "torch", "date"}) need_string(prov, key, path, "provenance.");
  p.dtype = need_string(prov, "dtype", path, "provenance.");
  if (prov.contains("amp") && !prov.at("amp").is_null()) {
    if (!prov.at("amp").is_boolean()) {
      bad(path, "provenance.amp", "expected true or false, got " + describe_json(prov.at("amp")));
    }
    p.amp = prov.at("amp").get<bool>();
  }
  p.source = need_string(prov, "source", path, "provenance.");
  if (prov.contains("host") && !prov.at("host").is_null()) p.host = parse_host(prov.at("host"), path);
  if (doc.contains("fingerprint") && !doc.at("fingerprint").is_null()) {
    // Beyond any model that exists (10^15 parameters) and exact as a double.
    constexpr int64_t kMaxParameters = 1'000'000'000'000'000;
    p.parameters = need_integer(need(doc.at("fingerprint"), "parameters", path, "fingerprint."), 1, kMaxParameters,
                                path, "fingerprint.parameters");
  }
  p.tables.push_back(parse_table(need(doc, "batches", path, ""), 1, path, "batches"));
  if (doc.contains("data_parallel")) {
    const json& dp = doc.at("data_parallel");
    if (!dp.is_array()) bad(path, "data_parallel", "expected an array, got " + describe_json(dp));
    for (size_t i = 0; i < dp.size(); ++i) {
      const std::string at = "data_parallel[" + std::to_string(i) + "].";
      const auto count =
          static_cast<int>(need_integer(need(dp[i], "gpu_count", path, at), 2, 4096, path, at + "gpu_count"));
      p.tables.push_back(parse_table(need(dp[i], "batches", path, at), count, path, at + "batches"));
    }
  }
  return p;
}

}  // namespace

Profile parse_profile(std::string_view text, const std::string& path) {
  return from_document(parse_json_document(text, "profile " + path), path);
}

Profile load_profile_file(const std::string& path) { return parse_profile(read_text(path), path); }

HostProfile parse_host_cost(std::string_view text, const std::string& path) {
  return parse_host(parse_json_document(text, "host cost file " + path), path, "host cost file", "");
}

HostProfile load_host_cost_file(const std::string& path) {
  std::string why;
  auto text = try_read(path, why);
  EMUGPU_CHECK(text.has_value(), kValue, "cannot read host cost file ", path, " (", why,
               "); write one with `python -m torch_emugpu.measure.host_cost --device cuda --out FILE` on the GPU "
               "machine whose host to model");
  return parse_host_cost(*text, path);
}

ProfileLookup interpolate(const Profile& profile, const ProfileTable& table, int64_t batch_size) {
  EMUGPU_CHECK(batch_size >= 1, kValue, "batch size must be >= 1 for a profile lookup, got ", batch_size, " (profile ",
               profile.path, ")");
  const auto& pts = table.points;
  ProfileLookup out;
  out.profile = &profile;
  auto it = std::lower_bound(pts.begin(), pts.end(), batch_size,
                             [](const ProfilePoint& p, int64_t b) { return p.batch_size < b; });
  if (it != pts.end() && it->batch_size == batch_size) {
    out.point = *it;
    return out;
  }
  if (pts.size() == 1) {  // one point: scale proportionally
    const double f = static_cast<double>(batch_size) / static_cast<double>(pts[0].batch_size);
    out.kind = LookupKind::kExtrapolated;
    out.point = pts[0];
    out.point.batch_size = batch_size;
    out.point.forward_s *= f;
    out.point.backward_s *= f;
    return out;
  }
  const ProfilePoint* a;
  const ProfilePoint* b;
  if (it == pts.begin()) {
    a = &pts[0], b = &pts[1], out.kind = LookupKind::kExtrapolated;
  } else if (it == pts.end()) {
    a = &pts[pts.size() - 2], b = &pts.back(), out.kind = LookupKind::kExtrapolated;
  } else {
    a = &*(it - 1), b = &*it, out.kind = LookupKind::kInterpolated;
  }
  const double x0 = static_cast<double>(a->batch_size), x1 = static_cast<double>(b->batch_size);
  const double x = static_cast<double>(batch_size);
  ProfilePoint& p = out.point;
  p.batch_size = batch_size;
  // Never below a tenth of the nearest measurement: extrapolating down to
  // tiny batches must not predict (near-)zero time.
  const ProfilePoint& near = x < x0 ? *a : *b;
  p.forward_s = std::max(lerp(x0, a->forward_s, x1, b->forward_s, x), 0.1 * near.forward_s);
  p.backward_s = std::max(lerp(x0, a->backward_s, x1, b->backward_s, x), 0.1 * near.backward_s);
  p.transfer_pageable_s = lerp_opt(a->transfer_pageable_s, b->transfer_pageable_s, x0, x1, x);
  p.transfer_pinned_s = lerp_opt(a->transfer_pinned_s, b->transfer_pinned_s, x0, x1, x);
  p.peak_bytes = lerp_opt(a->peak_bytes, b->peak_bytes, x0, x1, x);
  p.persistent_bytes = lerp_opt(a->persistent_bytes, b->persistent_bytes, x0, x1, x);
  return out;
}

void ProfileDb::scan(const std::vector<std::string>& directories) {
  namespace fs = std::filesystem;
  auto skip = [this](const fs::path& path, const std::string& why) {
    warnings_.push_back("profile search path: skipped " + path.string() + " (" + why +
                        "); fix or remove it to silence this warning");
  };
  for (const auto& dir : directories) {
    std::error_code ec;
    if (dir.empty() || !fs::is_directory(dir, ec)) continue;
    // Walked by hand, each step with an error code: one entry that cannot
    // be read (a symlink loop, a directory without permission) is skipped
    // with a warning, where an exception would end the whole scan.
    std::vector<std::string> files;
    std::vector<fs::path> pending{fs::path(dir)};
    while (!pending.empty()) {
      const fs::path here = std::move(pending.back());
      pending.pop_back();
      fs::directory_iterator it(here, ec), end;
      if (ec) {
        skip(here, ec.message());
        continue;
      }
      for (; it != end; it.increment(ec)) {
        const fs::path& path = it->path();
        std::error_code entry_ec;
        const fs::file_status status = it->status(entry_ec);  // follows symlinks: ELOOP for a loop
        if (entry_ec) {
          skip(path, entry_ec.message());
          continue;
        }
        // Into real directories only, as before: a symlinked one may lead back up.
        if (fs::is_directory(status)) {
          if (!it->is_symlink(entry_ec) && !entry_ec) pending.push_back(path);
        } else if (fs::is_regular_file(status) && path.extension() == ".json" && path.filename() != "gpus.json" &&
                   path.filename() != "schema.json") {
          files.push_back(path.string());
        }
      }
      if (ec) skip(here, ec.message());  // a read of the directory failed part-way
      ec.clear();
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::string why;
      const auto text = try_read(f, why);
      if (!text) {
        skip(f, why);
        continue;
      }
      // A malformed profile is refused naming the file, as parse_profile does.
      const json doc = parse_json_document(*text, "profile " + f);
      if (!other_kind(doc)) add(from_document(doc, f));
    }
  }
}

void ProfileDb::add(Profile profile) {
  for (const auto& p : profiles_) {
    if (normalize_gpu_name(p.gpu) == normalize_gpu_name(profile.gpu) && p.model == profile.model) return;
  }
  profiles_.push_back(std::move(profile));
}

const Profile* ProfileDb::find(const Catalog& catalog, std::string_view gpu_name, std::string_view model) const {
  const std::string& want = catalog.find(gpu_name).name;
  for (const auto& p : profiles_) {
    if (p.model != model) continue;
    try {
      if (catalog.find(p.gpu).name == want) return &p;
    } catch (const Error&) {
      // a profile for a GPU the catalog does not know cannot match
    }
  }
  return nullptr;
}

const Profile* ProfileDb::find_by_fingerprint(const Catalog& catalog, std::string_view gpu_name,
                                              int64_t parameters) const {
  const std::string& want = catalog.find(gpu_name).name;
  for (const auto& p : profiles_) {
    if (!p.parameters || *p.parameters != parameters) continue;
    try {
      if (catalog.find(p.gpu).name == want) return &p;
    } catch (const Error&) {
    }
  }
  return nullptr;
}

void ProfileDb::check_gpus(const Catalog& catalog) const {
  for (const auto& p : profiles_) {
    if (p.gpu.rfind("CPU", 0) == 0) continue;
    try {
      catalog.find(p.gpu);
    } catch (const Error& e) {
      detail::throw_error(ErrorKind::kValue, "profile ", p.path, ": field 'gpu': ", e.what());
    }
  }
}

std::optional<ProfileLookup> ProfileDb::lookup(const Catalog& catalog, std::string_view gpu_name,
                                               std::string_view model, std::optional<int64_t> parameters,
                                               int64_t batch_size, int gpu_count) const {
  const Profile* p = !model.empty() ? find(catalog, gpu_name, model)
                     : parameters   ? find_by_fingerprint(catalog, gpu_name, *parameters)
                                    : nullptr;
  if (p == nullptr) return std::nullopt;
  const ProfileTable* table = p->table(gpu_count);
  if (table == nullptr) return std::nullopt;
  return interpolate(*p, *table, batch_size);
}

}  // namespace emugpu
