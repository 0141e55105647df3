// Process-wide state of the emulated devices, shared by every glue file.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "core/caching_allocator.h"
#include "core/catalog.h"
#include "core/clock.h"
#include "core/cost_model.h"
#include "core/error.h"
#include "core/profile_db.h"

namespace emugpu {

enum class Mode { kTiming, kCompute };

constexpr int kMaxDevices = 64;
// Context overhead CUDA keeps out of cudaMalloc's reach on every GPU.
constexpr uint64_t kCudaContextBytes = 300ull << 20;

struct DeviceState {
  DeviceState(int index, const GpuSpec& gpu);
  int index;
  const GpuSpec& gpu;
  CachingAllocator allocator;
  Timeline timeline;
  CostModel cost;
  RegionCalibrator regions;
  std::atomic<int64_t> next_stream{1};
};

struct Config {
  std::string catalog_path;
  std::string gpu;
  int device_count = 1;
  Mode mode = Mode::kTiming;
};

class Runtime {
 public:
  static Runtime& get();

  // (Re)creates the devices; refused while device memory is allocated.
  void configure(const Config& config);
  bool configured() const { return !devices_.empty(); }
  const Config& config() const { return config_; }

  int device_count() const { return static_cast<int>(devices_.size()); }
  DeviceState& device(int index);
  bool compute_mode() const { return mode_.load(std::memory_order_relaxed) == Mode::kCompute; }
  void set_mode(Mode mode) { mode_.store(mode); config_.mode = mode; }
  const Catalog& catalog() const { return *catalog_; }
  // Profiles are (re)loaded from Python, which owns the search path.
  void set_profiles(ProfileDb db) { profiles_ = std::make_unique<ProfileDb>(std::move(db)); }
  const ProfileDb* profiles() const { return profiles_.get(); }
  // Called once when a device is needed before configure() ran: the Python
  // package configures from the environment (EMUGPU_GPU, ...).
  void set_lazy_init(std::function<void()> init) { lazy_init_ = std::move(init); }

 private:
  Config config_;
  std::unique_ptr<Catalog> catalog_;
  std::vector<std::unique_ptr<DeviceState>> devices_;
  std::atomic<Mode> mode_{Mode::kTiming};
  std::function<void()> lazy_init_;
  std::unique_ptr<ProfileDb> profiles_;
  std::mutex lazy_init_mutex_;
};

// Thread-local current device and, per device, current stream (as CUDA).
int current_device();
void set_current_device(int index);
int64_t current_stream_id(int device);
void set_current_stream_id(int device, int64_t stream);

// Rethrows an emugpu::Error as the matching c10 exception type.
[[noreturn]] void rethrow_as_c10(const Error& error);

template <typename Fn>
auto translate_errors(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    rethrow_as_c10(e);
  }
}

}  // namespace emugpu
