#include "backend/collective.h"

#include "backend/allocator.h"
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

void stream_wait_current(int device, TimeNs t) {
  Runtime::get().device(device).stream_wait(current_stream_id(device), t);
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
  return host_alias(t);
}

bool tensor_materialized(const at::Tensor& t) { return is_materialized(t.storage()); }

void set_tensor_materialized(const at::Tensor& t, bool value) { set_materialized(t.storage(), value); }

}  // namespace emugpu
