// The few real emugpu kernels: allocation, copies (which move real bytes),
// reading scalars, and ops routed explicitly into the shape-only fallback.
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention.h>
#include <ATen/ops/scaled_dot_product_attention_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/SymIntArrayRef.h>
#include <c10/util/strides.h>

#include "backend/allocator.h"
#include "backend/deferred_copy.h"
#include "backend/distributed/collective.h"
#include "backend/ops/common.h"
#include "backend/ops/sdp_choice.h"

namespace emugpu {
namespace {

constexpr auto kEmu = c10::DeviceType::PrivateUse1;

c10::DeviceIndex resolve(std::optional<c10::Device> device) {
  if (device && device->has_index()) return device->index();
  return static_cast<c10::DeviceIndex>(current_device());
}

// aten::empty.memory_format: a fresh tensor on the emulated allocator.
at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  const EmulatorCall call(active_virtual_clock(), HostCall::kAllocation);
  const c10::DeviceGuard guard(c10::Device(kEmu, resolve(device)));
  return at::detail::empty_generic(size, &device_allocator(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

// aten::empty_strided: as empty, with explicit strides.
at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const EmulatorCall call(active_virtual_clock(), HostCall::kAllocation);
  const c10::DeviceGuard guard(c10::Device(kEmu, resolve(device)));
  return at::detail::empty_strided_generic(size, stride, &device_allocator(),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

bool is_emu(const at::Tensor& t) { return t.device().type() == kEmu; }

double transfer_bytes(const at::Tensor& t) { return static_cast<double>(t.numel()) * t.element_size(); }

// Timing mode computes only small ops on real bytes: values other ops wrote read back as zeros. Said
// once per process, since losses, metrics and checkpoints all read back.
void warn_placeholder_read() {
  TORCH_WARN_ONCE(
      "emugpu: reading back values that timing mode never computed; they are placeholders and read as "
      "zeros (printed losses and metrics, saved checkpoints). Only bytes copied to the device, and small ops "
      "(at most 64 KiB per tensor) on them, are real. "
      "Set EMUGPU_MODE=compute (or torch_emugpu.configure(mode='compute')) for real values.");
}

bool holds_values(const at::Tensor& t) { return Runtime::get().compute_mode() || is_materialized(t.storage()); }

// What a tensor reads as on the host: its bytes where they are real, else
// the zero placeholders (README: "computed values are placeholders").
at::Tensor host_values(const at::Tensor& t) {
  if (holds_values(t)) return host_read_alias(t);
  if (t.numel() > 0) warn_placeholder_read();
  return at::zeros(t.sizes(), t.options().device(c10::kCPU));
}

// aten::_copy_from: every copy that involves an emugpu tensor.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const EmulatorCall call(active_virtual_clock(), launched_op());
  for (const at::Tensor* t : {&self, &dst}) {
    if (is_emu(*t)) await_collective_writes(*t);
  }
  // copy_ broadcasts its source (torchvision's affine grids copy [W] into [1, H, W]).
  const bool expandable = at::is_expandable_to(self.sizes(), dst.sizes());
  TORCH_CHECK(expandable || self.numel() == dst.numel(), "emugpu copy: expected a source broadcastable to the ",
              "destination's sizes ", dst.sizes(), " (or as many elements), got ", self.sizes());
  at::Tensor src = expandable ? self.expand(dst.sizes()) : self.reshape(dst.sizes());
  if (dst.numel() == 0) return dst;
  return translate_errors([&]() -> at::Tensor {
    if (!is_emu(self) && is_emu(dst)) {  // host -> device
      const int d = dst.device().index();
      auto& dev = Runtime::get().device(d);
      const bool pinned = self.is_pinned();
      const TimeNs cost = dev.cost().transfer(transfer_bytes(dst), pinned);
      move_bytes(host_alias(dst), src.device().is_cpu() ? src : src.cpu());
      set_materialized(dst.storage(), true);
      // Pageable copies are staged and synchronous, as cudaMemcpy's are.
      if (pinned && non_blocking)
        charge(d, Engine::kHostToDevice, cost);
      else
        charge_and_wait(d, Engine::kHostToDevice, cost);
      return dst;
    }
    if (is_emu(self) && !is_emu(dst)) {  // device -> host
      const int d = self.device().index();
      auto& dev = Runtime::get().device(d);
      const TimeNs cost = dev.cost().transfer(transfer_bytes(dst), dst.is_pinned());
      at::Tensor host_dst = dst.device().is_cpu() ? dst : at::empty_like(dst, dst.options().device(c10::kCPU));
      if (holds_values(self)) {
        move_bytes(host_dst, host_read_alias(src));
      } else {
        warn_placeholder_read();
        host_dst.zero_();
      }
      if (!host_dst.is_same(dst)) dst.copy_(host_dst);
      if (non_blocking && dst.is_pinned())
        charge(d, Engine::kDeviceToHost, cost);
      else
        charge_and_wait(d, Engine::kDeviceToHost, cost);
      return dst;
    }
    // device -> device
    const int d = dst.device().index();
    auto& dev = Runtime::get().device(d);
    const double bytes = transfer_bytes(dst);
    const int s = self.device().index();
    if (s == d) {
      // A copy between layouts (a permuted tensor's .contiguous()) is not
      // vectorised: PyTorch's strided kernel, at a rate of elements.
      OpCost copy{0, 2 * bytes, DType::kFloat32, OpFamily::kCopy};
      copy.strided = self.numel() > 1 && (self.sizes() != dst.sizes() || self.strides() != dst.strides() ||
                                          !dst.is_non_overlapping_and_dense());
      copy.elements = static_cast<double>(dst.numel());
      const TimeNs duration = dev.cost().kernel(copy);
      const double peak_ns = 2 * bytes / dev.gpu().memory_bandwidth * 1e9;
      dev.ledger().record(copy, {duration, 0, peak_ns, false}, "aten::copy_");
      charge(d, Engine::kCompute, duration,
             {byte_fill(2 * bytes, dev.gpu().sm_count),
              static_cast<double>(duration) / byte_waves(2 * bytes, dev.gpu().sm_count)});
    } else {
      // Peer to peer over NVLink, else PCIe. As PyTorch orders CUDA peer
      // copies, the copy waits for the source's stream, and the source's
      // stream then waits for the copy.
      const auto& gpu = dev.gpu();
      const double link = gpu.nvlink_bandwidth > 0 ? gpu.nvlink_bandwidth : gpu.pcie_bandwidth();
      const TimeNs duration = dev.cost().params().copy_latency_ns + static_cast<TimeNs>(bytes / link * 1e9);
      auto& source = Runtime::get().device(s);
      dev.stream_wait(current_stream_id(d), source.stream_ready_pending(current_stream_id(s)));
      const TimeNs end = charge(d, Engine::kCompute, duration);
      if (end == Device::kNotYet) {  // held behind a collective (core/device.h): known later
        source.stream_wait(current_stream_id(s), dev.stream_ready_pending(current_stream_id(d)));
      } else {
        source.stream_wait(current_stream_id(s), end);
      }
    }
    // Real bytes are copied when someone needs them (backend/deferred_copy.h),
    // as a GPU copies them on the device at no cost to its host.
    const bool real = holds_values(self);
    if (real && !defer_copy(dst, src)) move_bytes(host_alias(dst), host_read_alias(src));
    set_materialized(dst.storage(), real);
    return dst;
  });
}

// aten::_copy_from_and_resize: resize `dst` to `self`, then copy.
at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  const EmulatorCall call(active_virtual_clock(), launched_op());
  at::native::resize_output(dst, self.sizes());
  return copy_from(self, dst, false);
}

// aten::_local_scalar_dense (.item()): a sync point; placeholders read as 0.
c10::Scalar local_scalar_dense(const at::Tensor& self) {
  const EmulatorCall call(active_virtual_clock(), launched_op());
  await_collective_writes(self);
  return translate_errors([&]() -> c10::Scalar {
    const int d = self.device().index();
    charge_and_wait(d, Engine::kDeviceToHost, Runtime::get().device(d).cost().transfer(self.element_size(), false));
    return host_values(self).item();
  });
}

// aten::set_.source_Storage_storage_offset: `self` views `source` with the
// given geometry, growing the storage if the geometry needs more bytes.
at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt storage_offset,
                               c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device(), "emugpu set_: expected a storage on ", self.device(), ", got one on ",
              source.device());
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  c10::DimVector strides =
      stride.empty() ? c10::contiguous_strides(sizes) : c10::DimVector(C10_AS_INTARRAYREF_SLOW(stride));
  const int64_t offset = storage_offset.expect_int();
  TORCH_CHECK(offset >= 0, "emugpu set_: expected a storage offset >= 0, got ", offset);
  const size_t needed =
      at::detail::computeStorageNbytes(sizes, strides, self.dtype().itemsize(), static_cast<size_t>(offset));
  if (source.nbytes() < needed) resize_storage(source, needed);
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(source));
  self.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return self;
}

// aten::set_.source_Storage: the whole storage as a 1-d tensor.
at::Tensor& set_storage(at::Tensor& self, at::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, c10::SymIntArrayRef({c10::SymInt(numel)}), {});
}

// aten::set_.source_Tensor: `self` becomes a view of `source`.
at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return set_storage_offset(self, source.storage(), source.sym_storage_offset(), source.sym_sizes(),
                            source.sym_strides());
}

// aten::set_: an empty tensor on a fresh, empty storage.
at::Tensor& set_empty(at::Tensor& self) {
  at::Storage empty(c10::Storage::use_byte_size_t(), 0, device_allocator().allocate_on(self.device().index(), 0),
                    &device_allocator(), /*resizable=*/true);
  return set_storage_offset(self, std::move(empty), 0, c10::SymIntArrayRef({c10::SymInt(0)}), {});
}

// aten::equal: a sync point, like every op that returns a host value.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  const EmulatorCall call(active_virtual_clock(), launched_op());
  TORCH_CHECK(self.device() == other.device(), "emugpu equal: expected both tensors on ", self.device(), ", got ",
              other.device());
  await_collective_writes(self);
  await_collective_writes(other);
  return translate_errors([&] {
    const int d = self.device().index();
    auto& dev = Runtime::get().device(d);
    const double bytes = transfer_bytes(self) + transfer_bytes(other);
    const KernelCost compare = dev.cost().kernel_cost({0, bytes, DType::kFloat32});
    charge(d, Engine::kCompute, compare.duration, compare.occupancy);
    charge_and_wait(d, Engine::kDeviceToHost, dev.cost().transfer(1, false));
    return self.sizes() == other.sizes() && at::equal(host_values(self), host_values(other));
  });
}

// aten::_fused_sdp_choice: the kernel CUDA would run (sdp_choice.h).
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> /*scale*/, bool enable_gqa) {
  const SdpInputs in{query,     key,       value,     attn_mask.has_value() && attn_mask->defined(),
                     dropout_p, is_causal, enable_gqa};
  const int device = query.device().type() == kEmu ? query.device().index() : current_device();
  const GpuSpec& gpu = translate_errors([&]() -> const GpuSpec& { return Runtime::get().device(device).gpu(); });
  return choose_sdp_backend(in, gpu, Runtime::get().compute_mode());
}

// aten::scaled_dot_product_attention above autograd: PyTorch's composite
// runs CUDA's flash op on CUDA only, and its CPU variant (which DTensor has
// no sharding rule for) on every other device; emugpu runs CUDA's. The other
// choices take the composite's own path, which asks fused_sdp_choice.
at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                                        std::optional<double> scale, bool enable_gqa) {
  const bool flash = !(attn_mask.has_value() && attn_mask->defined()) && query.dim() == 4 &&
                     fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) ==
                         static_cast<int64_t>(at::SDPBackend::flash_attention);
  if (flash) {
    return std::get<0>(at::_scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                               /*return_debug_mask=*/false, scale));
  }
  return at::native::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale,
                                                  enable_gqa);
}

}  // namespace
}  // namespace emugpu

namespace at::native {
// scaled_dot_product_attention asks this per-device stub which kernel to run.
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &emugpu::fused_sdp_choice)
}  // namespace at::native

namespace emugpu {
namespace {

// aten::record_stream: emugpu's allocator has nothing to defer.
void record_stream(at::Tensor&, c10::Stream) {}

// aten::_has_compatible_shallow_copy_type: `param.data = t` (FSDP2's move to
// the device, Module._apply) needs dense CPU and emugpu tensors to be
// interchangeable, as c10 makes dense CPU and CUDA ones.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  const auto dense = [](c10::DispatchKeySet ks) {
    constexpr auto backends =
        c10::DispatchKeySet({c10::BackendComponent::CPUBit, c10::BackendComponent::PrivateUse1Bit});
    return ks.has_any(c10::DispatchKeySet(c10::DispatchKey::Dense)) && ks.has_any(backends) &&
           !ks.has(c10::DispatchKey::Python);
  };
  return dense(self.key_set()) && dense(from.key_set());
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("scaled_dot_product_attention", TORCH_FN(scaled_dot_product_attention));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("equal", TORCH_FN(equal));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  // Composite ops whose decomposition picks a backend by device type: send
  // them whole to the fallback, which has their Meta shape rule.
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
  // Their generic kernels normalise through native_batch_norm on a reshaped
  // input, which would charge (and report) a layer norm as a batch norm.
  m.impl("native_layer_norm", torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
  m.impl("native_group_norm", torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
  // Losses whose generic functional kernel calls their out= variant with a
  // 0-d result, which PyTorch's own CPU out kernel first resizes to the
  // elementwise shape (a deprecation warning per call in compute mode): the
  // fallback runs the functional op instead.
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
  m.impl("smooth_l1_loss", torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
  // The fused attention kernel PyTorch leaves to out-of-tree backends.
  m.impl("_scaled_dot_product_fused_attention_overrideable",
         torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward",
         torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
}

namespace {

// torch.optim's foreach paths (the default for every device that supports
// them, as emugpu does) run one fused multi-tensor kernel per call on CUDA.
// Their generic kernel loops over the tensors, one aten op each, which would
// charge a launch per tensor: the fallback takes the whole call instead, one
// kernel timed by every tensor's bytes.
struct ForeachRegistrations {
  std::unique_ptr<torch::Library> library;
  ForeachRegistrations()
      : library(std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                                 __LINE__)) {
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::_foreach_", 0) != 0) continue;
      std::string qualified = name.name.substr(6);
      if (!name.overload_name.empty()) qualified += "." + name.overload_name;
      library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>());
    }
  }
};

const ForeachRegistrations foreach_registrations;

}  // namespace

}  // namespace emugpu
