#include "backend/distributed/process_group.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include "backend/distributed/collectives.h"
#include "backend/distributed/setup.h"
#include "backend/distributed/store_rendezvous.h"
#include "backend/gil.h"
#include "backend/runtime.h"
#include "core/exchange/words.h"

namespace emugpu {

namespace {

// The groups drain_all_groups() places; a group leaves when it is destroyed.
std::mutex& registry_mutex() {
  static auto* m = new std::mutex();  // never destroyed: groups may go during exit
  return *m;
}
std::vector<std::weak_ptr<GroupCollectives>>& registry() {
  static auto* groups = new std::vector<std::weak_ptr<GroupCollectives>>();
  return *groups;
}

void register_group(const std::shared_ptr<GroupCollectives>& group) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& groups = registry();
  groups.erase(std::remove_if(groups.begin(), groups.end(), [](const auto& g) { return g.expired(); }), groups.end());
  groups.push_back(group);
  Runtime::get().set_drain_hook(&drain_all_groups);
}

}  // namespace

void drain_all_groups() {
  std::vector<std::shared_ptr<GroupCollectives>> live;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (const auto& g : registry()) {
      if (auto group = g.lock()) live.push_back(std::move(group));
    }
  }
  without_gil([&] {
    for (const auto& group : live) group->drain();
  });
}

EmuProcessGroup::EmuProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size), timeout_(timeout) {
  // Before any rendezvous, so every rank raises at once instead of waiting for the others.
  check_layout(size);
  const std::chrono::nanoseconds wait = timeout;
  // Fresh keys per group instance: torchrun keeps its store across restarts.
  auto base = c10::make_intrusive<c10d::PrefixStore>("emu_exchange/", store);
  const std::string name = fresh_namespace(*base, rank, size, timeout);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name + "/", base);
  {
    StoreRendezvous rendezvous(prefixed);
    // The namespace is random hex: its first 64 bits tell this instance's connections apart.
    TcpTransport::Options options{listen_address(store), "tcp/", std::stoull(name.substr(0, 16), nullptr, 16), wait};
    try {
      tcp_ = std::make_shared<TcpTransport>(rendezvous, rank, size, std::move(options));
    } catch (const Error& e) {
      C10_THROW_ERROR(DistBackendError, "emu backend: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                            ": process group set-up failed: another rank exited or did not arrive "
                                            "within the process group's timeout. Check the other ranks' output for "
                                            "their error. Transport said: " +
                                            e.what());
    }
  }
  auto shm_store = c10::make_intrusive<c10d::PrefixStore>("shm/", prefixed);
  std::shared_ptr<ShmExchange> shm = shared_memory(*shm_store, rank, size, *tcp_, wait);
  words_ = shm ? std::static_pointer_cast<Transport>(shm) : std::static_pointer_cast<Transport>(tcp_);
  // Virtual clocks start equal in every process (runtime.h): nothing to measure.
  Runtime::get().ensure_configured();
  const ClockKind kind = Runtime::get().clock_kind();
  const std::vector<int64_t> keys = gather_setup_words(
      *words_, {node_key(), kind == ClockKind::kVirtual ? 0 : clock_key(), static_cast<int64_t>(kind)}, wait,
      "process group set-up");
  std::vector<int64_t> nodes;
  std::vector<int64_t> clocks;
  for (int r = 0; r < size; ++r) {
    nodes.push_back(keys[static_cast<size_t>(3 * r)]);
    clocks.push_back(keys[static_cast<size_t>(3 * r + 1)]);
    const auto theirs = static_cast<ClockKind>(keys[static_cast<size_t>(3 * r + 2)]);
    TORCH_CHECK_VALUE(theirs == kind, "emu backend: rank ", rank, " runs the ", clock_kind_name(kind),
                      " clock but rank ", r, " the ", clock_kind_name(theirs),
                      " one; every rank of a group must run the same clock: set EMUGPU_CLOCK alike for all ranks");
  }
  const GroupTopology topo = topology(nodes, size);
  const TimeNs offset = align_clocks(*tcp_, *words_, clocks, rank, wait);
  group_ =
      std::make_shared<GroupCollectives>(GroupSpec{rank, size, topo.ranks_per_node, offset, wait, kDataThresholdBytes},
                                         words_, tcp_, c10::make_intrusive<c10d::PrefixStore>("reports/", prefixed));
  p2p_ = std::make_unique<PointToPoint>(group_);
  register_group(group_);
}

EmuProcessGroup::~EmuProcessGroup() {
  // The runner must not outlive what its calls use; their errors were reported or are dropped.
  try {
    drain();
  } catch (...) {
  }
}

c10::intrusive_ptr<c10d::Backend::Options> EmuProcessGroup::getBackendOptions() {
  return c10::make_intrusive<Options>(kName, timeout_);
}

c10::intrusive_ptr<c10d::Backend> EmuProcessGroup::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                         const std::vector<int>& ranks,
                                                         const c10::intrusive_ptr<Options>& opts) {
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  const auto timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_;
  return c10::make_intrusive<EmuProcessGroup>(store, static_cast<int>(it - ranks.begin()),
                                              static_cast<int>(ranks.size()), timeout);
}

void EmuProcessGroup::shutdown() {
  try {
    drain();
  } catch (...) {
  }
}

void EmuProcessGroup::drain() {
  without_gil([&] { group_->drain(); });
}

void EmuProcessGroup::gather_words(int count) {
  (void)gather_setup_words(*words_, std::vector<int64_t>(static_cast<size_t>(count), 0), group_->spec().timeout,
                           "gather_words");
}

EmulatorCall EmuProcessGroup::count(const char* method) {
  {
    std::lock_guard<std::mutex> lock(calls_mutex_);
    ++calls_[method];
  }
  return EmulatorCall(active_virtual_clock());
}

std::map<std::string, int64_t> EmuProcessGroup::calls() const {
  std::lock_guard<std::mutex> lock(calls_mutex_);
  return calls_;
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  const EmulatorCall call = count("broadcast");
  return emugpu::broadcast(*group_, tensors, static_cast<int>(opts.rootRank));
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  const EmulatorCall call = count("allreduce");
  return emugpu::all_reduce(*group_, "all_reduce", tensors, opts.reduceOp.op_);
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  const EmulatorCall call = count("allreduce_coalesced");
  return emugpu::all_reduce(*group_, "all_reduce_coalesced", tensors, opts.reduceOp.op_);
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::allreduce_sparse(std::vector<at::Tensor>&,
                                                                 const c10d::AllreduceOptions&) {
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "emu backend: all_reduce of sparse tensors is not supported yet (implemented: "
                              "every collective, send and recv but recv from any source and sparse all_reduce)");
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  const EmulatorCall call = count("reduce");
  return emugpu::reduce(*group_, tensors, static_cast<int>(opts.rootRank), opts.reduceOp.op_);
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions&) {
  const EmulatorCall call = count("allgather");
  return emugpu::all_gather(*group_, outputs, inputs, "all_gather");
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions&) {
  const EmulatorCall call = count("_allgather_base");
  return emugpu::all_gather_into_tensor(*group_, {output}, {input}, "all_gather_into_tensor");
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions&) {
  const EmulatorCall call = count("allgather_coalesced");
  return emugpu::all_gather(*group_, outputs, inputs, "all_gather_coalesced");
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions&) {
  const EmulatorCall call = count("allgather_into_tensor_coalesced");
  return emugpu::all_gather_into_tensor(*group_, outputs, inputs, "all_gather_into_tensor_coalesced");
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  const EmulatorCall call = count("gather");
  return emugpu::gather(*group_, outputs, inputs, static_cast<int>(opts.rootRank));
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  const EmulatorCall call = count("scatter");
  return emugpu::scatter(*group_, outputs, inputs, static_cast<int>(opts.rootRank));
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  const EmulatorCall call = count("reduce_scatter");
  return emugpu::reduce_scatter(*group_, outputs, inputs, opts.reduceOp.op_);
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  const EmulatorCall call = count("_reduce_scatter_base");
  return emugpu::reduce_scatter_tensor(*group_, {output}, {input}, opts.reduceOp.op_, "reduce_scatter_tensor");
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  const EmulatorCall call = count("reduce_scatter_tensor_coalesced");
  return emugpu::reduce_scatter_tensor(*group_, outputs, inputs, opts.reduceOp.op_, "reduce_scatter_tensor_coalesced");
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions&) {
  const EmulatorCall call = count("alltoall_base");
  return emugpu::all_to_all_single(*group_, output, input, output_splits, input_splits);
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions&) {
  const EmulatorCall call = count("alltoall");
  return emugpu::all_to_all(*group_, outputs, inputs);
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::barrier(const c10d::BarrierOptions& opts) {
  const EmulatorCall call = count("barrier");
  const int device = opts.device_ids.empty() ? current_device() : static_cast<int>(opts.device_ids.front());
  return emugpu::barrier(*group_, device);
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  const EmulatorCall call = count("send");
  return p2p_->send(tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  const EmulatorCall call = count("recv");
  return p2p_->recv(tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::recvAnysource(std::vector<at::Tensor>&, int) {
  TORCH_CHECK_NOT_IMPLEMENTED(false,
                              "emu backend: recv from any source is not supported yet (implemented: every "
                              "collective, send and recv but recv from any source and sparse all_reduce)");
}

void EmuProcessGroup::startCoalescing() {
  const EmulatorCall call(active_virtual_clock());
  p2p_->start_coalescing();
}

c10::intrusive_ptr<c10d::Work> EmuProcessGroup::endCoalescing() {
  const EmulatorCall call(active_virtual_clock());
  return p2p_->end_coalescing();
}

}  // namespace emugpu
