// Bindings of backend `emu` (torch_emugpu/distributed): the timeline side
// of collectives, the transports of core/exchange and the group's C++ side.
// Calls that may wait release the GIL: the group's runner needs it for
// Python's deferred work and error reports.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstring>

#include "backend/bindings.h"
#include "backend/distributed/collective.h"
#include "backend/distributed/group_collectives.h"
#include "backend/distributed/store_rendezvous.h"
#include "backend/runtime.h"
#include "core/exchange/clock_offset.h"
#include "core/exchange/shm_exchange.h"
#include "core/exchange/tcp_transport.h"

namespace emugpu {

namespace {

at::Tensor byte_row(const void* bytes, size_t length) {
  at::Tensor row = at::empty({static_cast<int64_t>(length)}, at::kByte);
  if (length > 0) std::memcpy(row.data_ptr(), bytes, length);
  return row;
}

void check_bytes(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.is_contiguous(), what, " expected a contiguous CPU tensor, got one on ",
                    t.device(), t.is_contiguous() ? "" : " (not contiguous)");
}

// The exchange's transports (core/exchange/transport.h), one base class.
void bind_transports(py::module_& m) {
  py::class_<Transport, std::shared_ptr<Transport>>(m, "_Transport")
      .def_property_readonly("rank", &Transport::rank)
      .def_property_readonly("size", &Transport::size)
      .def_property_readonly("kind", &Transport::kind)
      .def_property_readonly("capacity", &Transport::bytes_capacity)
      .def_readonly_static("max_words", &Transport::kMaxWords)
      .def("start", [](Transport& self, const std::vector<int64_t>& words, double timeout_s) {
        return guarded([&] {
          py::gil_scoped_release no_gil;
          return self.start_gather(words.data(), static_cast<int>(words.size()), seconds_ns(timeout_s));
        });
      })
      .def("finish", [](Transport& self, uint64_t ticket, int count, double timeout_s) {
        return guarded([&] {
          at::Tensor out = at::empty({self.size(), count}, at::kLong);
          py::gil_scoped_release no_gil;
          self.finish_gather(ticket, out.data_ptr<int64_t>(), count, seconds_ns(timeout_s));
          return out;
        });
      })
      .def("gather_bytes", [](Transport& self, const at::Tensor& mine, double timeout_s) {
        return guarded([&] {
          check_bytes(mine, "gather_bytes");
          std::vector<at::Tensor> rows(static_cast<size_t>(self.size()));
          py::gil_scoped_release no_gil;
          self.gather_bytes(mine.data_ptr(), mine.nbytes(), seconds_ns(timeout_s),
                            [&](int rank, const void* bytes, size_t length) {
                              rows[static_cast<size_t>(rank)] = byte_row(bytes, length);
                            });
          return rows;
        });
      });
  py::class_<ShmExchange, Transport, std::shared_ptr<ShmExchange>>(m, "_ShmExchange")
      .def_static("create", [](const std::string& name, int size, uint64_t token) {
        return guarded([&] { return std::shared_ptr<ShmExchange>(ShmExchange::create(name, size, token)); });
      })
      .def_static("open", [](const std::string& name, int rank, int size, uint64_t token) {
        return guarded([&] { return std::shared_ptr<ShmExchange>(ShmExchange::open(name, rank, size, token)); });
      })
      .def_static("unlink", [](const std::string& name) { ShmExchange::unlink(name); });
  py::class_<TcpTransport, Transport, std::shared_ptr<TcpTransport>>(m, "_TcpTransport")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const std::string& host,
                       const std::string& prefix, uint64_t token, double timeout_s) {
             return guarded([&] {
               StoreRendezvous rendezvous(store);
               TcpTransport::Options options{host, prefix, token, seconds_ns(timeout_s)};
               py::gil_scoped_release no_gil;
               return std::make_shared<TcpTransport>(rendezvous, rank, size, std::move(options));
             });
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("host"), py::arg("prefix"), py::arg("token"),
           py::arg("timeout_s"))
      .def("send", [](TcpTransport& self, int peer, uint64_t channel, const at::Tensor& bytes) {
        guarded([&] {
          check_bytes(bytes, "send");
          self.send(peer, channel, bytes.data_ptr(), bytes.nbytes());
        });
      })
      .def("recv", [](TcpTransport& self, int peer, uint64_t channel, double timeout_s) {
        return guarded([&] {
          std::vector<uint8_t> message;
          {
            py::gil_scoped_release no_gil;
            message = self.recv(peer, channel, seconds_ns(timeout_s));
          }
          return byte_row(message.data(), message.size());
        });
      })
      .def("clock_offset", [](TcpTransport& self, int peer, int rounds, double timeout_s) {
        return guarded([&] {
          py::gil_scoped_release no_gil;
          return measure_clock_offset(self, peer, host_now, rounds, seconds_ns(timeout_s));
        });
      })
      .def("serve_clock", [](TcpTransport& self, int peer, int rounds, double timeout_s) {
        guarded([&] {
          py::gil_scoped_release no_gil;
          serve_clock(self, peer, host_now, rounds, seconds_ns(timeout_s));
        });
      })
      .def_static("address_towards", &TcpTransport::address_towards);
}

}  // namespace

void bind_distributed(py::module_& m) {
  // The timeline side of the torch.distributed backend `emu`
  // (torch_emugpu/distributed/_backend.py); the logic lives in collective.cpp.
  m.def("_collective_begin", [](int index) {
    return guarded([&] {
      py::gil_scoped_release no_gil;  // may force an earlier collective's end
      return collective_begin(index);
    });
  });
  // On the runner's thread, which must not force: what was placed before.
  m.def("_collective_ready", [](int index) {
    return guarded([&] {
      auto& dev = Runtime::get().device(index);
      return dev.collective_start_at(current_stream_id(index), dev.clock().now());
    });
  });
  m.def("_collective_end", [](int index, int64_t start_ns, int64_t duration_ns) {
    return guarded([&] {
      py::gil_scoped_release no_gil;  // a full launch queue blocks
      return collective_end(index, start_ns, duration_ns);
    });
  });
  m.def("_collective_wait_host", [](int index, int64_t t_ns) {
    guarded([&] {
      auto& device = Runtime::get().device(index);
      py::gil_scoped_release no_gil;
      device.wait_until(t_ns);
    });
  });
  m.def("_collective_duration", [](int index, const std::string& kind, double bytes, int world, int ranks_per_node) {
    return guarded([&] { return collective_duration(index, kind, bytes, world, ranks_per_node); });
  });
  m.def("_host_view", [](const at::Tensor& t) { return guarded([&] { return collective_host_view(t); }); });
  m.def("_is_materialized", [](const at::Tensor& t) { return guarded([&] { return tensor_materialized(t); }); });
  m.def("_set_materialized", [](const at::Tensor& t, bool value) {
    guarded([&] { set_tensor_materialized(t, value); });
  });
  bind_transports(m);
  // Backend `emu`'s C++ side of one process group (group_collectives.h).
  // Calls that may wait release the GIL: the group's runner needs it for
  // Python's deferred work and error reports.
  py::class_<OrderedRunner::Ticket, std::shared_ptr<OrderedRunner::Ticket>>(m, "_DeferredTicket")
      .def_property_readonly("done", &OrderedRunner::Ticket::done)
      .def_property_readonly("failed", [](const OrderedRunner::Ticket& t) { return t.error() != nullptr; });
  // A device time the host learns later (core/pending_time.h): a deferred send/recv's end.
  py::class_<PendingTime, std::shared_ptr<PendingTime>>(m, "_PendingTime")
      .def_property_readonly("known", &PendingTime::known);
  // Work.wait() of a deferred send/recv: the current stream waits for its end
  // without blocking the host (the device holds its later work until known).
  m.def("_stream_wait_pending", [](int index, const std::shared_ptr<PendingTime>& end) {
    guarded([&] { Runtime::get().device(index).stream_wait(current_stream_id(index), end); });
  });
  py::class_<GroupCollectives, std::shared_ptr<GroupCollectives>>(m, "_GroupCollectives")
      .def(py::init([](int rank, int size, int ranks_per_node, int64_t clock_offset_ns,
                       std::shared_ptr<Transport> words, std::shared_ptr<Transport> bulk, double timeout_s,
                       int64_t data_threshold, py::function report) {
             auto fn = shared_py_function(std::move(report));
             MismatchReport call = [fn](const std::string& key, const std::string& name, const std::string& extra,
                                        const std::vector<at::Tensor>& tensors, int other) {
               py::gil_scoped_acquire gil;  // held while the result lives
               return call_from_runner(*fn, key, name, extra, tensors, other).cast<std::string>();
             };
             return std::make_shared<GroupCollectives>(
                 GroupSpec{rank, size, ranks_per_node, clock_offset_ns, seconds_ns(timeout_s), data_threshold},
                 std::move(words), std::move(bulk), std::move(call));
           }),
           py::arg("rank"), py::arg("size"), py::arg("ranks_per_node"), py::arg("clock_offset_ns"), py::arg("words"),
           py::arg("bulk"),
           py::arg("timeout_s"), py::arg("data_threshold"), py::arg("report"))
      .def_property_readonly("transport", &GroupCollectives::transport)
      .def_property_readonly("payload_bytes_moved", &GroupCollectives::payload_bytes_moved)
      .def("add_payload_bytes_moved", &GroupCollectives::add_payload_bytes_moved)
      .def("comm_stream", [](GroupCollectives& g, int device) { return guarded([&] { return g.comm_stream(device); }); })
      .def("all_reduce", [](GroupCollectives& g, const std::string& name, const std::vector<at::Tensor>& tensors,
                            c10d::ReduceOp::RedOpType op) -> py::object {
        auto work = guarded([&] {
          py::gil_scoped_release no_gil;
          return g.all_reduce(name, tensors, op);
        });
        if (!work) return py::none();
        return py::cast(work);
      })
      .def("defer", [](GroupCollectives& g, const std::string& name, const std::string& kind, double model_bytes,
                       int64_t largest, int64_t payload, bool real, const std::vector<at::Tensor>& received,
                       const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& signed_,
                       const std::string& extra, int device) {
        return guarded([&] {
          py::gil_scoped_release no_gil;
          return g.defer(name, kind, model_bytes, largest, payload, real, received, outputs, signed_, extra, device);
        });
      })
      // `touches`: tensors whose bytes `place` reads or writes on the runner;
      // the host awaits it before it touches their storages.
      .def(
          "defer_call",
          [](GroupCollectives& g, int device, const std::vector<at::Tensor>& outputs, py::function place,
             const std::vector<at::Tensor>& touches) {
            auto fn = shared_py_function(std::move(place));
            auto [storages, keys] = storage_keys(touches);
            return guarded([&] {
              py::gil_scoped_release no_gil;
              return g.defer_call(
                  device, outputs,
                  [fn, storages = std::move(storages)](TimeNs start) -> TimeNs {
                    py::gil_scoped_acquire gil;
                    return call_from_runner(*fn, start).cast<int64_t>();
                  },
                  std::move(keys));
            });
          },
          py::arg("device"), py::arg("outputs"), py::arg("place"), py::arg("touches") = std::vector<at::Tensor>{})
      .def("submit_timed",
           [](GroupCollectives& g, py::function call, const std::vector<at::Tensor>& touches) {
             auto fn = shared_py_function(std::move(call));
             auto [storages, keys] = storage_keys(touches);
             return g.submit_timed(
                 [fn, storages = std::move(storages)]() -> int64_t {
                   py::gil_scoped_acquire gil;
                   return call_from_runner(*fn).cast<int64_t>();
                 },
                 std::move(keys));
           })
      .def("defer_post",
           [](GroupCollectives& g, int device, py::function post) {
             auto fn = shared_py_function(std::move(post));
             return guarded([&] {
               py::gil_scoped_release no_gil;
               return g.defer_post(device, [fn](TimeNs start) {
                 py::gil_scoped_acquire gil;
                 call_from_runner(*fn, start);
               });
             });
           })
      .def("run_through_post",
           [](GroupCollectives& g, const std::shared_ptr<OrderedRunner::Ticket>& t) {
             return guarded([&] {
               py::gil_scoped_release no_gil;
               return g.run_through_post(t);
             });
           })
      .def("run_through", [](GroupCollectives& g, const std::shared_ptr<OrderedRunner::Ticket>& t) {
        return guarded([&] {
          py::gil_scoped_release no_gil;
          return g.run_through(t);
        });
      })
      .def("drain", [](GroupCollectives& g) {
        guarded([&] {
          py::gil_scoped_release no_gil;
          g.drain();
        });
      });
  // The per-collective words and what every rank reads from them (core/exchange/words.h).
  m.def("_collective_words", [](int64_t start, bool real, bool compute, int64_t signature, int64_t model_bytes,
                                int64_t largest, int64_t payload) {
    std::vector<int64_t> out(CollectiveWords::kCount);
    CollectiveWords{start, real, compute, static_cast<uint64_t>(signature), model_bytes, largest, payload}.encode(
        out.data());
    return out;
  });
  // (start, model bytes, whether bytes move, the first rank that disagrees or -1, the longest payload).
  m.def("_collective_outcome", [](const at::Tensor& words, int64_t signature, int64_t data_threshold) {
    return guarded([&] {
      TORCH_CHECK_VALUE(words.dim() == 2 && words.scalar_type() == at::kLong && words.size(1) == CollectiveWords::kCount,
                        "expected gathered words of shape [ranks, ", static_cast<int>(CollectiveWords::kCount),
                        "] int64, got ", words.sizes(), " ", words.scalar_type());
      const at::Tensor w = words.contiguous();
      const GatheredWords g(std::vector<int64_t>(w.data_ptr<int64_t>(), w.data_ptr<int64_t>() + w.numel()),
                            static_cast<int>(w.size(0)));
      return py::make_tuple(g.start(), g.max(CollectiveWords::kModelBytes), g.moves_bytes(data_threshold),
                            g.first_disagreeing(static_cast<uint64_t>(signature)), g.max(CollectiveWords::kPayload));
    });
  });
  m.def("_collective_signature", [](const std::string& name, const std::string& extra,
                                    const std::vector<at::Tensor>& tensors) {
    return static_cast<int64_t>(collective_signature(name, extra, tensors));
  });
}

}  // namespace emugpu
