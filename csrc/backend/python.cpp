// pybind11 bindings of torch_emugpu._C (torch's bundled pybind11).
#include <ATen/Context.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <tuple>
#include <optional>

#include "backend/allocator.h"
#include "backend/bindings.h"
#include "backend/distributed/collective.h"
#include "backend/distributed/group_collectives.h"
#include "backend/host_allocator.h"
#include "backend/ops/common.h"
#include "backend/runtime.h"
#include "core/calibration.h"
#include "core/collective_cost.h"
#include "core/cost_ledger.h"
#include "core/kernel_params.h"
#include "core/host_allocator.h"
#include "core/exchange/shm_exchange.h"

namespace emugpu {

void register_hooks();

namespace {

namespace py = pybind11;

PyObject* configured_callable = nullptr;



py::dict kernel_params_dict(const KernelParams& p) {
  py::dict d;
  for (const KernelParamField& f : kernel_param_fields()) d[f.name] = p.*f.member;
  d["source"] = p.source;
  return d;
}

TimeNs region_target(double seconds) { return seconds < 0 ? kUnbudgeted : seconds_to_ns(seconds); }

// The GPU's table row with the named parameters of `values` over it.
KernelParams params_over_table(const GpuSpec& gpu, const py::dict& values) {
  KernelParams p = default_kernel_params(gpu);
  for (const auto& [k, v] : values) set_kernel_param(p, k.cast<std::string>(), v.cast<double>());
  return p;
}

// A calibration's fit, once per file version: configure() reloads profiles
// often, and a fit takes a fraction of a second.
KernelParams fitted_calibration(const std::string& path, const GpuSpec& gpu) {
  namespace fs = std::filesystem;
  static std::mutex mutex;
  static std::map<std::tuple<std::string, std::string, uintmax_t, int64_t>, KernelParams> fits;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  const auto mtime = fs::last_write_time(path, ec).time_since_epoch().count();
  const auto key = std::make_tuple(path, gpu.name, size, static_cast<int64_t>(mtime));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = fits.find(key);
  if (it == fits.end()) {
    const Calibration cal = load_calibration(path, gpu);
    // Once per file version, as the fit: points a newer version wrote are skipped, not refused.
    if (const std::string warning = calibration_warning(cal); !warning.empty()) TORCH_WARN("emugpu: ", warning);
    it = fits.emplace(key, fit_kernel_params(gpu, cal.cases, default_kernel_params(gpu), {},
                                             "calibration: " + path)).first;
  }
  return it->second;
}

// OpCost <-> dict, for the trace of the fitting benchmark and _kernel_times.
py::dict op_cost_dict(const OpCost& c) {
  py::dict d;
  d["family"] = static_cast<int>(c.family);
  d["flops"] = c.flops;
  d["bytes"] = c.bytes;
  d["dtype"] = static_cast<int>(c.dtype);
  d["kernels"] = c.kernels;
  py::list gemms;
  for (int i = 0; i < c.gemm_count; ++i) {
    const GemmShape& g = c.gemms[static_cast<size_t>(i)];
    gemms.append(py::make_tuple(g.batch, g.m, g.n, g.k, g.winograd));
  }
  d["gemms"] = gemms;
  const ConvShape& v = c.conv;
  d["conv"] = py::make_tuple(v.n, v.c, v.h, v.w, v.k, v.r, v.s, v.p, v.q, v.groups, v.stride);
  d["channels_last"] = v.channels_last;
  d["channels"] = c.channels;
  d["backward"] = c.backward;
  return d;
}

OpCost op_cost_from_dict(const py::dict& d) {
  OpCost c;
  const int family = d["family"].cast<int>();
  const int dtype = d["dtype"].cast<int>();
  EMUGPU_CHECK(family >= 0 && family < kOpFamilyCount && dtype >= 0 && dtype <= static_cast<int>(DType::kInteger),
               kValue, "op family must lie in [0, ", kOpFamilyCount, ") and dtype in [0, ",
               static_cast<int>(DType::kInteger), "], got ", family, " and ", dtype);
  c.family = static_cast<OpFamily>(family);
  c.dtype = static_cast<DType>(dtype);
  c.flops = d["flops"].cast<double>();
  c.bytes = d["bytes"].cast<double>();
  c.kernels = d["kernels"].cast<int>();
  const auto gemms = d["gemms"].cast<py::list>();
  EMUGPU_CHECK(gemms.size() <= c.gemms.size(), kValue, "an op runs at most ", c.gemms.size(), " GEMMs, got ",
               gemms.size());
  for (const auto& item : gemms) {
    const auto t = item.cast<py::tuple>();
    c.gemms[static_cast<size_t>(c.gemm_count++)] = {t[0].cast<double>(), t[1].cast<double>(), t[2].cast<double>(),
                                                    t[3].cast<double>(), t[4].cast<bool>()};
  }
  const auto v = d["conv"].cast<py::tuple>();
  EMUGPU_CHECK(v.size() == 11, kValue, "conv must hold 11 sizes, got ", v.size());
  double* fields[] = {&c.conv.n, &c.conv.c, &c.conv.h, &c.conv.w, &c.conv.k, &c.conv.r,
                      &c.conv.s, &c.conv.p, &c.conv.q, &c.conv.groups, &c.conv.stride};
  for (size_t i = 0; i < 11; ++i) *fields[i] = v[i].cast<double>();
  c.channels = d.contains("channels") ? d["channels"].cast<double>() : 0.0;
  c.backward = d.contains("backward") && d["backward"].cast<bool>();
  c.conv.channels_last = d.contains("channels_last") && d["channels_last"].cast<bool>();
  return c;
}

// Python errors (a malformed profile) become ours, so the op that
// configured maps them to ValueError.
void call_configured() {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return;
  py::gil_scoped_acquire gil;
  PyObject* result = PyObject_CallNoArgs(configured_callable);
  if (result == nullptr) {
    py::error_already_set error;
    const std::string why = py::str(error.value());
    EMUGPU_CHECK(false, kValue, "loading the profiles and calibration for the emulated GPU failed: ", why);
  }
  Py_DECREF(result);
}

py::dict stat_dict(const Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak;
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

py::dict stat_dict(const StatArray& s) {
  py::dict out;
  const char* pools[] = {"all", "small_pool", "large_pool"};
  for (int p = 0; p < 3; ++p) out[pools[p]] = stat_dict(s[p]);
  return out;
}

py::dict gpu_dict(const GpuSpec& g) {
  py::dict d;
  d["name"] = g.name;
  d["total_memory"] = g.memory_bytes;
  d["multi_processor_count"] = g.sm_count;
  d["major"] = g.major;
  d["minor"] = g.minor;
  d["fp32_flops"] = g.fp32_flops;
  d["tf32_flops"] = g.tf32_flops;
  d["fp16_flops"] = g.fp16_flops;
  d["bf16_flops"] = g.bf16_flops;
  d["memory_bandwidth"] = g.memory_bandwidth;
  d["pcie_generation"] = g.pcie_generation;
  d["pcie_width"] = g.pcie_width;
  d["nvlink_bandwidth"] = g.nvlink_bandwidth;
  return d;
}

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

// Long host waits give Python a chance to run its signal handlers, so that
// Ctrl-C interrupts them as it does CUDA's; the KeyboardInterrupt propagates.
void check_python_signals() {
  if (!Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
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

std::optional<std::string> optional_string(const py::object& o) {
  return o.is_none() ? std::nullopt : std::optional<std::string>(o.cast<std::string>());
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-emugpu's compiled core: emulated GPU devices for PyTorch";
  register_hooks();  // before any use: pin_memory() may come before the first emugpu tensor
  set_wait_interrupt_check(&check_python_signals);
  // Once per process: a host-bound run's times are this machine's, not the GPU's.
  set_host_bound_handler([](int device, double idle_fraction) {
    if (const TimeNs pace = Runtime::get().device(device).host_pace(); pace > 0) {
      // Asked for: the emulated host is slower than the GPU, as such a machine would be.
      TORCH_WARN_ONCE("emugpu:", device, " is host-bound: the emulated GPU sat idle ",
                      static_cast<int>(idle_fraction * 100), "% of the time waiting for the emulated host ",
                      "(EMUGPU_HOST_OP_US=", static_cast<double>(pace) / 1e3,
                      " per op launched from Python), as it would on a machine with that host.");
      return;
    }
    TORCH_WARN_ONCE("emugpu:", device, " is host-bound: in the last ", HostBoundMonitor::kWindowNs / 1e9,
                    " s or more the emulated GPU sat idle ", static_cast<int>(idle_fraction * 100),
                    "% of the time waiting for this host to launch work, so iteration times now measure this "
                    "machine's host (and the ranks sharing its cores), not the GPU. Give each rank a core, use "
                    "fewer ranks or larger batches; torch_emugpu.host_bound_report() counts such windows.");
  });
  m.attr("DEFAULT_GPU") = kDefaultGpu;

  // Arguments left as None come from the environment (core/config.h).
  m.def("_configure", [](py::object gpu, py::object count, py::object mode) {
    guarded([&] {
      ConfigRequest request{optional_string(gpu),
                            count.is_none() ? std::nullopt : std::optional<int>(count.cast<int>()),
                            optional_string(mode), std::nullopt, std::nullopt};
      Runtime::get().configure(request);
      invalidate_shape_caches();
    });
  });
  m.def("_ensure_configured", [] { guarded([&] { Runtime::get().ensure_configured(); }); });
  m.def("_configured", [] { return Runtime::get().configured(); });
  m.def("_config", [] {
    return guarded([&] {
      const Config c = Runtime::get().config();
      py::dict d;
      d["gpu"] = Runtime::get().device(0).gpu().name;
      d["device_count"] = c.device_count;
      d["mode"] = mode_name(c.mode);
      d["catalog"] = c.catalog_path;
      d["exchange"] = exchange_name(c.exchange);
      d["host_copy_gbps"] = c.host_copy_gbps;
      d["host_op_us"] = c.host_op_us;
      return d;
    });
  });
  m.def("_set_mode", [](const std::string& mode) {
    guarded([&] { Runtime::get().set_mode(parse_mode(mode, "mode")); });
  });
  m.def("_mode", [] { return Runtime::get().compute_mode() ? "compute" : "timing"; });
  m.def("_device_count", [] { return guarded([&] { return Runtime::get().device_count(); }); });
  m.def("_current_device", [] { return current_device(); });
  m.def("_set_device", [](int index) { guarded([&] { set_current_device(index); }); });
  m.def("_gpu_names", [] {
    py::list names;
    guarded([&] {
      for (const auto& g : Runtime::get().catalog().gpus()) names.append(g.name);
    });
    return names;
  });
  m.def("_device_properties",
        [](int index) { return guarded([&] { return gpu_dict(Runtime::get().device(index).gpu()); }); });
  // Any catalog GPU, matched loosely as EMUGPU_GPU is (e.g. the GPU a measured table came from).
  m.def("_gpu_properties",
        [](const std::string& name) { return guarded([&] { return gpu_dict(Runtime::get().catalog().find(name)); }); });
  m.def("_set_configured_hook", [](py::object fn) {
    if (configured_callable == nullptr) configured_callable = fn.release().ptr();
    Runtime::get().set_configured_hook(&call_configured);
  });
  m.def("_synchronize", [](int index) {
    guarded([&] {
      Device& dev = Runtime::get().device(index);
      py::gil_scoped_release no_gil;  // the wait checks for signals with the GIL
      Runtime::get().drain_deferred();  // collectives whose end is not known yet (backend emu) are placed too
      dev.synchronize();
    });
  });
  m.def("_memory_stats", [](int index) {
    return guarded([&] {
      const AllocatorStats s = Runtime::get().device(index).allocator().stats();
      py::dict d;
      d["allocation"] = stat_dict(s.allocation);
      d["segment"] = stat_dict(s.segment);
      d["active"] = stat_dict(s.active);
      d["inactive_split"] = stat_dict(s.inactive_split);
      d["allocated_bytes"] = stat_dict(s.allocated_bytes);
      d["reserved_bytes"] = stat_dict(s.reserved_bytes);
      d["active_bytes"] = stat_dict(s.active_bytes);
      d["inactive_split_bytes"] = stat_dict(s.inactive_split_bytes);
      d["requested_bytes"] = stat_dict(s.requested_bytes);
      d["num_alloc_retries"] = s.num_alloc_retries;
      d["num_ooms"] = s.num_ooms;
      d["num_device_alloc"] = s.num_device_alloc;
      d["num_device_free"] = s.num_device_free;
      return d;
    });
  });
  m.def("_reset_peak_memory_stats", [](int index) {
    guarded([&] { Runtime::get().device(index).allocator().reset_peak_stats(); });
  });
  m.def("_reset_accumulated_memory_stats", [](int index) {
    guarded([&] { Runtime::get().device(index).allocator().reset_accumulated_stats(); });
  });
  m.def("_host_memory_stats", [] {
    const HostAllocatorStats s = host_allocator().stats();
    py::dict d;
    d["allocations"] = stat_dict(s.allocations);
    d["allocated_bytes"] = stat_dict(s.allocated_bytes);
    d["active_requests"] = stat_dict(s.active_requests);
    d["active_bytes"] = stat_dict(s.active_bytes);
    d["num_host_alloc"] = s.num_host_alloc;
    d["num_host_free"] = s.num_host_free;
    d["requests"] = s.requests;
    d["cache_hits"] = s.cache_hits;
    d["cached_bytes"] = s.cached_bytes();
    d["locked_bytes"] = s.locked_bytes;
    d["locked"] = s.locked;
    return d;
  });
  m.def("_host_reset_peak_stats", [] { host_allocator().reset_peak_stats(); });
  m.def("_host_reset_accumulated_stats", [] { host_allocator().reset_accumulated_stats(); });
  m.def("_host_empty_cache", [] { guarded([] { host_allocator().empty_cache(); }); });
  m.def("_empty_cache", [] { guarded([&] { device_allocator().emptyCache({0, 0}); }); });
  m.def("_mem_get_info", [](int index) {
    return guarded([&] { return device_allocator().getMemoryInfo(static_cast<c10::DeviceIndex>(index)); });
  });
  m.def("_default_generator", [](int index) {
    return guarded([&] {
      Runtime::get().device(index);
      const at::Generator& gen = at::globalContext().defaultGenerator(
          c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
      return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
    });
  });
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
      Runtime::get().device(index).backward_reached(current_stream_id(index), backward_key,
                                                    region_target(backward_s));
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
  m.def("_set_measured_transfer", [](int index, double latency_s, double rate, double pinned_rate) {
    guarded([&] {
      Runtime::get().device(index).cost().set_measured_transfer(seconds_to_ns(latency_s), rate, pinned_rate);
    });
  });
  m.def("_load_profiles", [](const std::vector<std::string>& directories) {
    return guarded([&] {
      ProfileDb db;
      db.scan(directories);
      db.check_gpus(Runtime::get().catalog());
      py::list out;
      for (const auto& p : db.profiles()) out.append(profile_summary(p));
      Runtime::get().set_profiles(std::move(db));
      return out;
    });
  });
  // The cost model's kernel parameters for the configured GPU: fitted to the
  // first calibration file for it on the search path, else its architecture's row.
  m.def("_load_calibration", [](const std::vector<std::string>& directories) {
    return guarded([&] {
      const GpuSpec& gpu = Runtime::get().device(0).gpu();
      KernelParams params = default_kernel_params(gpu);
      if (const auto path = find_calibration(directories, gpu)) params = fitted_calibration(*path, gpu);
      for (int i = 0; i < Runtime::get().device_count(); ++i) Runtime::get().device(i).cost().set_kernel_params(params);
      invalidate_shape_caches();  // cached ops keep the durations of the old parameters
      return kernel_params_dict(params);
    });
  });
  // A calibration file's points as the cost model sees them, with the fitted
  // parameters (benchmarks/fit_cost_model.py --calibration).
  m.def("_calibration_cases", [](const std::string& path, const std::string& gpu) {
    return guarded([&] {
      const GpuSpec& spec = Runtime::get().catalog().find(gpu);
      const Calibration cal = load_calibration(path, spec);
      py::list cases;
      for (const MeasuredCase& c : cal.cases) {
        py::list ops;
        for (const OpCost& op : c.ops) ops.append(op_cost_dict(op));
        cases.append(py::make_tuple(ops, c.seconds, c.upper_bound));
      }
      return py::make_tuple(cases, kernel_params_dict(fitted_calibration(path, spec)));
    });
  });
  m.def("_current_kernel_params", [](int index) {
    return guarded([&] { return kernel_params_dict(Runtime::get().device(index).cost().kernel_params()); });
  });
  m.def("_profile_lookup", [](const std::string& gpu, const std::string& model, py::object parameters,
                              int64_t batch_size, int gpu_count) {
    return guarded([&]() -> py::object {
      const auto db = Runtime::get().profiles();
      if (db == nullptr) return py::none();
      const auto r = db->lookup(Runtime::get().catalog(), gpu, model,
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
      return d;
    });
  });
  // Sharing between processes (torch_emugpu/_sharing.py sends the fd).
  m.def("_share_storage", [](py::handle storage) {
    return guarded([&] {
      const c10::Storage shared = torch::createStorage(storage.ptr());
      await_collective_writes(shared);  // its bytes and real-bytes flag as the collectives leave them
      const SharedStorage s = share_storage(shared);
      return py::make_tuple(s.fd, s.map_offset, s.map_length, s.data_offset, s.nbytes, s.device, s.materialized,
                            s.ready_ns);
    });
  });
  m.def("_open_shared_storage", [](int fd, uint64_t map_offset, uint64_t map_length, uint64_t data_offset,
                                   uint64_t nbytes, int device, bool materialized, int64_t ready_ns) {
    return guarded([&] {
      const c10::Storage storage = open_shared_storage(
          {fd, map_offset, map_length, data_offset, nbytes, device, materialized, ready_ns});
      return py::reinterpret_steal<py::object>(torch::createPyObject(storage));
    });
  });
  m.def("_refresh_shared_storage", [](py::handle storage, bool materialized, int64_t ready_ns) {
    guarded([&] { refresh_shared_storage(torch::createStorage(storage.ptr()), materialized, ready_ns); });
  });
  m.def("_in_bad_fork", [] { return Runtime::get().in_bad_fork(); });
  // Whether the device holds its later work behind a time not known yet.
  m.def("_device_held", [](int index) { return guarded([&] { return Runtime::get().device(index).held(); }); });
  m.def("_shape_cache_stats", [] { return shape_cache_stats(); });
  m.def("_host_now_ns", [] { return host_now(); });
  m.def("_device_ready_ns", [](int index) {
    return guarded([&] { return Runtime::get().device(index).device_ready(); });
  });
  m.def("_engine_stats", [](int index) {
    return guarded([&] {
      py::dict d;
      const char* names[] = {"compute", "h2d", "d2h", "collective"};
      for (int e = 0; e < kEngineCount; ++e) {
        const EngineStats s = Runtime::get().device(index).engine_stats(static_cast<Engine>(e));
        d[names[e]] = py::make_tuple(s.launches, s.busy_ns);
      }
      d["host_blocked_ns"] = Runtime::get().device(index).host_blocked_ns();
      return d;
    });
  });
  m.def("_host_bound_stats", [](int index) {
    return guarded([&] {
      const Device& dev = Runtime::get().device(index);
      const HostBoundStats s = dev.host_bound_stats();
      py::dict d;
      d["windows"] = s.windows;
      d["host_bound_windows"] = s.host_bound;
      d["last_idle_fraction"] = s.last_idle_fraction;
      d["worst_idle_fraction"] = s.worst_idle_fraction;
      d["idle_ns"] = dev.host_idle_ns();
      return d;
    });
  });
  m.def("_reset_engine_stats", [](int index) {
    guarded([&] { Runtime::get().device(index).reset_stats(); });
  });
  // torch_emugpu.cost_report(): what the cost model charged, per op family.
  m.def("_cost_report", [](int index) {
    return guarded([&] {
      py::list rows;
      for (const FamilyCost& f : Runtime::get().device(index).ledger().report()) {
        py::dict d;
        d["family"] = op_family_name(f.family);
        d["ops"] = f.ops;
        d["kernels"] = f.kernels;
        d["time_ns"] = f.time_ns;
        d["flops"] = f.flops;
        d["bytes"] = f.bytes;
        d["peak_compute_ns"] = f.peak_compute_ns;
        d["peak_memory_ns"] = f.peak_memory_ns;
        d["compute_bound_ops"] = f.compute_bound;
        rows.append(d);
      }
      return rows;
    });
  });
  m.def("_reset_cost_report", [](int index) { guarded([&] { Runtime::get().device(index).ledger().reset(); }); });
  // The ops the cost model timed, as it saw them (benchmarks/fit_cost_model.py).
  m.def("_cost_trace_start", [](int index, int64_t limit) {
    guarded([&] { Runtime::get().device(index).ledger().start_trace(static_cast<size_t>(std::max<int64_t>(limit, 0))); });
  });
  m.def("_cost_trace", [](int index) {
    return guarded([&] {
      py::list out;
      for (const TracedOp& op : Runtime::get().device(index).ledger().take_trace()) {
        py::dict d = op_cost_dict(op.cost);
        d["name"] = op.name;
        d["charged_ns"] = op.charged;
        out.append(d);
      }
      return out;
    });
  });
  // Each op's duration on the catalog GPU `gpu` with its architecture's
  // kernel parameters, or those given (name -> value) over them.
  m.def("_kernel_times", [](const std::string& gpu, const py::dict& params, const py::list& ops) {
    return guarded([&] {
      const GpuSpec& spec = Runtime::get().catalog().find(gpu);
      const CostModel model(spec, {}, params_over_table(spec, params));
      std::vector<TimeNs> out;
      out.reserve(ops.size());
      for (const auto& op : ops) out.push_back(model.kernel(op_cost_from_dict(op.cast<py::dict>())));
      return out;
    });
  });
  // fit_kernel_params over (ops, seconds) cases, from the GPU's table row or
  // the given parameters over it (benchmarks/fit_cost_model.py --fit).
  m.def("_fit_kernel_params", [](const std::string& gpu, const py::dict& start, const py::list& cases,
                                 const std::vector<std::string>& names) {
    return guarded([&] {
      const GpuSpec& spec = Runtime::get().catalog().find(gpu);
      const KernelParams p = params_over_table(spec, start);
      std::vector<MeasuredCase> measured;
      for (const auto& item : cases) {
        const auto t = item.cast<py::tuple>();
        MeasuredCase c;
        for (const auto& op : t[0].cast<py::list>()) c.ops.push_back(op_cost_from_dict(op.cast<py::dict>()));
        c.seconds = t[1].cast<double>();
        measured.push_back(std::move(c));
      }
      py::gil_scoped_release no_gil;
      const KernelParams fit = fit_kernel_params(spec, measured, p, names, "fit");
      py::gil_scoped_acquire gil;
      return kernel_params_dict(fit);
    });
  });
  m.def("_kernel_param_fields", [] {
    py::dict d;
    for (const KernelParamField& f : kernel_param_fields()) d[f.name] = py::make_tuple(f.lo, f.hi);
    return d;
  });
  m.def("_kernel_params", [](const std::string& gpu) {
    return guarded([&] {
      return kernel_params_dict(default_kernel_params(Runtime::get().catalog().find(gpu)));
    });
  });
  m.def("_op_family_names", [] {
    py::list names;
    for (int i = 0; i < kOpFamilyCount; ++i) names.append(op_family_name(static_cast<OpFamily>(i)));
    return names;
  });
  m.def("_utilization", [](int index) {
    return guarded([&] { return Runtime::get().device(index).utilization(); });
  });
  // The collective cost model for benchmarks/collective_model.py; a network
  // or algorithm set left as None comes from the configuration (EMUGPU_NET_*, NCCL_ALGO).
  m.def("_collective_time", [](const std::string& kind, double bytes, const std::string& gpu, int ranks_per_node,
                               int nodes, py::object net_gbps, py::object net_latency_us, py::object algorithms) {
    return guarded([&] {
      const Config c = Runtime::get().config();
      const NetworkSpec net{(net_gbps.is_none() ? c.net_gbps : net_gbps.cast<double>()) * 1e9,
                            net_latency_us.is_none() ? c.net_latency_us : net_latency_us.cast<double>()};
      // The core range-checks the world size; clamping only keeps the product an int.
      const int64_t world = std::clamp<int64_t>(int64_t{ranks_per_node} * nodes, -1, INT32_MAX);
      const Topology t = make_topology(Runtime::get().catalog().find(gpu), static_cast<int>(world),
                                       ranks_per_node, net);
      const AlgorithmSet allowed =
          parse_algorithms(algorithms.is_none() ? c.nccl_algo : algorithms.cast<std::string>());
      const CollectiveCost r = collective_time(parse_collective(kind), bytes, t, allowed);
      py::dict d;
      d["seconds"] = r.duration * 1e-9;
      d["algorithm"] = algorithm_name(r.algorithm);
      d["protocol"] = protocol_name(r.protocol);
      d["bus_factor"] = r.bus_factor;
      return d;
    });
  }, py::arg("kind"), py::arg("bytes"), py::arg("gpu"), py::arg("ranks_per_node"), py::arg("nodes"),
     py::arg("net_gbps") = py::none(), py::arg("net_latency_us") = py::none(), py::arg("algorithms") = py::none());
  bind_distributed(m);
  m.def("_emulate_kernel", [](int index, double seconds) {
    return guarded([&] {
      const TimeNs duration = seconds_to_ns(seconds);
      Runtime::get().device(index);
      py::gil_scoped_release no_gil;  // a full launch queue blocks
      return charge(index, Engine::kCompute, duration);
    });
  });
}

}  // namespace emugpu
