// Bindings of torch_emugpu._C: the device caching allocator, pinned host memory and storages shared between processes.
#include <torch/csrc/DynamicTypes.h>

#include "backend/allocator.h"
#include "backend/deferred_copy.h"
#include "backend/distributed/collective.h"
#include "backend/host_allocator.h"
#include "backend/runtime.h"
#include "core/host_allocator.h"

#include "backend/bindings/common.h"

namespace emugpu {

namespace {

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

}  // namespace

void bind_memory(py::module_& m) {
  m.def("_deferred_copy_stats", [] {
    const DeferredCopyStats s = deferred_copies().stats();
    py::dict d;
    d["recorded"] = s.recorded;
    d["done"] = s.done;
    d["dropped"] = s.dropped;
    d["pending"] = s.pending;
    return d;
  });
  m.def("_reset_deferred_copy_stats", [] { deferred_copies().reset_stats(); });
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
  m.def("_reset_peak_memory_stats",
        [](int index) { guarded([&] { Runtime::get().device(index).allocator().reset_peak_stats(); }); });
  m.def("_reset_accumulated_memory_stats",
        [](int index) { guarded([&] { Runtime::get().device(index).allocator().reset_accumulated_stats(); }); });
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
  m.def("_empty_cache", [] {
    guarded([&] {
      device_allocator().emptyCache({0, 0});
      invalidate_shape_caches();  // host memory too: a sweep over many shapes leaves many entries
    });
  });
  m.def("_mem_get_info", [](int index) {
    return guarded([&] { return device_allocator().getMemoryInfo(static_cast<c10::DeviceIndex>(index)); });
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
      const c10::Storage storage =
          open_shared_storage({fd, map_offset, map_length, data_offset, nbytes, device, materialized, ready_ns});
      return py::reinterpret_steal<py::object>(torch::createPyObject(storage));
    });
  });
  m.def("_refresh_shared_storage", [](py::handle storage, bool materialized, int64_t ready_ns) {
    guarded([&] { refresh_shared_storage(torch::createStorage(storage.ptr()), materialized, ready_ns); });
  });
}

}  // namespace emugpu
