// emugpud: owns the emulated GPUs of a node for the processes that attach to
// it (EMUGPU_DAEMON=ADDRESS). `torch-emugpu daemon` (or the `emugpud`
// command the package installs) starts it with the package's GPU catalog.
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>

#include "catalog.h"
#include "daemon/custom_policy.h"
#include "daemon/handler.h"
#include "daemon/policy.h"
#include "daemon/server.h"
#include "device.h"
#include "error.h"
#include "mig.h"
#include "share/address.h"

namespace {

using emugpu::share::GpuInfo;

constexpr const char* kUsage =
    "usage: emugpud --catalog PATH [--gpus MODEL[:COUNT]] [--mig LAYOUT] [--listen ADDRESS] [--sharing POLICY]\n"
    "\n"
    "Owns emulated GPUs for the processes that attach to it (EMUGPU_DAEMON=ADDRESS):\n"
    "their allocations together stay within each GPU's memory, and their kernels share\n"
    "each GPU's compute as POLICY says.\n"
    "\n"
    "  --gpus MODEL[:COUNT]  the GPUs, a catalog name or alias and how many (default: A100-SXM4-40GB:1)\n"
    "  --mig LAYOUT          split each GPU into MIG instances, e.g. 3g.40gb,2g.20gb,1g.10gb,1g.10gb\n"
    "                        (nvidia-smi's profile names); each instance is a device of its own\n"
    "  --sharing POLICY      time-slice (the CUDA driver's default between processes), fair, fifo\n"
    "                        (one iteration each in turn, as GPEmu and Salus), priority (EMUGPU_PRIORITY),\n"
    "                        mps (kernels of several processes at once, as NVIDIA's MPS), none (each\n"
    "                        process has the GPU's compute to itself), plugin:PATH.so (a C function,\n"
    "                        csrc/daemon/emugpu_policy.h) or exec:COMMAND (a program answering a line\n"
    "                        per request, custom_policy.h); default: time-slice\n"
    "  --time-slice-us US    time-slice: a slice's length (default 2000)\n"
    "  --context-switch-us US  time-slice: a context switch's cost (default 200)\n"
    "  --mps-overlap F       mps: the fraction of a running kernel's SMs another's still gets (default 0)\n"
    "  --listen ADDRESS      unix:PATH (only this user may attach) or tcp:HOST:PORT\n"
    "                        (default: $XDG_RUNTIME_DIR/emugpud.sock, else /tmp/emugpud-UID.sock)\n"
    "  --catalog PATH        the GPU catalog (gpus.json); torch-emugpu daemon passes the package's\n"
    "\n"
    "It prints one line when it listens and stops cleanly on SIGINT or SIGTERM.\n";

struct Options {
  emugpu::share::SharingConfig sharing;
  std::string catalog;
  std::string gpus = "A100-SXM4-40GB:1";
  std::string mig;
  std::string listen;
};

// A time in microseconds of at least `least`, to nanoseconds.
emugpu::TimeNs microseconds(const std::string& option, const std::string& text, double least) {
  char* end = nullptr;
  const double us = std::strtod(text.c_str(), &end);
  EMUGPU_CHECK(!text.empty() && *end == '\0' && std::isfinite(us) && us >= least && us <= 1e7, kValue,
               "emugpud: ", option, ": expected microseconds from ", least, " to 1e7, got \"", emugpu::echo_input(text),
               "\"");
  return static_cast<emugpu::TimeNs>(us * 1e3);
}

Options parse(int argc, char** argv) {
  Options o;
  const char* env_catalog = std::getenv("EMUGPU_CATALOG");
  if (env_catalog != nullptr) o.catalog = env_catalog;
  o.listen = emugpu::share::default_address();
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    }
    const auto value = [&]() -> std::string {
      EMUGPU_CHECK(i + 1 < argc, kValue, "emugpud: ", arg, " expects a value\n", kUsage);
      return argv[++i];
    };
    if (arg == "--catalog") {
      o.catalog = value();
    } else if (arg == "--gpus") {
      o.gpus = value();
    } else if (arg == "--mig") {
      o.mig = value();
      emugpu::parse_mig_layout(o.mig, "emugpud: --mig");
    } else if (arg == "--listen") {
      o.listen = value();
    } else if (arg == "--sharing") {
      const std::string spec = value();
      if (emugpu::share::is_custom_policy(spec)) {
        o.sharing.policy = emugpu::share::SharingPolicy::kCustom;
        o.sharing.custom = emugpu::share::load_custom_policy(spec);
        o.sharing.custom_name = spec;
      } else {
        o.sharing.policy = emugpu::share::parse_sharing_policy(spec);
      }
    } else if (arg == "--time-slice-us") {
      o.sharing.slice_ns = microseconds(arg, value(), 1);
    } else if (arg == "--context-switch-us") {
      o.sharing.switch_ns = microseconds(arg, value(), 0);
    } else if (arg == "--mps-overlap") {
      const std::string text = value();
      char* end = nullptr;
      const double f = std::strtod(text.c_str(), &end);
      EMUGPU_CHECK(!text.empty() && *end == '\0' && f >= 0 && f <= 1, kValue,
                   "emugpud: --mps-overlap: expected a fraction from 0 to 1, got \"", emugpu::echo_input(text), "\"");
      o.sharing.mps_overlap = f;
    } else {
      EMUGPU_CHECK(false, kValue, "emugpud: unknown argument \"", emugpu::echo_input(arg), "\"\n", kUsage);
    }
  }
  EMUGPU_CHECK(!o.catalog.empty(), kValue, "emugpud: expected --catalog PATH (or EMUGPU_CATALOG); ",
               "`torch-emugpu daemon` passes the package's own");
  return o;
}

std::vector<GpuInfo> gpus_of(const Options& o) {
  std::string model = o.gpus;
  long count = 1;
  if (const auto colon = o.gpus.rfind(':'); colon != std::string::npos) {
    model = o.gpus.substr(0, colon);
    const std::string n = o.gpus.substr(colon + 1);
    char* end = nullptr;
    count = n.empty() ? 0 : std::strtol(n.c_str(), &end, 10);
    EMUGPU_CHECK(!n.empty() && *end == '\0' && count >= 1 && count <= emugpu::share::kMaxGpus, kValue,
                 "emugpud: --gpus: expected MODEL[:COUNT] with COUNT from 1 to ", emugpu::share::kMaxGpus, ", got \"",
                 emugpu::echo_input(o.gpus), "\"");
  }
  const emugpu::Catalog catalog = emugpu::Catalog::from_file(o.catalog);
  const emugpu::GpuSpec& gpu = catalog.find(model);
  const auto layout = o.mig.empty() ? std::vector<std::string>{} : emugpu::parse_mig_layout(o.mig, "emugpud: --mig");
  const auto node = emugpu::node_devices(gpu, static_cast<int>(count), layout);
  EMUGPU_CHECK(node.size() <= emugpu::share::kMaxGpus, kValue, "emugpud: expected at most ", emugpu::share::kMaxGpus,
               " devices (GPUs and MIG instances), got ", node.size(), "; use fewer GPUs or instances");
  std::vector<GpuInfo> out;
  for (const auto& d : node) {
    const std::string profile = d.instance < 0 ? "" : d.spec.mig_profile;
    out.push_back(GpuInfo{gpu.name, emugpu::usable_memory_bytes(d.spec), d.spec.memory_bytes, d.gpu, d.instance,
                          profile, d.uuid});
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options options = parse(argc, argv);
    emugpu::share::Handler handler(gpus_of(options), options.sharing);
    boost::asio::io_context io;
    emugpu::share::Server server(io, handler, emugpu::share::parse_address(options.listen, "--listen"));
    boost::asio::signal_set signals(io, SIGINT, SIGTERM);
    signals.async_wait([&](const boost::system::error_code&, int) { server.stop(); });
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-reply is an error on its socket, not the daemon's end
    const GpuInfo& gpu = handler.gpus().front();
    std::cout << "emugpud: listening on " << server.address() << " with " << handler.gpus().back().gpu + 1 << " x "
              << gpu.name;
    if (options.mig.empty()) {
      std::cout << " (" << emugpu::format_bytes(static_cast<double>(gpu.capacity)) << " each)";
    } else {
      std::cout << " split as MIG " << options.mig << " (" << handler.gpus().size() << " instances)";
    }
    std::cout << ", sharing " << options.sharing.name() << std::endl;
    io.run();
    std::cout << "emugpud: stopped" << std::endl;
    return 0;
  } catch (const emugpu::Error& e) {
    std::cerr << e.what() << std::endl;
    return 2;
  }
}
