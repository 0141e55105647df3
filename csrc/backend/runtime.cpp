#include "backend/runtime.h"

#include <c10/util/Exception.h>
#include <dlfcn.h>
#include <pthread.h>
#include <torch/csrc/autograd/graph_task.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "backend/ops/common.h"
#include "core/calibration.h"
#include "core/host_prices.h"
#include "core/mig.h"
#include "core/mps.h"
#include "core/share/daemon_capacity.h"
#include "core/share/daemon_time_share.h"
#include "core/shm_segment.h"
#include "core/visible_devices.h"

namespace emugpu {
namespace {

// profiles/gpus.json beside the compiled module (installed) or one level up
// (a source checkout).
std::string default_catalog() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&default_catalog), &info) == 0 || info.dli_fname == nullptr) {
    return "profiles/gpus.json";
  }
  const auto here = std::filesystem::path(info.dli_fname).parent_path();
  for (const auto& candidate : {here / "profiles" / "gpus.json", here.parent_path() / "profiles" / "gpus.json"}) {
    if (std::filesystem::is_regular_file(candidate)) return candidate.string();
  }
  return (here / "profiles" / "gpus.json").string();
}

// This process's command line, for the daemon's list of processes.
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : raw) c = c == '\0' ? ' ' : c;
  while (!raw.empty() && raw.back() == ' ') raw.pop_back();
  return raw.substr(0, share::kMaxName);
}

// The process's connection to the daemon at `address`: one per address,
// kept across configurations (the daemon knows the process by it).
std::shared_ptr<share::Client> daemon_client(const std::string& address, ClockKind clock, int priority) {
  static std::map<std::string, std::shared_ptr<share::Client>> clients;  // under Runtime's mutex
  auto& client = clients[address];
  if (!client) {
    client = std::make_shared<share::Client>(address,
                                             share::Hello{getpid(), clock_kind_name(clock), command_line(), priority});
  }
  return client;
}

void on_fork_child() {
  VirtualClock::after_fork();
  Runtime::get().mark_forked_child();
}

}  // namespace

namespace detail {
std::atomic<VirtualClock*> g_active_virtual_clock{nullptr};
}

VirtualClock& Runtime::virtual_clock() {
  static VirtualClock* clock = new VirtualClock(kVirtualStartNs);  // leaked, as the runtime
  return *clock;
}

Clock& Runtime::clock() {
  if (VirtualClock* v = active_virtual_clock()) return *v;
  return steady_clock();
}

ClockKind Runtime::clock_kind() const {
  return active_virtual_clock() != nullptr ? ClockKind::kVirtual : ClockKind::kReal;
}

Runtime& Runtime::get() {
  static Runtime* runtime = [] {
    auto* r = new Runtime();  // leaked: tensors may outlive static destruction
    pthread_atfork(nullptr, nullptr, &on_fork_child);
    return r;
  }();
  return *runtime;
}

void Runtime::mark_forked_child() {
  // Only a child of a parent that used the devices is refused; DataLoader
  // workers forked before the first emugpu op stay free to use them.
  if (state_.load(std::memory_order_acquire) != nullptr) bad_fork_.store(true);
}

void Runtime::configure(const ConfigRequest& request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    configure_locked(request);
  }
  invalidate_shape_caches();
}

namespace {

KernelParams fitted_calibration(const std::string& path, const GpuSpec& gpu) {
  namespace fs = std::filesystem;
  static std::mutex mutex;
  static std::map<std::tuple<std::string, std::string, uintmax_t, int64_t>, KernelParams> fits;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  const auto mtime = fs::last_write_time(path, ec).time_since_epoch().count();
  const auto key = std::make_tuple(path, gpu.name, size, static_cast<int64_t>(mtime));
  std::lock_guard<std::mutex> lock(mutex);
  auto it = fits.find(key);
  if (it == fits.end()) {
    const Calibration cal = load_calibration(path, gpu);
    // Once per file version, as the fit: points a newer version wrote are skipped, not refused.
    if (const std::string warning = calibration_warning(cal); !warning.empty()) TORCH_WARN("emugpu: ", warning);
    it = fits.emplace(key, fit_kernel_params(gpu, cal.cases, default_kernel_params(gpu), {}, "calibration: " + path))
             .first;
  }
  return it->second;
}

}  // namespace

SearchPath Runtime::search_path() const {
  return resolve_search_path(std::filesystem::path(default_catalog()).parent_path().string());
}

void Runtime::load_profiles_locked(const Catalog& catalog, const std::vector<std::unique_ptr<Device>>& devices) {
  const SearchPath path = search_path();
  ProfileDb db;
  db.scan(path.profiles);
  // Entries the scan could not read (symlink loops, no permission): one warning each.
  for (const std::string& warning : db.warnings()) TORCH_WARN("emugpu: ", warning);
  db.check_gpus(catalog);
  // A MIG instance runs its GPU's kernels on fewer SMs: its GPU's calibration
  // (fractions of peak rates) holds for it.
  std::map<std::string, KernelParams> by_gpu;
  for (const auto& d : devices) {
    const GpuSpec& gpu = d->gpu().parent_name.empty() ? d->gpu() : catalog.find(d->gpu().parent_name);
    auto it = by_gpu.find(gpu.name);
    if (it == by_gpu.end()) {
      KernelParams params = default_kernel_params(gpu);
      if (const auto file = find_calibration(path.calibration, gpu)) params = fitted_calibration(*file, gpu);
      it = by_gpu.emplace(gpu.name, params).first;
    }
    d->cost().set_kernel_params(it->second);
  }
  profiles_ = std::make_shared<const ProfileDb>(std::move(db));
  profiles_generation_.fetch_add(1, std::memory_order_acq_rel);
}

void Runtime::reload_profiles() {
  if (!configured()) {
    ensure_configured();  // configuring reads them
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const State& s = *state_.load(std::memory_order_acquire);
    load_profiles_locked(*s.catalog, s.devices);
  }
  invalidate_shape_caches();  // cached ops keep the durations of the old parameters
}

namespace {

// Under torchrun every rank drives emugpu:LOCAL_RANK, so a device index is
// the GPU's index on its node in every process: GPU i sits behind uplink
// i / shared_by. The node's processes share the segment; each removes its
// name at exit or SIGTERM (not a fork()ed child's), so none outlives the
// job, and a process that opens it after another rank ended gets uplinks of
// its own; a SIGKILLed job's segment is swept by the next one.
void attach_shared_pcie(const Config& config, const GpuSpec& gpu, std::vector<std::unique_ptr<Device>>& devices) {
  static std::mutex opened_mutex;
  static std::shared_ptr<PcieLinks> opened;  // one per process: a reconfigure keeps the node's uplinks
  static std::string opened_name;
  std::lock_guard<std::mutex> lock(opened_mutex);
  if (!opened || opened_name != config.pcie_segment) {
    if (config.pcie_segment.empty()) {
      opened = PcieLinks::in_process();
    } else {
      sweep_stale_segments();  // what SIGKILLed jobs of this user left behind
      opened = PcieLinks::shared(config.pcie_segment);
      unlink_on_sigterm(config.pcie_segment);
      static pid_t owner = 0;
      static std::string to_unlink;
      if (owner == 0) {
        owner = getpid();
        to_unlink = config.pcie_segment;
        std::atexit([] {
          if (getpid() == owner) PcieLinks::unlink(to_unlink);
        });
      }
    }
    opened_name = config.pcie_segment;
  }
  const double factor = config.pcie_uplink_gbps > 0 ? gpu.pcie_bandwidth() / (config.pcie_uplink_gbps * 1e9) : 1.0;
  for (auto& d : devices) {
    const int uplink = d->index() / config.pcie_shared_by;
    EMUGPU_CHECK(uplink < PcieLinks::kMaxUplinks, kValue, "EMUGPU_PCIE_SHARED_BY=", config.pcie_shared_by, " puts GPU ",
                 d->index(), " behind uplink ", uplink, "; at most ", PcieLinks::kMaxUplinks, " uplinks per node");
    d->attach_pcie(opened, uplink, factor);
  }
}

}  // namespace

namespace {

// How many device threads PyTorch's autograd engine started (it names them
// pt_autograd_<index>), or 0 before the process's first backward. The
// engine sizes them once, from the device count it sees then.
int autograd_device_threads() {
  namespace fs = std::filesystem;
  std::error_code ec;
  int threads = 0;
  for (const auto& task : fs::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind("pt_autograd_", 0) == 0) ++threads;
  }
  return threads;
}

}  // namespace

void Runtime::configure_locked(const ConfigRequest& request) {
  const Config config = resolve_config(request, default_catalog());
  if (const State* old = state_.load(std::memory_order_acquire)) {
    const int engine_devices = autograd_device_threads();
    EMUGPU_CHECK(engine_devices == 0 || config.device_count <= engine_devices, kRuntime,
                 "configure(): expected at most ", engine_devices, " emulated GPUs once autograd has run, got ",
                 config.device_count, ": PyTorch's autograd engine sized its device threads for ", engine_devices,
                 " at this process's first backward and cannot add more. Set the device count before the first "
                 "backward (configure(device_count=",
                 config.device_count, ") or EMUGPU_DEVICE_COUNT=", config.device_count, "), or use a fresh process");
    for (const auto& d : old->devices) {
      const auto in_use = d->allocator().stats().allocated_bytes[kAggregate].current;
      EMUGPU_CHECK(in_use == 0, kRuntime, "cannot reconfigure torch-emugpu: emulated device ", d->index(),
                   " still holds ", format_bytes(static_cast<double>(in_use)),
                   " of tensors; call configure() before creating emugpu tensors");
    }
  }
  auto state = std::make_unique<State>();
  state->config = config;
  state->catalog = std::make_unique<Catalog>(Catalog::from_file(config.catalog_path));
  const GpuSpec* chosen = &state->catalog->find(config.gpu);
  // The node's devices (whole GPUs or MIG instances; the daemon's, else this
  // process's own), of which EMUGPU_VISIBLE_DEVICES picks this process's.
  std::vector<NodeGpu> node;
  std::vector<uint32_t> daemon_index;  // per node device: its index at the daemon
  if (!config.daemon.empty()) {
    // The daemon's GPUs are this process's: their model, and as many as it has.
    state->daemon = daemon_client(config.daemon, config.clock, config.priority);
    const auto& gpus = state->daemon->welcome().gpus;
    const GpuSpec& owned = state->catalog->find(gpus.front().name);
    EMUGPU_CHECK(!config.gpu_given || chosen->name == owned.name, kValue, "EMUGPU_GPU (or gpu=) asks for ",
                 chosen->name, " but the emugpud at ", config.daemon, " owns ", gpus.back().gpu + 1, " x ", owned.name,
                 "; leave it unset to use the daemon's GPUs, or attach to a daemon of ", chosen->name);
    EMUGPU_CHECK(config.mig.empty(), kValue, "EMUGPU_MIG=", config.mig, " splits this process's own GPUs, but the ",
                 "emugpud at ", config.daemon, " owns them: unset EMUGPU_MIG and start the daemon with --mig ",
                 config.mig, " (select an instance with EMUGPU_VISIBLE_DEVICES)");
    chosen = &owned;
    for (size_t k = 0; k < gpus.size(); ++k) {
      const share::GpuInfo& info = gpus[k];
      const GpuSpec& parent = state->catalog->find(info.name);
      NodeGpu d{info.gpu, info.instance, parent, info.uuid};
      if (info.instance >= 0) {
        d.spec = mig_instance_spec(parent, {&find_mig_profile(parent, info.mig_profile), 0});
        d.spec.uuid = info.uuid;
      }
      node.push_back(std::move(d));
      daemon_index.push_back(static_cast<uint32_t>(k));
    }
  } else {
    const auto layout = config.mig.empty() ? std::vector<std::string>{} : parse_mig_layout(config.mig, "EMUGPU_MIG");
    node = node_devices(*chosen, config.device_count, layout);
  }
  std::vector<NodeDevice> listed;
  for (const NodeGpu& d : node) listed.push_back({d.gpu, d.instance, d.uuid, d.spec.name});
  std::vector<size_t> visible = select_visible_devices(listed, config.visible_devices, "EMUGPU_VISIBLE_DEVICES");
  if (state->daemon && config.device_count_given) {
    EMUGPU_CHECK(config.device_count <= static_cast<int>(visible.size()), kValue, "expected at most ", visible.size(),
                 " emulated GPUs, the emugpud at ", config.daemon, "'s that this process sees, got ",
                 "a device count of ", config.device_count);
    visible.resize(static_cast<size_t>(config.device_count));
  }
  EMUGPU_CHECK(visible.size() <= static_cast<size_t>(kMaxDevices), kValue, "expected at most ", kMaxDevices,
               " emulated devices in a process, got ", visible.size(), "; select fewer with EMUGPU_VISIBLE_DEVICES");
  state->config.device_count = static_cast<int>(visible.size());
  const GpuSpec& gpu = *chosen;
  CostModelParams cost;
  cost.host_staging_rate = config.host_copy_gbps * 1e9;
  Clock* clock = &steady_clock();
  if (config.clock == ClockKind::kVirtual) {
    HostCost host{config.host, config.host_speed, kMeasuredLaunchNs, 0};
    if (config.host == HostModel::kModelled) {
      const HostProfile measured =
          config.host_cost_file.empty() ? HostProfile{} : load_host_cost_file(config.host_cost_file);
      host = modelled_host_cost(measured, config.host_speed, kModelledReadNs);
      if (config.host_op_us > 0) {  // one time per op, forward and backward alike
        host.op_ns = static_cast<TimeNs>(config.host_op_us * 1e3);
        host.backward_op_ns = host.op_ns;
      }
    }
    virtual_clock().set_host_cost(host);
    clock = &virtual_clock();
    // Joins the daemon's processes at their time, never behind what they placed.
    if (state->daemon) virtual_clock().receive(state->daemon->welcome().now_ns);
  }
  const bool mps = state->daemon && state->daemon->welcome().sharing == "mps";
  for (size_t i = 0; i < visible.size(); ++i) {
    const NodeGpu& d = node[visible[i]];
    // An MPS client's device: its active-thread share of the SMs, its pinned memory limit.
    const auto limit = config.mps_pinned_mem_limit.find(static_cast<int>(i));
    state->specs.push_back(mps ? mps_client_spec(d.spec, config.mps_active_thread_percentage,
                                                 limit == config.mps_pinned_mem_limit.end() ? 0 : limit->second)
                               : d.spec);  // a deque: devices keep references to their spec
    state->devices.push_back(std::make_unique<Device>(static_cast<int>(i), state->specs.back(), *clock, 1024, cost));
    state->devices.back()->set_host_pace(static_cast<TimeNs>(config.host_op_us * 1e3));
    if (state->daemon) {
      const uint32_t at = daemon_index[visible[i]];
      state->daemon_gpus.push_back(static_cast<int>(at));
      state->devices.back()->allocator().share(std::make_shared<share::DaemonCapacity>(state->daemon, at));
      if (state->daemon->welcome().sharing != "none") {
        const double sm_fraction = static_cast<double>(state->specs.back().sm_count) / d.spec.sm_count;
        state->devices.back()->share_time(std::make_shared<share::DaemonTimeShare>(
            state->daemon, at, config.clock == ClockKind::kVirtual, sm_fraction));
      }
    }
  }
  if (config.pcie_shared_by > 1) attach_shared_pcie(config, gpu, state->devices);
  // Before the state is published: a malformed profile leaves the runtime
  // unconfigured, so the next use says so again instead of running without it.
  load_profiles_locked(*state->catalog, state->devices);
  mode_.store(config.mode);
  detail::g_active_virtual_clock.store(config.clock == ClockKind::kVirtual ? &virtual_clock() : nullptr,
                                       std::memory_order_release);
  if (const State* old = state_.load(std::memory_order_acquire)) {
    for (const auto& d : old->devices) d->allocator().share(nullptr);  // its cached segments leave the daemon's GPU
  }
  state_.store(state.release(), std::memory_order_release);  // the old state is leaked on purpose
}

void Runtime::ensure_configured() {
  if (configured()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (configured()) return;  // threads racing here configure once
  configure_locked({});
}

const Runtime::State& Runtime::state() {
  EMUGPU_CHECK(!bad_fork_.load(std::memory_order_relaxed), kRuntime,
               "Cannot re-initialize emugpu in forked subprocess: the parent used the emulated devices. "
               "To use emugpu with multiprocessing, use the 'spawn' start method "
               "(torch.multiprocessing.set_start_method('spawn'))");
  ensure_configured();
  return *state_.load(std::memory_order_acquire);
}

Config Runtime::config() {
  Config c = state().config;
  c.mode = mode_.load();
  return c;
}

int Runtime::device_count() { return static_cast<int>(state().devices.size()); }

int Runtime::device_count_or_default() noexcept {
  try {
    return device_count();
  } catch (...) {
    return 1;
  }
}

Device& Runtime::device(int index) {
  const State& s = state();
  EMUGPU_CHECK(index >= 0 && index < static_cast<int>(s.devices.size()), kIndex,
               "emugpu device index out of range: expected 0 <= index < ", s.devices.size(), ", got ", index,
               "; set EMUGPU_DEVICE_COUNT for more devices");
  return *s.devices[index];
}

int Runtime::daemon_gpu(int index) {
  device(index);  // checks the index
  const State& s = state();
  return s.daemon_gpus.empty() ? -1 : s.daemon_gpus[static_cast<size_t>(index)];
}

void Runtime::set_mode(Mode mode) { mode_.store(mode); }

const Catalog& Runtime::catalog() { return *state().catalog; }

const std::shared_ptr<share::Client>& Runtime::daemon() { return state().daemon; }

std::shared_ptr<const ProfileDb> Runtime::profiles() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return profiles_;
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

int64_t current_stream_id(int device) {
  EMUGPU_CHECK(device >= 0 && device < kMaxDevices, kIndex, "emugpu device index out of range: expected 0 <= index < ",
               kMaxDevices, ", got ", device);
  return tls_streams[device];
}

void set_current_stream_id(int device, int64_t stream) {
  Runtime::get().device(device);  // range check
  tls_streams[device] = stream;
}

bool in_backward() { return torch::autograd::get_current_graph_task_id() != -1; }

namespace {
thread_local std::shared_ptr<PendingTime> tls_event_time;
}  // namespace

EventTimeScope::EventTimeScope(std::shared_ptr<PendingTime> time) : previous_(std::move(tls_event_time)) {
  tls_event_time = std::move(time);
}

EventTimeScope::~EventTimeScope() { tls_event_time = std::move(previous_); }

std::shared_ptr<PendingTime> EventTimeScope::take() { return std::exchange(tls_event_time, nullptr); }

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
