// c10::impl::DeviceGuardImplInterface for emugpu: devices, streams, events.
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <mutex>

#include "backend/runtime.h"

namespace emugpu {
namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

// Events may be recorded on one thread and queried or waited on by another.
// Recorded behind held work (core/device.h), an event's time is known later.
struct EmuEvent {
  std::mutex mutex;
  int device = 0;
  std::shared_ptr<PendingTime> time;
};

struct EventPoint {
  int device = 0;
  std::shared_ptr<PendingTime> time;  // null: never recorded

  bool recorded() const { return time != nullptr; }
  // Blocks until the time is known (a host wait on held work).
  TimeNs force() const {
    return translate_errors([&] { return time->force(); });
  }
};

EventPoint read(void* event) {
  auto* e = static_cast<EmuEvent*>(event);
  if (e == nullptr) return {};
  std::lock_guard<std::mutex> lock(e->mutex);
  return {e->device, e->time};
}

Device& device_at(c10::DeviceIndex index) {
  return translate_errors([&]() -> Device& { return Runtime::get().device(index < 0 ? current_device() : index); });
}

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
  c10::Device getDevice() const override { return c10::Device(kType, static_cast<c10::DeviceIndex>(current_device())); }

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
  // The calling thread's current stream on `d`; IndexError for a bad index.
  c10::Stream getStream(c10::Device d) const override {
    const auto index = device_at(d.index()).index();
    return make_stream(static_cast<c10::DeviceIndex>(index), current_stream_id(index));
  }

  // Stream 0 is every device's default stream.
  c10::Stream getDefaultStream(c10::Device d) const override {
    return make_stream(static_cast<c10::DeviceIndex>(device_at(d.index()).index()), 0);
  }

  // The next stream of the device's fixed pool, as CUDA's getStreamFromPool.
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    auto& dev = device_at(d.index());
    return make_stream(static_cast<c10::DeviceIndex>(dev.index()), dev.pool_stream(high_priority));
  }

  // CUDA hands out pool streams here too (negative priorities are high).
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return getStreamFromGlobalPool(d, priority < 0);
  }

  // Makes `s` current on its device; returns the stream it replaces.
  c10::Stream exchangeStream(c10::Stream s) const override {
    const auto old = getStream(s.device());
    translate_errors([&] { set_current_stream_id(s.device_index(), s.id()); });
    return old;
  }

  // Number of emulated devices (configuring from the environment); never throws.
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(Runtime::get().device_count_or_default());
  }

  // Records where the stream's timeline will be (now, if idle).
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    const EmulatorCall call(active_virtual_clock());
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "emugpu: event device index ",
                static_cast<int>(device_index), " does not match the stream's device ", stream.device());
    auto& dev = device_at(stream.device_index());
    std::shared_ptr<PendingTime> time = EventTimeScope::take();
    if (!time) time = translate_errors([&] { return dev.record_pending(stream.id(), !in_backward()); });
    auto*& e = *reinterpret_cast<EmuEvent**>(event);
    if (e == nullptr) e = new EmuEvent;
    std::lock_guard<std::mutex> lock(e->mutex);
    e->device = dev.index();
    e->time = std::move(time);
  }

  // Later work on `stream` starts after the event's time (held until it is known).
  void block(void* event, const c10::Stream& stream) const override {
    const EmulatorCall call(active_virtual_clock());
    const EventPoint p = read(event);
    if (p.recorded()) {
      translate_errors([&] { device_at(stream.device_index()).stream_wait(stream.id(), p.time); });
    }
  }

  // True once host time has passed the event's time (or it was never recorded).
  bool queryEvent(void* event) const override {
    const EmulatorCall call(active_virtual_clock());
    const EventPoint p = read(event);
    if (!p.recorded()) return true;
    auto& dev = device_at(static_cast<c10::DeviceIndex>(p.device));
    if (!p.time->known()) dev.poll();  // its held work may be placeable by now
    return p.time->known() && dev.reached(p.time->value());
  }

  // Blocks the host until the event's time.
  void synchronizeEvent(void* event) const override {
    const EmulatorCall call(active_virtual_clock());
    const EventPoint p = read(event);
    if (p.recorded()) {
      const TimeNs t = p.force();
      translate_errors([&] { device_at(static_cast<c10::DeviceIndex>(p.device)).wait_until(t); });
    }
  }

  // Frees the event handle.
  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<EmuEvent*>(event);
  }

  // Milliseconds between two recorded events, on the emulated timeline.
  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device_index*/) const override {
    const EventPoint a = read(start), b = read(end);
    TORCH_CHECK(a.recorded() && b.recorded(),
                "emugpu: elapsed_time needs both events recorded first; call record() on each");
    return static_cast<double>(b.force() - a.force()) / 1e6;
  }

  // True when all work enqueued on `stream` is done.
  bool queryStream(const c10::Stream& stream) const override {
    const EmulatorCall call(active_virtual_clock());
    auto& dev = device_at(stream.device_index());
    return dev.reached(dev.stream_ready(stream.id()));
  }

  // Blocks the host until `stream` is done (a sync point).
  void synchronizeStream(const c10::Stream& stream) const override {
    const EmulatorCall call(active_virtual_clock());
    translate_errors([&] { device_at(stream.device_index()).synchronize_stream(stream.id()); });
  }

  // Blocks the host until all work on the device is done (a sync point).
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    const EmulatorCall call(active_virtual_clock());
    Runtime::get().drain_deferred();
    translate_errors([&] { device_at(device_index).synchronize(); });
  }

  // See EmuDeviceAllocator::recordStream: nothing to defer.
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, EmuGuardImpl);

}  // namespace
}  // namespace emugpu
