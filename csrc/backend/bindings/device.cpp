// Bindings of torch_emugpu._C: configuration, devices and their GPUs, synchronize, engine and host-bound statistics.
#include <ATen/Context.h>
#include <torch/csrc/Generator.h>

#include <optional>
#include <string>

#include "backend/ops/common.h"
#include "backend/runtime.h"
#include "core/config.h"

#include "backend/bindings/common.h"

namespace emugpu {

namespace {

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
  d["mig_profile"] = g.mig_profile;  // empty: a whole GPU
  d["parent_name"] = g.parent_name;
  d["uuid"] = g.uuid;
  py::list profiles;
  for (const MigProfile& p : g.mig_profiles) profiles.append(p.name);
  d["mig_profiles"] = profiles;
  return d;
}

std::optional<std::string> optional_string(const py::object& o) {
  return o.is_none() ? std::nullopt : std::optional<std::string>(o.cast<std::string>());
}

}  // namespace

void bind_device(py::module_& m) {
  // Arguments left as None come from the environment (core/config.h).
  m.def(
      "_configure",
      [](py::object gpu, py::object count, py::object mode, py::object clock, py::object host, py::object speed) {
        guarded([&] {
          ConfigRequest request;
          request.gpu = optional_string(gpu);
          if (!count.is_none()) request.device_count = count.cast<int>();
          request.mode = optional_string(mode);
          request.clock = optional_string(clock);
          request.host = optional_string(host);
          if (!speed.is_none()) request.host_speed = speed.cast<double>();
          Runtime::get().configure(request);
        });
      },
      py::arg("gpu"), py::arg("count"), py::arg("mode"), py::arg("clock") = py::none(), py::arg("host") = py::none(),
      py::arg("host_speed") = py::none());
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
      d["clock"] = clock_kind_name(c.clock);
      d["host"] = host_model_name(c.host);
      d["host_speed"] = c.host_speed;
      d["host_cost_file"] = c.host_cost_file;
      return d;
    });
  });
  m.def("_set_mode",
        [](const std::string& mode) { guarded([&] { Runtime::get().set_mode(parse_mode(mode, "mode")); }); });
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
  m.def("_daemon_gpu", [](int index) { return guarded([&] { return Runtime::get().daemon_gpu(index); }); });
  // Any catalog GPU, matched loosely as EMUGPU_GPU is (e.g. the GPU a measured table came from).
  m.def("_gpu_properties",
        [](const std::string& name) { return guarded([&] { return gpu_dict(Runtime::get().catalog().find(name)); }); });
  m.def("_synchronize", [](int index) {
    const EmulatorCall call(active_virtual_clock());
    guarded([&] {
      Device& dev = Runtime::get().device(index);
      py::gil_scoped_release no_gil;    // the wait checks for signals with the GIL
      Runtime::get().drain_deferred();  // collectives whose end is not known yet (backend emu) are placed too
      dev.synchronize();
    });
  });
  m.def("_default_generator", [](int index) {
    return guarded([&] {
      Runtime::get().device(index);
      const at::Generator& gen = at::globalContext().defaultGenerator(
          c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)));
      return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(gen));
    });
  });
  m.def("_in_bad_fork", [] { return Runtime::get().in_bad_fork(); });
  m.def("_shape_cache_stats", [] { return shape_cache_stats(); });
  m.def("_shape_cache_entries", [] { return shape_cache_entries(); });
  // The clock devices run on, as the planner stamps its calls (no host work charged).
  m.def("_host_now_ns", [] { return Runtime::get().clock().now(); });
  // What Python's time functions read under the virtual clock; the steady
  // clock otherwise. Works in a forked child too (its time goes on).
  m.def("_clock_kind", [] { return clock_kind_name(Runtime::get().clock_kind()); });
  m.def("_clock_read_ns", [] {
    VirtualClock* v = active_virtual_clock();
    return v != nullptr ? v->read() : host_now();
  });
  m.def("_clock_sleep_ns", [](int64_t ns) {
    guarded([&] {
      VirtualClock* v = active_virtual_clock();
      EMUGPU_CHECK(v != nullptr, kRuntime, "the virtual clock is not running: expected EMUGPU_CLOCK=virtual");
      v->sleep_for(ns);
    });
  });
  m.def("_clock_receive_ns", [](int64_t ns) {
    if (VirtualClock* v = active_virtual_clock()) v->receive(ns);
  });
  m.def("_clock_charge_blocked_ns", [](int64_t ns) {
    guarded([&] {
      if (VirtualClock* v = active_virtual_clock()) v->charge_blocked(ns);
    });
  });
  m.def("_clock_stats", [] {
    py::dict d;
    d["clock"] = clock_kind_name(Runtime::get().clock_kind());
    if (VirtualClock* v = active_virtual_clock()) {
      const VirtualClockStats s = v->stats();
      const HostCost cost = v->host_cost();
      d["host"] = host_model_name(cost.model);
      d["host_speed"] = cost.speed;
      d["op_us"] = static_cast<double>(cost.op_ns) / 1e3;
      d["backward_op_us"] = static_cast<double>(cost.backward_op_ns >= 0 ? cost.backward_op_ns : cost.op_ns) / 1e3;
      d["list_tensor_us"] = static_cast<double>(cost.list_tensor_ns) / 1e3;
      d["elapsed_s"] = static_cast<double>(s.elapsed_ns) / 1e9;
      d["host_s"] = static_cast<double>(s.host_ns) / 1e9;
      d["waited_s"] = static_cast<double>(s.waited_ns) / 1e9;
      d["slept_s"] = static_cast<double>(s.slept_ns) / 1e9;
      d["calls"] = s.calls;
      d["reads"] = s.reads;
      d["wall_s"] = s.wall_s;
      d["speedup"] = s.wall_s > 0 ? static_cast<double>(s.elapsed_ns) / 1e9 / s.wall_s : 0.0;
    }
    return d;
  });
  m.def("_clock_reset_stats", [] {
    if (VirtualClock* v = active_virtual_clock()) v->reset_stats();
  });
  m.def("_device_ready_ns",
        [](int index) { return guarded([&] { return Runtime::get().device(index).device_ready(); }); });
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
  m.def("_reset_engine_stats", [](int index) { guarded([&] { Runtime::get().device(index).reset_stats(); }); });
  m.def("_utilization", [](int index) { return guarded([&] { return Runtime::get().device(index).utilization(); }); });
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
