// Backend `emu` as c10d sees it: every collective is a barrier plus a sleep
// on the emulated timeline. It is launched on the backend's own stream of
// the device (which first waits for the caller's current stream, as NCCL's
// does), starts on rank r when that stream reaches it (t_r), and ends on
// every rank at max_r t_r plus its modelled duration
// (core/collective_cost.h). The host does not wait for it (except barrier,
// which blocks the host as ProcessGroupNCCL's does); Work::wait() and the
// Work's future make the caller's current stream wait, so compute launched
// in between overlaps it. Ranks exchange t_r through the core's transports
// (core/exchange), set up here from the c10d Store.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend/distributed/group_collectives.h"
#include "backend/distributed/point_to_point.h"
#include "core/virtual_clock.h"

namespace emugpu {

class EmuProcessGroup : public c10d::Backend {
 public:
  static constexpr const char* kName = "emu";

  EmuProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout);
  ~EmuProcessGroup() override;

  const std::string getBackendName() const override { return kName; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  bool supportsSplitting() const override { return true; }
  bool supportsCoalescing() const override { return true; }
  // new_group's subgroups: each has an exchange of its own.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  // destroy_process_group: the deferred collectives finish first (the other
  // ranks need this rank's part of each); their errors reached the host at
  // its waits, or are dropped, as NCCL's are when a group is destroyed.
  void shutdown() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // Waits until every deferred collective launched so far is placed on the
  // timeline (raising the last one's error).
  void drain();
  // Bytes of this rank's tensors that collectives carried (the data rule's), for benchmarks.
  uint64_t payload_bytes_moved() const { return group_->payload_bytes_moved(); }
  const char* transport() const { return group_->transport(); }
  int ranks_per_node() const { return group_->spec().ranks_per_node; }
  int nodes() const { return size_ / group_->spec().ranks_per_node; }
  // This rank's steady clock minus rank 0's (0 where they share one clock).
  TimeNs clock_offset() const { return group_->spec().clock_offset; }
  // An all-gather of `count` zero words and nothing else: the benchmarks' baseline.
  void gather_words(int count);
  // How often c10d handed this group each collective, by c10d's method name.
  std::map<std::string, int64_t> calls() const;

 private:
  // Counts a call and opens its emulator call (virtual_clock.h): c10d's
  // methods are entries into the emulator, as ops are.
  [[nodiscard]] EmulatorCall count(const char* method);

  std::chrono::milliseconds timeout_;
  std::shared_ptr<TcpTransport> tcp_;
  std::shared_ptr<Transport> words_;
  std::shared_ptr<GroupCollectives> group_;
  std::unique_ptr<PointToPoint> p2p_;
  mutable std::mutex calls_mutex_;
  std::map<std::string, int64_t> calls_;
};

// Places every deferred collective of every live group of this process
// (torch.emugpu.synchronize() waits for them, as cudaDeviceSynchronize waits
// for NCCL's streams).
void drain_all_groups();

}  // namespace emugpu
