// Bindings of torch_emugpu._C: the sharing daemon (emugpud) as its clients see it.
#include "backend/runtime.h"
#include "core/share/address.h"
#include "core/share/client.h"

#include "backend/bindings/common.h"

namespace emugpu {

namespace {

py::list gpus_list(const std::vector<share::GpuInfo>& gpus, const std::vector<uint64_t>* used) {
  py::list out;
  for (size_t i = 0; i < gpus.size(); ++i) {
    py::dict g;
    g["index"] = i;
    g["name"] = gpus[i].name;
    g["capacity"] = gpus[i].capacity;
    g["total"] = gpus[i].total;
    g["gpu"] = gpus[i].gpu;  // the physical GPU; an instance's index on it (-1: whole), profile and UUID
    g["instance"] = gpus[i].instance;
    g["mig_profile"] = gpus[i].mig_profile;
    g["uuid"] = gpus[i].uuid;
    if (used != nullptr) g["used"] = used->at(i);
    out.append(g);
  }
  return out;
}

}  // namespace

void bind_daemon(py::module_& m) {
  m.def("_daemon_default_address", [] { return share::default_address(); });
  m.def("_daemon_status", [](const std::string& address) {
    const share::Status s = guarded([&] {
      py::gil_scoped_release no_gil;
      return share::Client::query(address);
    });
    py::dict d;
    d["address"] = share::parse_address(address, "address").text();
    d["sharing"] = s.sharing;
    d["gpus"] = gpus_list(s.gpus, &s.used);
    py::list clients;
    for (const auto& c : s.clients) {
      py::dict p;
      p["client"] = c.id;
      p["pid"] = c.pid;
      p["clock"] = c.clock;
      p["name"] = c.name;
      p["bytes"] = c.bytes;
      p["priority"] = c.priority;
      // Fractions per GPU: how busy its kernels kept it lately, and the share of its speed they got.
      py::list busy, share;
      for (size_t g = 0; g < c.busy_ppm.size(); ++g) {
        busy.append(static_cast<double>(c.busy_ppm[g]) / share::kPpm);
        share.append(static_cast<double>(c.rate_ppm[g]) / share::kPpm);
      }
      p["busy"] = busy;
      p["share"] = share;
      clients.append(p);
    }
    d["processes"] = clients;
    return d;
  });
  // This process's attachment: None when its GPUs are its own.
  m.def("_daemon_attachment", []() -> py::object {
    return guarded([&]() -> py::object {
      const auto& client = Runtime::get().daemon();
      if (!client) return py::none();
      py::dict d;
      d["address"] = client->address();
      d["client"] = client->welcome().client;
      d["gpus"] = gpus_list(client->welcome().gpus, nullptr);
      d["sharing"] = client->welcome().sharing;
      return d;
    });
  });
}

}  // namespace emugpu
