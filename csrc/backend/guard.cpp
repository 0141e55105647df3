// c10::impl::DeviceGuardImplInterface for emugpu: devices, streams, events.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>

#include "backend/runtime.h"

namespace emugpu {
namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

struct EmuEvent {
  int device = 0;
  TimeNs time = 0;
  bool recorded = false;
};

c10::Stream make_stream(c10::DeviceIndex device, int64_t id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, device), id);
}

struct EmuGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  // The device type this guard serves.
  c10::DeviceType type() const override { return kType; }

  // Sets `d` current and returns the previous current device.
  c10::Device exchangeDevice(c10::Device d) const override {
    const auto old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }

  // The calling thread's current emugpu device.
  c10::Device getDevice() const override {
    return c10::Device(kType, static_cast<c10::DeviceIndex>(current_device()));
  }

  // Makes `d` current for the calling thread; throws on a bad index.
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "emugpu guard: expected an emugpu device, got ", d);
    translate_errors([&] { set_current_device(d.index()); });
  }

  // As setDevice, for destructors: never throws.
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      set_current_device(d.index());
    } catch (...) {
    }
  }

  // The calling thread's current stream on `d`.
  c10::Stream getStream(c10::Device d) const override {
    return make_stream(d.index(), current_stream_id(d.index()));
  }

  // Stream 0 is every device's default stream.
  c10::Stream getDefaultStream(c10::Device d) const override { return make_stream(d.index(), 0); }

  // Pool streams are fresh timeline streams; they cost nothing to create.
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/) const override {
    return getNewStream(d, 0);
  }

  // A new stream on `d` with its own position on the device's timeline.
  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    const auto index = d.index() < 0 ? current_device() : d.index();
    auto& dev = translate_errors([&]() -> DeviceState& { return Runtime::get().device(index); });
    return make_stream(static_cast<c10::DeviceIndex>(index), dev.next_stream.fetch_add(1));
  }

  // Makes `s` current on its device; returns the stream it replaces.
  c10::Stream exchangeStream(c10::Stream s) const override {
    const auto old = getStream(s.device());
    set_current_stream_id(s.device_index(), s.id());
    return old;
  }

  // Number of emulated devices; never throws.
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(Runtime::get().device_count());
  }

  // Records the point the stream's timeline has reached (or now, if idle).
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(),
                "emugpu: event device index ", static_cast<int>(device_index),
                " does not match the stream's device ", stream.device());
    auto*& e = *reinterpret_cast<EmuEvent**>(event);
    if (e == nullptr) e = new EmuEvent;
    auto& dev = translate_errors([&]() -> DeviceState& { return Runtime::get().device(stream.device_index()); });
    e->device = stream.device_index();
    e->time = std::max(dev.timeline.stream_ready(stream.id()), host_now());
    e->recorded = true;
  }

  // Later work on `stream` starts after the event's time.
  void block(void* event, const c10::Stream& stream) const override {
    auto* e = static_cast<EmuEvent*>(event);
    if (e == nullptr || !e->recorded) return;
    Runtime::get().device(stream.device_index()).timeline.stream_wait(stream.id(), e->time);
  }

  // True once host time has passed the event's time (or it was never recorded).
  bool queryEvent(void* event) const override {
    auto* e = static_cast<EmuEvent*>(event);
    return e == nullptr || !e->recorded || host_now() >= e->time;
  }

  // Blocks the host until the event's time.
  void synchronizeEvent(void* event) const override {
    auto* e = static_cast<EmuEvent*>(event);
    if (e != nullptr && e->recorded) Runtime::get().device(e->device).timeline.wait_until(e->time);
  }

  // Frees the event handle.
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<EmuEvent*>(event);
  }

  // Milliseconds between two recorded events, on the emulated timeline.
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    auto* a = static_cast<EmuEvent*>(start);
    auto* b = static_cast<EmuEvent*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded,
                "emugpu: elapsed_time needs both events recorded first; call record() on each");
    return static_cast<double>(b->time - a->time) / 1e6;
  }

  // True when all work enqueued on `stream` is done.
  bool queryStream(const c10::Stream& stream) const override {
    return host_now() >= Runtime::get().device(stream.device_index()).timeline.stream_ready(stream.id());
  }

  // Blocks the host until `stream` is done.
  void synchronizeStream(const c10::Stream& stream) const override {
    Runtime::get().device(stream.device_index()).timeline.wait_stream(stream.id());
  }

  // Blocks the host until all work on the device is done.
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    const int index = device_index < 0 ? current_device() : device_index;
    translate_errors([&] { Runtime::get().device(index).timeline.wait_device(); });
  }

  // See EmuDeviceAllocator::recordStream: nothing to defer.
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, EmuGuardImpl);

}  // namespace
}  // namespace emugpu
