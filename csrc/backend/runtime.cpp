#include "backend/runtime.h"

#include <c10/util/Exception.h>

#include <array>

namespace emugpu {

DeviceState::DeviceState(int index_, const GpuSpec& gpu_)
    : index(index_),
      gpu(gpu_),
      allocator(index_, gpu_.name,
                gpu_.memory_bytes > kCudaContextBytes ? gpu_.memory_bytes - kCudaContextBytes
                                                      : gpu_.memory_bytes,
                gpu_.memory_bytes),
      cost(gpu_) {}

Runtime& Runtime::get() {
  static Runtime* runtime = new Runtime();  // leaked: tensors may outlive static destruction
  return *runtime;
}

void Runtime::configure(const Config& config) {
  EMUGPU_CHECK(config.device_count >= 1 && config.device_count <= kMaxDevices, kValue,
               "device_count must be between 1 and ", kMaxDevices, ", got ", config.device_count);
  for (const auto& d : devices_) {
    const auto in_use = d->allocator.stats().allocated_bytes[kAggregate].current;
    EMUGPU_CHECK(in_use == 0, kRuntime, "cannot reconfigure torch-emugpu: emulated device ",
                 d->index, " still holds ", format_bytes(static_cast<double>(in_use)),
                 " of tensors; call configure() before creating emugpu tensors");
  }
  auto catalog = std::make_unique<Catalog>(Catalog::from_file(config.catalog_path));
  const GpuSpec& gpu = catalog->find(config.gpu);
  std::vector<std::unique_ptr<DeviceState>> devices;
  for (int i = 0; i < config.device_count; ++i) {
    devices.push_back(std::make_unique<DeviceState>(i, gpu));
  }
  // Old device states are leaked on purpose: guards on other threads may
  // still hold references, and they own no memory (nothing is allocated).
  for (auto& d : devices_) d.release();
  catalog_.release();
  catalog_ = std::move(catalog);
  devices_ = std::move(devices);
  config_ = config;
  mode_.store(config.mode);
}

DeviceState& Runtime::device(int index) {
  if (devices_.empty() && lazy_init_) {
    std::lock_guard<std::mutex> lock(lazy_init_mutex_);
    if (devices_.empty()) lazy_init_();
  }
  EMUGPU_CHECK(!devices_.empty(), kRuntime,
               "torch-emugpu is not configured; call torch_emugpu.configure() first");
  EMUGPU_CHECK(index >= 0 && index < static_cast<int>(devices_.size()), kIndex,
               "emugpu device index out of range: expected 0 <= index < ", devices_.size(),
               ", got ", index, "; set EMUGPU_DEVICE_COUNT for more devices");
  return *devices_[index];
}

namespace {
thread_local int tls_device = 0;
thread_local std::array<int64_t, kMaxDevices> tls_streams{};
}  // namespace

int current_device() { return tls_device; }

void set_current_device(int index) {
  Runtime::get().device(index);  // range check
  tls_device = index;
}

int64_t current_stream_id(int device) { return tls_streams[device]; }

void set_current_stream_id(int device, int64_t stream) { tls_streams[device] = stream; }

void rethrow_as_c10(const Error& error) {
  switch (error.kind()) {
    case ErrorKind::kValue: TORCH_CHECK_VALUE(false, error.what());
    case ErrorKind::kIndex: TORCH_CHECK_INDEX(false, error.what());
    case ErrorKind::kOutOfMemory: TORCH_CHECK_WITH(OutOfMemoryError, false, error.what());
    case ErrorKind::kNotImplemented: TORCH_CHECK_NOT_IMPLEMENTED(false, error.what());
    case ErrorKind::kRuntime: break;
  }
  TORCH_CHECK(false, error.what());
}

}  // namespace emugpu
