#include "backend/distributed/collective.h"

#include "backend/allocator.h"
#include "backend/gil.h"
#include "backend/ops/common.h"
#include "backend/runtime.h"
#include "core/collective_cost.h"

namespace emugpu {

TimeNs collective_begin(int device) {
  return Runtime::get().device(device).collective_start(current_stream_id(device));
}

TimeNs collective_end(int device, TimeNs start, TimeNs duration) {
  return Runtime::get().device(device).collective_launch(current_stream_id(device), start, duration);
}

TimeNs collective_duration(int device, const std::string& kind, double bytes, int world, int ranks_per_node) {
  const Config c = Runtime::get().config();
  const NetworkSpec net{c.net_gbps * 1e9, c.net_latency_us};
  const Topology topo = make_topology(Runtime::get().device(device).gpu(), world, ranks_per_node, net);
  return collective_time(parse_collective(kind), bytes, topo, parse_algorithms(c.nccl_algo)).duration;
}

at::Tensor collective_host_view(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1,
              "emu collective: expected an emugpu tensor, got one on ", t.device());
  await_collective_writes(t);
  return host_alias(t);
}

bool tensor_materialized(const at::Tensor& t) {
  await_collective_writes(t);
  return is_materialized(t.storage());
}

void set_tensor_materialized(const at::Tensor& t, bool value) {
  await_collective_writes(t);
  set_materialized(t.storage(), value);
}

PendingWrites& pending_writes() {
  // Never destroyed: runner threads may still end calls during exit.
  static auto* writes = new PendingWrites();
  return *writes;
}

void await_collective_writes(const c10::Storage& storage) {
  if (pending_writes().empty() || !storage) return;
  const void* key = storage.unsafeGetStorageImpl();
  without_gil([&] { pending_writes().await(key); });
}

void await_collective_writes(const at::Tensor& t) {
  if (pending_writes().empty() || !t.defined() || !t.has_storage()) return;
  await_collective_writes(t.storage());
}

}  // namespace emugpu
