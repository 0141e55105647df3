// at::PrivateUse1HooksInterface for emugpu (its generators are generator.h's).
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include "backend/allocator.h"
#include "backend/generator.h"
#include "backend/host_allocator.h"
#include "backend/runtime.h"

namespace emugpu {
namespace {

struct EmuHooks final : public at::PrivateUse1HooksInterface {
  // The extension is built in, so always true.
  bool isBuilt() const override { return true; }

  // Emulated devices are always available once configured.
  bool isAvailable() const override { return Runtime::get().device_count_or_default() > 0; }

  // One lazily created, process-lifetime generator per device (generator.h).
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }

  // A fresh generator for `device_index` (torch.Generator(device="emugpu")).
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override { return new_generator(device_index); }

  // The emulated device owning `data`; falls back to the current device.
  at::Device getDeviceFromPtr(void* data) const override {
    return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(current_device()));
  }

  // Pinned host memory comes from the mlock-backed caching host allocator.
  bool isPinnedPtr(const void* data) const override { return is_pinned_ptr(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }

  // There is no driver context to create.
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override { return true; }

  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(Runtime::get().device_count_or_default());
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    translate_errors([&] { set_current_device(device); });
  }
  c10::DeviceIndex getCurrentDevice() const override { return static_cast<c10::DeviceIndex>(current_device()); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = getCurrentDevice();
    setCurrentDevice(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override { return exchangeDevice(device); }

  // Storage.resize_() on an emugpu storage.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage(storage, newsize);
  }
};

}  // namespace

void register_hooks() {
  static EmuHooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
}

}  // namespace emugpu
