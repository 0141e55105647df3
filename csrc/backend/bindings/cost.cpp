// Bindings of torch_emugpu._C: the per-op and collective cost models, calibration and what the cost model charged.
#include <algorithm>
#include <climits>

#include "backend/runtime.h"
#include "core/calibration.h"
#include "core/collective_cost.h"
#include "core/cost_ledger.h"
#include "core/cost_rule.h"
#include "core/kernel_params.h"

#include "backend/bindings/common.h"

namespace emugpu {

namespace {

py::dict kernel_params_dict(const KernelParams& p) {
  py::dict d;
  for (const KernelParamField& f : kernel_param_fields()) d[f.name] = p.*f.member;
  d["source"] = p.source;
  return d;
}

// The GPU's table row with the named parameters of `values` over it.
KernelParams params_over_table(const GpuSpec& gpu, const py::dict& values) {
  KernelParams p = default_kernel_params(gpu);
  for (const auto& [k, v] : values) set_kernel_param(p, k.cast<std::string>(), v.cast<double>());
  return p;
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
  d["columns"] = c.columns;
  d["strided"] = c.strided;
  d["elements"] = c.elements;
  d["plane"] = c.plane;
  d["running_stats"] = c.running_stats;
  d["cudnn"] = c.cudnn;
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
  double* fields[] = {&c.conv.n, &c.conv.c, &c.conv.h, &c.conv.w,      &c.conv.k,     &c.conv.r,
                      &c.conv.s, &c.conv.p, &c.conv.q, &c.conv.groups, &c.conv.stride};
  for (size_t i = 0; i < 11; ++i) *fields[i] = v[i].cast<double>();
  c.channels = d.contains("channels") ? d["channels"].cast<double>() : 0.0;
  c.backward = d.contains("backward") && d["backward"].cast<bool>();
  c.columns = d.contains("columns") ? d["columns"].cast<double>() : 0.0;
  c.strided = d.contains("strided") && d["strided"].cast<bool>();
  c.elements = d.contains("elements") ? d["elements"].cast<double>() : 0.0;
  c.plane = d.contains("plane") ? d["plane"].cast<double>() : 0.0;
  c.running_stats = d.contains("running_stats") && d["running_stats"].cast<bool>();
  c.cudnn = d.contains("cudnn") && d["cudnn"].cast<bool>();
  c.conv.channels_last = d.contains("channels_last") && d["channels_last"].cast<bool>();
  return c;
}

}  // namespace

void bind_cost(py::module_& m) {
  m.def("_current_kernel_params", [](int index) {
    return guarded([&] { return kernel_params_dict(Runtime::get().device(index).cost().kernel_params()); });
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
    guarded(
        [&] { Runtime::get().device(index).ledger().start_trace(static_cast<size_t>(std::max<int64_t>(limit, 0))); });
  });
  m.def("_cost_trace", [](int index) {
    return guarded([&] {
      py::list out;
      Device& device = Runtime::get().device(index);
      for (const TracedOp& op : device.ledger().take_trace()) {
        py::dict d = op_cost_dict(op.cost);
        d["name"] = op.name;
        d["charged_ns"] = op.charged.duration;
        d["peak_compute_ns"] = op.charged.peak_compute_ns;
        d["peak_memory_ns"] = op.charged.peak_memory_ns;
        d["compute_bound"] = op.charged.compute_bound;
        d["demand"] = op.charged.occupancy.demand;
        d["hold_ns"] = op.charged.occupancy.hold_ns;
        // Which rule timed it, under a finer family name (`torch-emugpu explain`).
        const CostRule rule = cost_rule(op.cost, device.cost().gpu());
        d["rule_family"] = rule.family;
        d["rule"] = rule.rule;
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
  m.def("_kernel_params", [](const std::string& gpu) {
    return guarded([&] { return kernel_params_dict(default_kernel_params(Runtime::get().catalog().find(gpu))); });
  });
  // The collective cost model for benchmarks/collective_model.py; a network
  // or algorithm set left as None comes from the configuration (EMUGPU_NET_*, NCCL_ALGO).
  m.def(
      "_collective_time",
      [](const std::string& kind, double bytes, const std::string& gpu, int ranks_per_node, int nodes,
         py::object net_gbps, py::object net_latency_us, py::object algorithms) {
        return guarded([&] {
          const Config c = Runtime::get().config();
          const NetworkSpec net{(net_gbps.is_none() ? c.net_gbps : net_gbps.cast<double>()) * 1e9,
                                net_latency_us.is_none() ? c.net_latency_us : net_latency_us.cast<double>()};
          // The core range-checks the world size; clamping only keeps the product an int.
          const int64_t world = std::clamp<int64_t>(int64_t{ranks_per_node} * nodes, -1, INT32_MAX);
          const Topology t =
              make_topology(Runtime::get().catalog().find(gpu), static_cast<int>(world), ranks_per_node, net);
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
      },
      py::arg("kind"), py::arg("bytes"), py::arg("gpu"), py::arg("ranks_per_node"), py::arg("nodes"),
      py::arg("net_gbps") = py::none(), py::arg("net_latency_us") = py::none(), py::arg("algorithms") = py::none());
}

}  // namespace emugpu
