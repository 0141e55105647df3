// Helpers shared by the emugpu op implementations.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "backend/runtime.h"

namespace emugpu {

// The shape-only (timing) / host-computing (compute) boxed kernel that runs
// every aten op without an emugpu-specific kernel.
void emugpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack);
// A kernel PyTorch has for CUDA only: in timing mode the boxed fallback (its
// shapes from a Meta kernel), in compute mode `kCompute`, which makes its
// results of device ops from the op's arguments.
using DeviceOpsCompute = std::vector<c10::IValue> (*)(const std::vector<c10::IValue>&);
template <DeviceOpsCompute kCompute>
void fallback_or_device_ops(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (!Runtime::get().compute_mode()) {
    emugpu_fallback(op, keys, stack);
    return;
  }
  const size_t num_args = op.schema().arguments().size();
  const std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  std::vector<c10::IValue> results = kCompute(args);
  torch::jit::drop(*stack, static_cast<int64_t>(num_args));
  for (auto& r : results) stack->push_back(std::move(r));
}
// await_collective_writes (backend/distributed/collective.h) for every emugpu tensor in `args`.
void await_collective_writes(const std::vector<c10::IValue>& args);

// A tensor over the same bytes as `t`, typed as a CPU tensor (device memory
// is host memory); used to move real bytes and to compute in compute mode.
// The caller may write it: copies still deferred that read its storage are
// done first, then those into it (backend/deferred_copy.h).
at::Tensor host_alias(const at::Tensor& t);
// The same, for reading only: the copies deferred into its storage are done.
at::Tensor host_read_alias(const at::Tensor& t);
// Copies bytes between tensors that are both host-addressable.
void move_bytes(const at::Tensor& dst_host_view, const at::Tensor& src_host_view);
// A fresh emugpu tensor on `device` with exactly `like`'s sizes, strides,
// storage offset, storage size and dtype.
at::Tensor new_device_tensor(int device, const at::Tensor& like);

// Forgets cached shape results (their durations depend on the configuration) and frees them.
void invalidate_shape_caches();
// (hits, misses) of the shape caches since the process started.
std::pair<int64_t, int64_t> shape_cache_stats();
// Entries the process's shape cache holds now.
size_t shape_cache_entries();

// Charges `estimate` to the current stream of `device` on `engine`.
// `occupancy`: what compute work holds of the GPU (KernelCost::occupancy; MPS sharing).
TimeNs charge(int device, Engine engine, TimeNs estimate, Occupancy occupancy = {});
// The same, for work the host waits for (a sync point: see Device::launch_and_wait).
TimeNs charge_and_wait(int device, Engine engine, TimeNs estimate);

}  // namespace emugpu
