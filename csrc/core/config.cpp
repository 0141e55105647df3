#include "config.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string_view>

#include "error.h"
#include "mig.h"
#include "mps.h"
#include "share/address.h"
#include "shm_segment.h"
#include "text.h"
#include "virtual_clock.h"

namespace emugpu {
namespace {

// A stable 64-bit hash (FNV-1a): every process of a job must derive the same name.
// What an error message echoes of a value (error.h's echo_input).
std::string brief(const std::string& s) { return echo_input(s); }

// A bound as people write it: 1000000, not 1e+06.
std::string plain(double x) {
  if (x == std::floor(x) && std::fabs(x) < 1e15) return std::to_string(static_cast<int64_t>(x));
  std::ostringstream out;
  out << x;
  return out.str();
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || trim(v).empty()) return std::nullopt;
  return trim(v);
}

void check_count(int count, const std::string& source) {
  EMUGPU_CHECK(count >= 1, kValue, source, ": expected a positive number of emulated GPUs (1 or more), got ", count);
  EMUGPU_CHECK(count <= kMaxDevices, kValue, source, ": expected at most ", kMaxDevices, " emulated GPUs, got ", count);
}

void check_net_gbps(double v, const std::string& source) {
  EMUGPU_CHECK(std::isfinite(v) && v >= kMinRateGBps && v <= kMaxNetGBps, kValue, source,
               ": expected a network bandwidth in GB/s per node from ", plain(kMinRateGBps), " to ", plain(kMaxNetGBps),
               ", got ", v, "; set it within that range (100 is 4 x 200 Gb/s InfiniBand)");
}

void check_net_latency(double v, const std::string& source) {
  EMUGPU_CHECK(std::isfinite(v) && v >= 0 && v <= kMaxNetLatencyUs, kValue, source,
               ": expected a network latency in microseconds from 0 to ", plain(kMaxNetLatencyUs), ", got ", v,
               "; set it within that range (3 is one InfiniBand hop)");
}

// The whole of `text` as a finite decimal number, or a kValue error.
double parse_number(const std::string& text, const std::string& source, const char* what) {
  const std::string t = trim(text);
  size_t used = 0;
  double value = std::numeric_limits<double>::quiet_NaN();
  try {
    value = std::stod(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  EMUGPU_CHECK(used == t.size() && !t.empty() && std::isfinite(value), kValue, source, ": expected ", what, ", got '",
               brief(text), "'");
  return value;
}

// A rate in GB/s from `source` within [kMinRateGBps, max].
double parse_rate(const std::string& text, const char* source, const char* what, double max) {
  const double v = parse_number(text, source, what);
  EMUGPU_CHECK(v >= kMinRateGBps && v <= max, kValue, source, ": expected a rate in GB/s from ", plain(kMinRateGBps),
               " to ", plain(max), ", got ", v, "; set it within that range");
  return v;
}

}  // namespace

double parse_net_gbps(const std::string& text, const std::string& source) {
  const double v = parse_number(text, source, "a network bandwidth in GB/s per node (e.g. 100 for 4 x 200 Gb/s)");
  check_net_gbps(v, source);
  return v;
}

double parse_net_latency_us(const std::string& text, const std::string& source) {
  const double v = parse_number(text, source, "a network latency in microseconds (e.g. 3)");
  check_net_latency(v, source);
  return v;
}

Mode parse_mode(const std::string& text, const std::string& source) {
  std::string mode = trim(text);
  std::transform(mode.begin(), mode.end(), mode.begin(), [](unsigned char c) { return std::tolower(c); });
  if (mode == "timing") return Mode::kTiming;
  if (mode == "compute") return Mode::kCompute;
  detail::throw_error(ErrorKind::kValue, source, ": expected one of timing, compute, got '", brief(text), "'");
}

const char* mode_name(Mode mode) { return mode == Mode::kCompute ? "compute" : "timing"; }

ExchangeTransport parse_exchange(const std::string& text, const std::string& source) {
  std::string name = trim(text);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name == "auto") return ExchangeTransport::kAuto;
  if (name == "tcp") return ExchangeTransport::kTcp;
  if (name == "shm") return ExchangeTransport::kShm;
  detail::throw_error(ErrorKind::kValue, source, ": expected one of auto, tcp, shm, got '", brief(text), "'");
}

const char* exchange_name(ExchangeTransport transport) {
  switch (transport) {
    case ExchangeTransport::kTcp: return "tcp";
    case ExchangeTransport::kShm: return "shm";
    case ExchangeTransport::kAuto: break;
  }
  return "auto";
}

namespace {

std::string lower_trimmed(const std::string& text) {
  std::string t = trim(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  return t;
}

void check_host_speed(double v, const std::string& source) {
  EMUGPU_CHECK(std::isfinite(v) && v >= kMinHostSpeed && v <= kMaxHostSpeed, kValue, source,
               ": expected how many times faster the emulated host is than this one, from ", plain(kMinHostSpeed),
               " to ", plain(kMaxHostSpeed), " (e.g. 1.5), got ", v);
}

}  // namespace

ClockKind parse_clock(const std::string& text, const std::string& source) {
  const std::string t = lower_trimmed(text);
  if (t == "real") return ClockKind::kReal;
  if (t == "virtual") return ClockKind::kVirtual;
  detail::throw_error(ErrorKind::kValue, source, ": expected one of real, virtual, got '", brief(text), "'");
}

HostModel parse_host_model(const std::string& text, const std::string& source) {
  const std::string t = lower_trimmed(text);
  if (t == "measured") return HostModel::kMeasured;
  if (t == "modelled" || t == "modeled") return HostModel::kModelled;
  detail::throw_error(ErrorKind::kValue, source, ": expected one of measured, modelled, got '", brief(text), "'");
}

double parse_host_speed(const std::string& text, const std::string& source) {
  const double v = parse_number(text, source, "a host speed factor (e.g. 1.5)");
  check_host_speed(v, source);
  return v;
}

namespace {

// `text` as a whole integer (spaces around it allowed); nullopt if it is not one.
std::optional<long long> parse_integer(const std::string& text) {
  const std::string t = trim(text);
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(t, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (t.empty() || used != t.size()) return std::nullopt;
  return value;
}

}  // namespace

int parse_device_count(const std::string& text, const std::string& source) {
  const auto parsed = parse_integer(text);
  EMUGPU_CHECK(parsed.has_value(), kValue, source, ": expected a positive integer number of emulated GPUs, got '",
               brief(text), "'");
  const long long value = *parsed;
  EMUGPU_CHECK(value >= 1, kValue, source, ": expected a positive number of emulated GPUs (1 or more), got ", value);
  EMUGPU_CHECK(value <= kMaxDevices, kValue, source, ": expected at most ", kMaxDevices, " emulated GPUs, got ", value);
  return static_cast<int>(value);
}

int parse_priority(const std::string& text, const std::string& source) {
  const auto value = parse_integer(text);
  EMUGPU_CHECK(value.has_value() && *value >= -1000 && *value <= 1000, kValue, source,
               ": expected an integer priority from -1000 to 1000 (higher runs first under emugpud's priority "
               "sharing), got '",
               brief(text), "'");
  return static_cast<int>(*value);
}

namespace {

bool switch_on(const char* name) {
  std::string v = env(name).value_or("on");
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char ch) { return std::tolower(ch); });
  EMUGPU_CHECK(v == "on" || v == "off", kValue, name, ": expected 'on' or 'off', got '", brief(v), "'");
  return v == "on";
}

std::string home_directory() {
  if (auto home = env("HOME")) return *home;
  const passwd* pw = getpwuid(getuid());  // as Python's expanduser: the account's home where HOME is unset
  return pw != nullptr && pw->pw_dir != nullptr ? pw->pw_dir : "/";
}

}  // namespace

SearchPath resolve_search_path(const std::string& packaged_dir) {
  std::vector<std::string> dirs;
  if (const char* listed = std::getenv("EMUGPU_PROFILE_PATH")) {
    std::string_view rest(listed);
    while (true) {
      const auto colon = rest.find(':');
      const std::string part(rest.substr(0, colon));
      if (!trim(part).empty()) dirs.push_back(part);
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
  }
  const std::string data_home = env("XDG_DATA_HOME").value_or(home_directory() + "/.local/share");
  dirs.push_back(data_home + "/torch-emugpu/profiles");
  dirs.push_back(packaged_dir);
  SearchPath path;
  const bool profiles = switch_on("EMUGPU_PROFILES");
  const bool calibration = switch_on("EMUGPU_CALIBRATION");
  if (profiles) path.profiles = dirs;
  if (calibration) path.calibration = std::move(dirs);
  return path;
}

Config resolve_config(const ConfigRequest& request, const std::string& default_catalog) {
  Config c;
  c.gpu_given = request.gpu || env("EMUGPU_GPU");
  c.gpu = request.gpu ? trim(*request.gpu) : env("EMUGPU_GPU").value_or(kDefaultGpu);
  EMUGPU_CHECK(!c.gpu.empty(), kValue, "gpu: expected a GPU name (torch-emugpu gpus lists them), got ''");
  if (request.device_count) {
    check_count(*request.device_count, "device_count");
    c.device_count = *request.device_count;
  } else if (auto v = env("EMUGPU_DEVICE_COUNT")) {
    c.device_count = parse_device_count(*v, "EMUGPU_DEVICE_COUNT");
  } else if (auto v = env("LOCAL_WORLD_SIZE")) {
    // Under torchrun every rank sees the node's GPUs, one per local rank.
    c.device_count = parse_device_count(*v, "LOCAL_WORLD_SIZE (set by torchrun)");
  }
  c.device_count_given = request.device_count || env("EMUGPU_DEVICE_COUNT") || env("LOCAL_WORLD_SIZE");
  if (auto v = env("EMUGPU_DAEMON")) c.daemon = share::parse_address(*v, "EMUGPU_DAEMON").text();
  if (auto v = env("EMUGPU_PRIORITY")) c.priority = parse_priority(*v, "EMUGPU_PRIORITY");
  if (auto v = env("EMUGPU_MIG")) {
    parse_mig_layout(*v, "EMUGPU_MIG");  // its syntax now; the GPU's profiles where the devices are made
    c.mig = *v;
  }
  c.visible_devices = env("EMUGPU_VISIBLE_DEVICES").value_or("");
  if (auto v = env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")) {
    c.mps_active_thread_percentage = parse_active_thread_percentage(*v, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
  }
  if (auto v = env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")) {
    c.mps_pinned_mem_limit = parse_pinned_mem_limit(*v, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT");
  }
  if (request.mode) {
    c.mode = parse_mode(*request.mode, "mode");
  } else if (auto v = env("EMUGPU_MODE")) {
    c.mode = parse_mode(*v, "EMUGPU_MODE");
  }
  if (request.net_gbps) {
    check_net_gbps(*request.net_gbps, "net_gbps");
    c.net_gbps = *request.net_gbps;
  } else if (auto v = env("EMUGPU_NET_GBPS")) {
    c.net_gbps = parse_net_gbps(*v, "EMUGPU_NET_GBPS");
  }
  if (request.net_latency_us) {
    check_net_latency(*request.net_latency_us, "net_latency_us");
    c.net_latency_us = *request.net_latency_us;
  } else if (auto v = env("EMUGPU_NET_LATENCY_US")) {
    c.net_latency_us = parse_net_latency_us(*v, "EMUGPU_NET_LATENCY_US");
  }
  c.nccl_algo = env("NCCL_ALGO").value_or("");
  if (auto v = env("EMUGPU_HOST_COPY_GBPS")) {
    c.host_copy_gbps = parse_rate(*v, "EMUGPU_HOST_COPY_GBPS", "a host copy rate in GB/s (e.g. 14)", kMaxHostRateGBps);
  }
  if (auto v = env("EMUGPU_HOST_OP_US")) {
    c.host_op_us = parse_number(*v, "EMUGPU_HOST_OP_US", "the emulated host's microseconds per op (e.g. 60)");
    EMUGPU_CHECK(c.host_op_us >= 0 && c.host_op_us <= kMaxHostOpUs, kValue,
                 "EMUGPU_HOST_OP_US: expected microseconds per op from 0 to ", plain(kMaxHostOpUs), ", got ",
                 c.host_op_us);
  }
  if (auto v = env("EMUGPU_EXCHANGE")) c.exchange = parse_exchange(*v, "EMUGPU_EXCHANGE");
  if (request.clock) {
    c.clock = parse_clock(*request.clock, "clock");
  } else if (auto v = env("EMUGPU_CLOCK")) {
    c.clock = parse_clock(*v, "EMUGPU_CLOCK");
  }
  if (request.host) {
    c.host = parse_host_model(*request.host, "host");
  } else if (auto v = env("EMUGPU_HOST")) {
    c.host = parse_host_model(*v, "EMUGPU_HOST");
  }
  if (request.host_speed) {
    check_host_speed(*request.host_speed, "host_speed");
    c.host_speed = *request.host_speed;
  } else if (auto v = env("EMUGPU_HOST_SPEED")) {
    c.host_speed = parse_host_speed(*v, "EMUGPU_HOST_SPEED");
  }
  if (auto v = env("EMUGPU_HOST_COST")) {
    EMUGPU_CHECK(c.clock == ClockKind::kVirtual && c.host == HostModel::kModelled, kValue,
                 "EMUGPU_HOST_COST prices the modelled host of the virtual clock: expected EMUGPU_CLOCK=virtual and "
                 "EMUGPU_HOST=modelled with it, got clock ",
                 clock_kind_name(c.clock), " and host ", host_model_name(c.host),
                 "; set both, or unset EMUGPU_HOST_COST");
    EMUGPU_CHECK(c.host_op_us == 0, kValue,
                 "EMUGPU_HOST_COST and EMUGPU_HOST_OP_US both price the modelled host's ops: expected one of them, got "
                 "both (",
                 brief(*v), " and ", c.host_op_us, " us); unset one");
    c.host_cost_file = *v;
  }
  if (auto v = env("EMUGPU_PCIE_SHARED_BY")) {
    const double k = parse_number(*v, "EMUGPU_PCIE_SHARED_BY", "a GPU count (e.g. 2: two GPUs per PCIe switch)");
    EMUGPU_CHECK(k >= 1 && k <= kMaxDevices && k == std::floor(k), kValue,
                 "EMUGPU_PCIE_SHARED_BY: expected a whole number of GPUs per PCIe uplink from 1 to ", kMaxDevices,
                 ", got '", brief(*v), "'");
    c.pcie_shared_by = static_cast<int>(k);
  }
  if (auto v = env("EMUGPU_PCIE_UPLINK_GBPS")) {
    c.pcie_uplink_gbps =
        parse_rate(*v, "EMUGPU_PCIE_UPLINK_GBPS", "a PCIe uplink rate in GB/s (e.g. 25)", kMaxHostRateGBps);
  }
  if (auto run = env("TORCHELASTIC_RUN_ID")) {
    // One segment per emulated node of one torchrun job. The run id alone
    // does not name a job (torchrun's default is "none" for every job), the
    // rendezvous endpoint does: two live jobs cannot share it.
    const std::string endpoint = env("MASTER_ADDR").value_or("") + ":" + env("MASTER_PORT").value_or("");
    char hash[17];
    std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(fnv1a(*run + "|" + endpoint)));
    c.pcie_segment = private_segment_name(
        "pcie", run->substr(0, 40) + "-" + hash + "-" + env("GROUP_RANK").value_or("0").substr(0, 16));
  }
  c.catalog_path = env("EMUGPU_CATALOG").value_or(default_catalog);
  return c;
}

}  // namespace emugpu
