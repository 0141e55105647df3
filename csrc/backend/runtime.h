// Process-wide state of the emulated devices, shared by every glue file.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/catalog.h"
#include "core/config.h"
#include "core/device.h"
#include "core/error.h"
#include "core/kernel_params.h"
#include "core/pending_time.h"
#include "core/profile_db.h"
#include "core/share/client.h"
#include "core/virtual_clock.h"

namespace emugpu {

class Runtime {
 public:
  static Runtime& get();

  // (Re)creates the devices; what `request` leaves out comes from the
  // environment. Refused while device memory is allocated.
  // Drops the ops' cached durations too: they are the old GPU's.
  void configure(const ConfigRequest& request);
  // Reads the profiles and the calibration again from the search path of
  // this moment (core/config.h resolve_search_path), as configure() does.
  void reload_profiles();
  // Configures from the environment unless already configured.
  void ensure_configured();
  bool configured() const { return state_.load(std::memory_order_acquire) != nullptr; }
  Config config();

  // Configures on first use, so the count is right from the first question
  // (autograd sizes its per-device queues at its first backward).
  int device_count();
  // For noexcept callers: the count, or 1 when the configuration is broken
  // (the error surfaces at the first real use).
  int device_count_or_default() noexcept;
  Device& device(int index);
  // The emugpud GPU (an index of its status) that device `index` is; -1 without a daemon.
  int daemon_gpu(int index);
  bool compute_mode() const { return mode_.load(std::memory_order_relaxed) == Mode::kCompute; }
  void set_mode(Mode mode);  // the only setting that may change with tensors alive
  const Catalog& catalog();
  // The connection to emugpud (EMUGPU_DAEMON) the devices' memory comes from; null without one.
  const std::shared_ptr<share::Client>& daemon();
  // The profiles read at the last configuration or reload, and a count of
  // those loads: the region planner drops plans made from older ones.
  std::shared_ptr<const ProfileDb> profiles() const;
  uint64_t profiles_generation() const { return profiles_generation_.load(std::memory_order_acquire); }
  SearchPath search_path() const;

  // Backend `emu` places the collectives whose end is not known yet through
  // this hook (set by its first process group), so that a device synchronize through c10
  // (torch.accelerator.synchronize) waits for them, as for NCCL's streams.
  void set_drain_hook(void (*hook)()) { drain_hook_.store(hook); }
  void drain_deferred() const {
    if (auto* hook = drain_hook_.load()) hook();
  }

  // The process's virtual clock (every process's starts at kVirtualStartNs,
  // so that ranks launched together agree without measuring offsets); it
  // keeps its time across configurations. Its host cost follows the last
  // configuration that chose it.
  static VirtualClock& virtual_clock();
  // The clock devices run on: the virtual one or the host's steady clock.
  Clock& clock();
  ClockKind clock_kind() const;

  // A fork()ed child may not use the devices its parent used (as CUDA).
  void mark_forked_child();
  bool in_bad_fork() const { return bad_fork_.load(); }

 private:
  // One immutable configuration: swapped whole, never freed (guards and
  // tensors on other threads may still refer to its devices).
  struct State {
    Config config;
    std::unique_ptr<Catalog> catalog;
    std::deque<GpuSpec> specs;  // per device (a MIG instance's own): before the devices that refer to them
    std::vector<std::unique_ptr<Device>> devices;
    std::shared_ptr<share::Client> daemon;  // EMUGPU_DAEMON's connection, else null
    std::vector<int> daemon_gpus;           // per device: its index at the daemon
  };
  const State& state();
  void configure_locked(const ConfigRequest& request);
  // Reads the search path's profiles (checked against `catalog`) and sets
  // `devices`' kernel parameters from its calibration; then publishes the
  // profiles. Called with mutex_ held.
  void load_profiles_locked(const Catalog& catalog, const std::vector<std::unique_ptr<Device>>& devices);

  mutable std::mutex mutex_;  // serialises configuration and profile swaps
  std::atomic<const State*> state_{nullptr};
  std::atomic<Mode> mode_{Mode::kTiming};
  std::shared_ptr<const ProfileDb> profiles_;
  std::atomic<bool> bad_fork_{false};
  std::atomic<void (*)()> drain_hook_{nullptr};
  std::atomic<uint64_t> profiles_generation_{0};
};

constexpr TimeNs kVirtualStartNs = 1'000'000'000;
// A CUDA host's launch call (cudaLaunchKernel and its stream bookkeeping),
// which this host does not make: added per op to measured host work.
constexpr TimeNs kMeasuredLaunchNs = 4'000;
// The modelled host's prices per op: host_prices.h (EMUGPU_HOST_COST, EMUGPU_HOST_OP_US).
// The modelled host's time per clock read by the script: a loop that spins
// on time.time() until a deadline gets there.
constexpr TimeNs kModelledReadNs = 1'000;

namespace detail {
extern std::atomic<VirtualClock*> g_active_virtual_clock;
}
// The virtual clock while it is the configured one, else null: what
// EmulatorCall takes at every entry into the emulator from a host thread.
inline VirtualClock* active_virtual_clock() { return detail::g_active_virtual_clock.load(std::memory_order_acquire); }

// Thread-local current device and, per device, current stream (as CUDA).
int current_device();
void set_current_device(int index);
int64_t current_stream_id(int device);
void set_current_stream_id(int device, int64_t stream);

// Whether this thread runs autograd's backward (a hook, a final callback):
// its events and collectives are part of a backward region, not its end.
bool in_backward();
// What an op entering the emulator on this thread is to the modelled host.
inline HostCall launched_op() { return in_backward() ? HostCall::kBackwardOp : HostCall::kOp; }

// While one is alive on a thread, events recorded there take `time` instead
// of their stream's: a deferred collective completes its future at launch,
// as NCCL's does, with events that reach the collective's end.
class EventTimeScope {
 public:
  explicit EventTimeScope(std::shared_ptr<PendingTime> time);
  ~EventTimeScope();
  EventTimeScope(const EventTimeScope&) = delete;
  EventTimeScope& operator=(const EventTimeScope&) = delete;
  // The innermost scope's time on this thread, for one event: the next
  // call returns null (events recorded later, by the future's callbacks,
  // take their own stream's time).
  static std::shared_ptr<PendingTime> take();

 private:
  std::shared_ptr<PendingTime> previous_;
};

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
