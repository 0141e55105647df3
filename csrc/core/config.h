// The configuration of the emulated GPUs, from explicit values or the
// environment (EMUGPU_GPU, EMUGPU_DEVICE_COUNT, EMUGPU_MODE, EMUGPU_CATALOG,
// the inter-node network of collectives: EMUGPU_NET_GBPS,
// EMUGPU_NET_LATENCY_US, and NCCL's own NCCL_ALGO, which a job tuned for real
// GPUs may set; the ranks' exchange: EMUGPU_EXCHANGE; the staging of
// pageable copies: EMUGPU_HOST_COPY_GBPS; the emulated host's time per op:
// EMUGPU_HOST_OP_US; shared PCIe uplinks:
// EMUGPU_PCIE_SHARED_BY, EMUGPU_PCIE_UPLINK_GBPS; where profiles and
// calibrations are found: EMUGPU_PROFILE_PATH, EMUGPU_PROFILES,
// EMUGPU_CALIBRATION, XDG_DATA_HOME; the clock: EMUGPU_CLOCK, EMUGPU_HOST,
// EMUGPU_HOST_SPEED; the sharing daemon: EMUGPU_DAEMON, EMUGPU_PRIORITY; MIG:
// EMUGPU_MIG, EMUGPU_VISIBLE_DEVICES): the one place
// either is parsed.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "virtual_clock.h"

namespace emugpu {

enum class Mode { kTiming, kCompute };
// How the ranks of backend `emu` exchange start times and small payloads:
// shared memory where every rank of a group shares this machine (auto),
// always TCP (tcp, e.g. to exercise the network path on one machine), or
// shared memory or an error (shm).
enum class ExchangeTransport { kAuto, kTcp, kShm };

constexpr int kMaxDevices = 64;
constexpr const char* kDefaultGpu = "NVIDIA A100-SXM4-40GB";
// Per node: 4 x 200 Gb/s InfiniBand HDR (a DGX A100 has 8, most clusters 4).
constexpr double kDefaultNetGBps = 100;
// One RDMA write (~2 us) plus NCCL's proxy thread handing it over.
constexpr double kDefaultNetLatencyUs = 3;
// Bounds of the configured rates, generous on both sides: 1 MB/s is slower
// than any link a GPU sits behind (tests slow links down to 0.005 GB/s), and
// no network reaches 100 TB/s per node, nor host memory or a PCIe uplink
// 10 TB/s. Below the minimum, durations would reach years.
constexpr double kMinRateGBps = 0.001;
constexpr double kMaxNetGBps = 100'000;
constexpr double kMaxHostRateGBps = 10'000;     // EMUGPU_HOST_COPY_GBPS, EMUGPU_PCIE_UPLINK_GBPS
constexpr double kMaxNetLatencyUs = 1'000'000;  // a second per hop
// The host's memcpy into CUDA's pinned staging buffers (pageable copies).
constexpr double kDefaultHostCopyGBps = 14;
constexpr double kMaxHostOpUs = 1'000'000;
// EMUGPU_HOST_SPEED: a host a thousand times slower or faster than this one.
constexpr double kMinHostSpeed = 0.001;
constexpr double kMaxHostSpeed = 1000;

struct Config {
  std::string catalog_path;
  std::string gpu;
  int device_count = 1;
  Mode mode = Mode::kTiming;
  double net_gbps = kDefaultNetGBps;             // GB/s (1e9 bytes/s) per direction per node
  double net_latency_us = kDefaultNetLatencyUs;  // one network hop
  // NCCL_ALGO as set: what the collective model may choose. Parsed where a
  // collective is timed (parse_algorithms), so a value only NCCL knows
  // fails the collectives that use it, not the device.
  std::string nccl_algo;
  // GPUs that share one PCIe uplink (a switch, or the host's bandwidth for
  // every GPU of a node); 1: each GPU has its own link.
  int pcie_shared_by = 1;
  double pcie_uplink_gbps = 0;  // the uplink's usable rate; 0: the GPU's own
  // The node's processes share their uplinks through this shared-memory
  // name (torchrun: its run id and the node's rank); empty: one process.
  std::string pcie_segment;
  double host_copy_gbps = kDefaultHostCopyGBps;  // GB/s of pageable copies' staging
  // Emulates a host slower than this one: ops launched from Python at least
  // this many microseconds apart (0: this host's own pace).
  double host_op_us = 0;
  ExchangeTransport exchange = ExchangeTransport::kAuto;
  // Real: the host sleeps until the emulated GPU is done. Virtual: nothing
  // sleeps; host work advances time as `host` says (virtual_clock.h).
  ClockKind clock = ClockKind::kReal;
  HostModel host = HostModel::kMeasured;
  double host_speed = 1.0;
  // EMUGPU_HOST_COST: a host cost file whose figures price the modelled
  // host's ops (host_prices.h); empty: the H100 machine's host.
  std::string host_cost_file;
  // emugpud's address (share/address.h); empty: this process's GPUs are its own.
  std::string daemon;
  // EMUGPU_PRIORITY: this process's priority on the daemon's GPUs (its priority policy).
  int priority = 0;
  // EMUGPU_MIG: a MIG layout ("3g.40gb,2g.20gb") applied to each of this
  // process's GPUs (mig.h); empty: whole GPUs. Under a daemon its --mig decides.
  std::string mig;
  // EMUGPU_VISIBLE_DEVICES (visible_devices.h); empty: CUDA's default choice.
  std::string visible_devices;
  // CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
  // (mps.h): applied under an emugpud that shares by MPS, ignored otherwise
  // (as CUDA ignores them without an MPS server).
  double mps_active_thread_percentage = 100;
  std::map<int, uint64_t> mps_pinned_mem_limit;
  // Whether `gpu` and `device_count` were asked for (else the daemon's GPUs decide).
  bool gpu_given = false;
  bool device_count_given = false;
};

// What a caller asks for; whatever is left out comes from the environment,
// then from the defaults. Bad values throw kValue naming their source.
struct ConfigRequest {
  std::optional<std::string> gpu;
  std::optional<int> device_count;
  std::optional<std::string> mode;
  std::optional<double> net_gbps;
  std::optional<double> net_latency_us;
  std::optional<std::string> clock;
  std::optional<std::string> host;
  std::optional<double> host_speed;
};

// The directories searched, first match wins: EMUGPU_PROFILE_PATH's (split
// at ':'), the user's ($XDG_DATA_HOME/torch-emugpu/profiles, by default
// under ~/.local/share), then `packaged_dir`. Profiles: none with
// EMUGPU_PROFILES=off (every time from the cost model). Calibrations belong
// to the cost model, so they are searched under EMUGPU_PROFILES=off too;
// none with EMUGPU_CALIBRATION=off. Read anew at each call (configure()
// follows the environment of its moment); bad switches throw kValue.
struct SearchPath {
  std::vector<std::string> profiles;
  std::vector<std::string> calibration;
};
SearchPath resolve_search_path(const std::string& packaged_dir);

Config resolve_config(const ConfigRequest& request, const std::string& default_catalog);
Mode parse_mode(const std::string& text, const std::string& source);
int parse_device_count(const std::string& text, const std::string& source);
int parse_priority(const std::string& text, const std::string& source);
const char* mode_name(Mode mode);
ExchangeTransport parse_exchange(const std::string& text, const std::string& source);
const char* exchange_name(ExchangeTransport transport);
ClockKind parse_clock(const std::string& text, const std::string& source);
HostModel parse_host_model(const std::string& text, const std::string& source);
// A number in [kMinHostSpeed, kMaxHostSpeed]; throws kValue naming `source`.
double parse_host_speed(const std::string& text, const std::string& source);
// A number in [kMinRateGBps, kMaxNetGBps] GB/s; throws kValue naming `source`.
double parse_net_gbps(const std::string& text, const std::string& source);
// A number in [0, kMaxNetLatencyUs] microseconds; throws kValue naming `source`.
double parse_net_latency_us(const std::string& text, const std::string& source);

}  // namespace emugpu
