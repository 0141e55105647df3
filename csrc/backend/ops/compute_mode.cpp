#include "backend/ops/compute_mode.h"

#include "backend/allocator.h"
#include "backend/ops/common.h"
#include "backend/ops/tensor_util.h"

namespace emugpu {

at::Tensor store_host_result(int device, const at::Tensor& out, const at::Tensor& value) {
  at::Tensor dst = out;
  if (!value.defined()) return value;
  if (out.sizes() != value.sizes() || out.scalar_type() != value.scalar_type()) {
    dst = new_device_tensor(device, TensorDesc::of(value));
    set_materialized(dst.storage(), true);
  }
  host_alias(dst).copy_(value);
  return dst;
}

void compute_on_host(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                     torch::jit::Stack& host_results, const std::optional<RandomDraw>& draw, int generator_arg) {
  host_results.clear();
  for (const auto& a : args) {
    if (a.isDevice() && a.toDevice().type() == kEmu)
      host_results.emplace_back(c10::Device(c10::kCPU));
    else if (a.isGenerator())
      host_results.emplace_back();  // replaced by the scope below
    else
      host_results.push_back(map_tensors(a, [](const at::Tensor& t) { return is_emu(t) ? host_alias(t) : t; }));
  }
  const HostRandomScope random(draw, generator_arg, host_results);
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &host_results);
}

}  // namespace emugpu
