// Bindings of backend `emu` (torch_emugpu/distributed): the process group
// c10d creates, the helpers its set-up uses (tested on their own), and the
// timeline side of collectives that other features read.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend/bindings/common.h"
#include "backend/distributed/collective.h"
#include "backend/distributed/process_group.h"
#include "backend/distributed/setup.h"
#include "core/exchange/tcp_transport.h"

namespace emugpu {

void bind_distributed(py::module_& m) {
  py::class_<EmuProcessGroup, c10d::Backend, c10::intrusive_ptr<EmuProcessGroup>>(m, "_EmuProcessGroup", R"(
Backend `emu` of one process group (backend/distributed/process_group.h);
c10d makes one through torch_emugpu.distributed's registration.)")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s) {
             return guarded([&] {
               const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3));
               py::gil_scoped_release no_gil;  // the set-up waits for the other ranks
               return c10::make_intrusive<EmuProcessGroup>(store, rank, size, timeout);
             });
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"))
      .def_property_readonly("payload_bytes_moved", &EmuProcessGroup::payload_bytes_moved,
                             "Bytes of this rank's tensors that collectives carried (the data rule's).")
      .def_property_readonly("transport", &EmuProcessGroup::transport,
                             "'shm' or 'tcp': the transport of the per-collective words.")
      .def_property_readonly("ranks_per_node", &EmuProcessGroup::ranks_per_node,
                             "Ranks per node in the collective cost model's topology.")
      .def_property_readonly("nodes", &EmuProcessGroup::nodes, "Nodes in the collective cost model's topology.")
      .def_property_readonly("clock_offset_ns", &EmuProcessGroup::clock_offset,
                             "This rank's steady clock minus rank 0's, in nanoseconds.")
      .def("calls", &EmuProcessGroup::calls, "How often c10d handed this group each collective, by method name.")
      .def(
          "drain", [](EmuProcessGroup& g) { guarded([&] { g.drain(); }); },
          "Waits until every collective launched so far is placed on the timeline.")
      .def(
          "gather_words",
          [](EmuProcessGroup& g, int count) {
            guarded([&] {
              py::gil_scoped_release no_gil;
              g.gather_words(count);
            });
          },
          "An all-gather of `count` zero words and nothing else (the benchmarks' baseline).")
      // new_group's call on ranks outside the new group (NCCL's split needs
      // every rank): each group's exchange is its own, so they take no part.
      .def(
          "perform_nocolor_split", [](EmuProcessGroup&, const py::object&) {},
          "Ranks outside a new group take no part in its set-up.");
  m.def(
      "_drain_all_groups", [] { guarded([] { drain_all_groups(); }); },
      "Places every deferred collective of this process (at exit, before the interpreter ends).");
  // The set-up's pieces, for tests of what several nodes do in one process.
  m.def(
      "_group_topology",
      [](const std::vector<int64_t>& nodes, int size) {
        return guarded([&] {
          const GroupTopology t = topology(nodes, size);
          return py::make_tuple(t.ranks_per_node, t.nodes);
        });
      },
      "(ranks per node, nodes) from every rank's node key (-1: unknown).");
  m.def(
      "_fresh_namespace",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s) {
        return guarded([&] {
          py::gil_scoped_release no_gil;
          return fresh_namespace(*store, rank, size, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
        });
      },
      "A store key prefix that no earlier instance of this group used, the same on every rank.");
  m.def(
      "_listen_address",
      [](const c10::intrusive_ptr<c10d::Store>& store) { return guarded([&] { return listen_address(store); }); },
      "The address the TCP transport listens on: the one facing the group's TCPStore.");
  m.def("_address_towards", &TcpTransport::address_towards,
        "The local address from which this machine reaches `host` ('' if it cannot tell).");
  // The timeline side of collectives, read by tests and the data path.
  m.def(
      "_collective_duration",
      [](int index, const std::string& kind, double bytes, int world, int ranks_per_node) {
        return guarded([&] { return collective_duration(index, kind, bytes, world, ranks_per_node); });
      },
      "Modelled duration (ns) of a collective on this device's GPU and the configured network.");
  m.def(
      "_host_view", [](const at::Tensor& t) { return guarded([&] { return collective_host_view(t); }); },
      "A CPU tensor over an emugpu tensor's bytes, charged nothing.");
  m.def(
      "_is_materialized", [](const at::Tensor& t) { return guarded([&] { return tensor_materialized(t); }); },
      "Whether the tensor's storage holds real bytes.");
  m.def(
      "_set_materialized", [](const at::Tensor& t, bool value) { guarded([&] { set_tensor_materialized(t, value); }); },
      "Marks the tensor's storage as holding real bytes (or placeholders).");
}

}  // namespace emugpu
