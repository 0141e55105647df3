// Bindings of torch_emugpu._C: profiles, their lookup and the profiled regions the planner drives.
#include <optional>
#include <string>

#include "backend/ops/common.h"
#include "backend/runtime.h"
#include "core/batch_curve.h"
#include "core/profile_db.h"

#include "backend/bindings/common.h"

namespace emugpu {

namespace {

TimeNs region_target(double seconds) { return seconds < 0 ? kUnbudgeted : seconds_to_ns(seconds); }

py::object optional_number(const std::optional<double>& v) {
  return v ? py::object(py::float_(*v)) : py::object(py::none());
}

py::dict profile_summary(const Profile& p) {
  py::dict d;
  d["path"] = p.path;
  d["gpu"] = p.gpu;
  d["model"] = p.model;
  d["parameters"] = p.parameters ? py::object(py::int_(*p.parameters)) : py::object(py::none());
  d["source"] = p.source;
  d["dtype"] = p.dtype;
  d["amp"] = p.amp;
  py::list tables;
  for (const auto& t : p.tables) {
    py::list sizes;
    for (const auto& pt : t.points) sizes.append(pt.batch_size);
    tables.append(py::make_tuple(t.gpu_count, sizes));
  }
  d["tables"] = tables;
  return d;
}

py::list profile_summaries(const ProfileDb& db) {
  py::list out;
  for (const auto& p : db.profiles()) out.append(profile_summary(p));
  return out;
}

py::dict region_dict(const RegionReport& r) {
  py::dict d;
  d["key"] = r.key;
  d["kind"] = r.kind == RegionKind::kForward ? "forward" : "backward";
  d["target_s"] = r.target == kUnbudgeted ? py::object(py::none()) : py::object(py::float_(r.target / 1e9));
  d["last_s"] = r.last_time / 1e9;
  d["charged_s"] = r.charged / 1e9;
  d["estimated_s"] = r.estimated / 1e9;
  d["padded_s"] = r.padded / 1e9;
  d["waited_s"] = r.waited / 1e9;
  d["worst_excess_s"] = r.worst_excess / 1e9;
  d["occurrences"] = r.occurrences;
  d["host_bound"] = r.host_bound;
  d["cancelled"] = r.cancelled;
  d["aborted"] = r.aborted;
  return d;
}

}  // namespace

void bind_regions(py::module_& m) {
  // The model-level planner (torch_emugpu/profiles.py) drives the regions;
  // a negative target is a cost-model region (kUnbudgeted).
  m.def("_forward_begin", [](int index, const std::string& key, double target_s, int64_t called_at_ns) {
    return guarded([&] {
      return Runtime::get().device(index).forward_begin(current_stream_id(index), key, region_target(target_s),
                                                        called_at_ns);
    });
  });
  m.def("_forward_end", [](int index, const std::string& backward_key, double backward_s, bool expects_backward) {
    guarded([&] {
      Runtime::get().device(index).forward_end(current_stream_id(index), backward_key, region_target(backward_s),
                                               expects_backward);
    });
  });
  m.def("_backward_reached", [](int index, const std::string& backward_key, double backward_s) {
    guarded([&] {
      Runtime::get().device(index).backward_reached(current_stream_id(index), backward_key, region_target(backward_s));
    });
  });
  m.def("_region_abort", [](int index) { guarded([&] { Runtime::get().device(index).region_abort(); }); });
  m.def("_region_report", [](int index) {
    return guarded([&] {
      py::list out;
      for (const auto& r : Runtime::get().device(index).region_report()) out.append(region_dict(r));
      return out;
    });
  });
  // The target of region `key` at `batch` from a profile's measured (batch, seconds) points, bent by the
  // cost model's curve from the key's last complete occurrence (core/batch_curve.h); None before one.
  m.def("_region_curve_target",
        [](int index, const std::string& key, int64_t batch, const std::vector<std::pair<int64_t, double>>& points) {
          return guarded([&]() -> py::object {
            const auto curve = Runtime::get().device(index).region_cost_curve(key, batch);
            if (!curve) return py::none();
            std::vector<MeasuredPoint> measured;
            for (const auto& [b, seconds] : points) measured.push_back({b, seconds});
            const CurveTarget t = curve_target(measured, batch, *curve);
            py::dict d;
            d["target_s"] = t.seconds;
            d["method"] = t.method == CurveMethod::kExact          ? "exact"
                          : t.method == CurveMethod::kInterpolated ? "interpolated"
                          : t.method == CurveMethod::kExtrapolated ? "extrapolated"
                                                                   : "scaled";
            d["between"] = py::make_tuple(t.below, t.above);
            d["cost_model_s"] = curve->at(static_cast<double>(batch)) / 1e9;
            d["cost_model_fixed_s"] = curve->fixed_ns / 1e9;        // launch floors
            d["cost_model_variable_s"] = curve->variable_ns / 1e9;  // in proportion to the batch
            return d;
          });
        });
  m.def("_set_measured_transfer", [](int index, double latency_s, double rate, double pinned_rate) {
    guarded([&] {
      Runtime::get().device(index).cost().set_measured_transfer(seconds_to_ns(latency_s), rate, pinned_rate);
    });
  });
  // The profiles and calibration are read by the runtime at each configuration (core/config.h names
  // the search path); these let Python list them, reread them, and notice a reread.
  m.def("_reload_profiles", [] {
    return guarded([&] {
      Runtime::get().reload_profiles();
      return profile_summaries(*Runtime::get().profiles());
    });
  });
  m.def("_profile_summaries", [] {
    return guarded([&] {
      Runtime::get().ensure_configured();
      return profile_summaries(*Runtime::get().profiles());
    });
  });
  m.def("_profiles_generation", [] { return Runtime::get().profiles_generation(); });
  m.def("_search_path", [] {
    return guarded([&] {
      const SearchPath path = Runtime::get().search_path();
      py::dict d;
      d["profiles"] = path.profiles;
      d["calibration"] = path.calibration;
      return d;
    });
  });
  // Reads the profiles of `directories` without using them (a tool checking what it wrote).
  m.def("_scan_profiles", [](const std::vector<std::string>& directories) {
    return guarded([&] {
      ProfileDb db;
      db.scan(directories);
      for (const std::string& warning : db.warnings()) TORCH_WARN("emugpu: ", warning);
      db.check_gpus(Runtime::get().catalog());
      return profile_summaries(db);
    });
  });
  m.def("_profile_lookup",
        [](const std::string& gpu, const std::string& model, py::object parameters, int64_t batch_size, int gpu_count) {
          return guarded([&]() -> py::object {
            const auto db = Runtime::get().profiles();
            if (db == nullptr) return py::none();
            const auto r =
                db->lookup(Runtime::get().catalog(), gpu, model,
                           parameters.is_none() ? std::nullopt : std::optional<int64_t>(parameters.cast<int64_t>()),
                           batch_size, gpu_count);
            if (!r) return py::none();
            const Profile* p = r->profile;
            py::dict d = profile_summary(*p);
            d["kind"] = r->kind == LookupKind::kExact          ? "exact"
                        : r->kind == LookupKind::kInterpolated ? "interpolated"
                                                               : "extrapolated";
            d["forward_s"] = r->point.forward_s;
            d["backward_s"] = r->point.backward_s;
            d["transfer_pageable_s"] = optional_number(r->point.transfer_pageable_s);
            d["transfer_pinned_s"] = optional_number(r->point.transfer_pinned_s);
            d["peak_bytes"] = optional_number(r->point.peak_bytes);
            d["persistent_bytes"] = optional_number(r->point.persistent_bytes);
            // The measured points of the table it came from: the planner bends between them (batch_curve.h).
            py::list points;
            for (const auto& pt : p->table(gpu_count)->points) {
              points.append(py::make_tuple(pt.batch_size, pt.forward_s, pt.backward_s));
            }
            d["points"] = points;
            return d;
          });
        });
}

}  // namespace emugpu
