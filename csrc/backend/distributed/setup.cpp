#include "backend/distributed/setup.h"

#include <c10/util/Exception.h>
#include <netdb.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "backend/runtime.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/shm_segment.h"

namespace emugpu {

namespace {

using Steady = std::chrono::steady_clock;

std::string seconds_text(std::chrono::nanoseconds t) {
  std::ostringstream out;
  out << static_cast<double>(t.count()) / 1e9;
  return out.str();
}

std::string random_hex(size_t digits) {
  static thread_local std::mt19937_64 engine{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < digits; ++i) out += hex[engine() & 15];
  return out;
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// An environment integer torchrun sets, or nothing; below `minimum` (or not a number) is an error.
std::optional<int64_t> env_int(const char* name, int64_t minimum) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  const bool number = end != value && *end == '\0';
  TORCH_CHECK_VALUE(number && parsed >= minimum, "emu backend: ", name,
                    " (set by torchrun) expected an integer >= ", minimum, ", got '", value, "'");
  return parsed;
}

uint64_t fnv(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

// Which pid namespace this process runs in (a rank that exits is noticed by its pid).
int64_t pid_namespace() {
  char link[256];
  const ssize_t n = readlink("/proc/self/ns/pid", link, sizeof(link) - 1);
  if (n <= 0) return getpid();  // unknown: counts as a namespace of its own
  return static_cast<int64_t>(fnv(std::string(link, static_cast<size_t>(n))) >> 8);
}

c10::intrusive_ptr<c10d::Store> underlying(c10::intrusive_ptr<c10d::Store> store) {
  while (auto* prefix = dynamic_cast<c10d::PrefixStore*>(store.get())) store = prefix->getUnderlyingStore();
  return store;
}

}  // namespace

std::vector<int64_t> gather_setup_words(Transport& transport, const std::vector<int64_t>& words,
                                        std::chrono::nanoseconds timeout, const std::string& what) {
  std::vector<int64_t> out(static_cast<size_t>(transport.size()) * words.size());
  try {
    const uint64_t ticket = transport.start_gather(words.data(), static_cast<int>(words.size()), timeout);
    transport.finish_gather(ticket, out.data(), static_cast<int>(words.size()), timeout);
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError,
                    "emu backend: rank " + std::to_string(transport.rank()) + " of " +
                        std::to_string(transport.size()) + ": " + what +
                        " failed: another rank exited or did not arrive within the process "
                        "group's timeout (" +
                        seconds_text(timeout) +
                        " s). Check the other ranks' output for their error. Transport said: " + e.what());
  }
  return out;
}

void check_layout(int size) {
  const auto local = env_int("LOCAL_WORLD_SIZE", 1);
  const auto local_rank = env_int("LOCAL_RANK", 0);
  const int devices = Runtime::get().device_count();
  const char* fix = "set EMUGPU_DEVICE_COUNT to LOCAL_WORLD_SIZE or more (unset, it defaults to LOCAL_WORLD_SIZE)";
  TORCH_CHECK_VALUE(!local || *local <= devices,
                    "emu backend: expected an emulated GPU per rank of the node "
                    "(LOCAL_WORLD_SIZE=",
                    *local, "), got ", devices, " emulated device(s); ", fix);
  TORCH_CHECK_VALUE(!local_rank || *local_rank < devices, "emu backend: LOCAL_RANK=", *local_rank,
                    " expected an emulated device emugpu:", *local_rank, ", got ", devices, " emulated device(s); ",
                    fix);
  const auto world = env_int("WORLD_SIZE", 1);
  // The default group (a subgroup may span nodes partly) is whole nodes.
  TORCH_CHECK_VALUE(!local || !world || size != *world || size % *local == 0,
                    "emu backend: expected whole nodes of LOCAL_WORLD_SIZE=", *local,
                    " ranks (torchrun's --nproc-per-node), got a world of ", size,
                    "; make WORLD_SIZE a multiple of LOCAL_WORLD_SIZE");
}

std::string fresh_namespace(c10d::Store& store, int rank, int size, std::chrono::milliseconds timeout) {
  if (size == 1) return random_hex(32);
  const auto deadline = Steady::now() + timeout;
  auto too_late = [&](const std::string& waiting_for) {
    C10_THROW_ERROR(DistBackendError, "emu backend: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                                          ": process group set-up failed: " + waiting_for +
                                          " did not arrive within the process group's timeout (" +
                                          seconds_text(timeout) +
                                          " s). Check the other ranks' output for their "
                                          "error.");
  };
  if (rank != 0) {
    const std::string nonce = random_hex(32);
    store.set("hello/" + std::to_string(rank), bytes(nonce));
    const std::string welcome = "welcome/" + std::to_string(rank) + "/" + nonce;
    while (!store.check({welcome})) {  // polled: Ctrl-C must reach a rank whose rank 0 never comes
      if (Steady::now() > deadline) too_late("rank 0");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      check_wait_interrupt();
    }
    const std::string name = text(store.get(welcome));
    store.set(name + "/joined/" + std::to_string(rank), bytes("1"));
    return name;
  }
  const std::string name = random_hex(32);
  std::map<int, std::string> answered;
  std::set<int> waiting;
  for (int r = 1; r < size; ++r) waiting.insert(r);
  while (!waiting.empty()) {
    for (auto it = waiting.begin(); it != waiting.end();) {
      const std::string r = std::to_string(*it);
      if (store.check({name + "/joined/" + r})) {
        it = waiting.erase(it);
        continue;
      }
      if (store.check({"hello/" + r})) {
        const std::string nonce = text(store.get("hello/" + r));
        if (answered[*it] != nonce) {  // a stale request is answered too, to no one
          store.set("welcome/" + r + "/" + nonce, bytes(name));
          answered[*it] = nonce;
        }
      }
      ++it;
    }
    if (waiting.empty()) break;
    if (Steady::now() > deadline) {
      std::string list;
      for (int r : waiting) list += (list.empty() ? "rank " : ", ") + std::to_string(r);
      too_late(list);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    check_wait_interrupt();
  }
  return name;
}

std::string listen_address(const c10::intrusive_ptr<c10d::Store>& store) {
  const auto base = underlying(store);
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(base.get())) {
    const std::string address = TcpTransport::address_towards(tcp->getHost());
    if (!address.empty()) return address;
  }
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) == 0) {
    const std::string address = TcpTransport::address_towards(host);
    if (!address.empty()) return address;
  }
  return "127.0.0.1";
}

std::shared_ptr<ShmExchange> shared_memory(c10d::Store& store, int rank, int size, Transport& tcp,
                                           std::chrono::nanoseconds timeout) {
  const ExchangeTransport wanted = Runtime::get().config().exchange;
  if (size == 1 || wanted == ExchangeTransport::kTcp) return nullptr;
  std::shared_ptr<ShmExchange> shm;
  std::string name;
  if (rank == 0) {
    sweep_stale_segments();  // what SIGKILLed groups of this user left behind
    name = private_segment_name("x", random_hex(32));
    const uint64_t token = std::stoull(random_hex(15), nullptr, 16);
    try {
      shm = ShmExchange::create(name, size, token);
      unlink_on_sigterm(name);
    } catch (const Error&) {
      name.clear();
    }
    store.set("segment", bytes(name + " " + std::to_string(token)));
  } else {
    const std::string segment = text(store.get("segment"));
    const size_t space = segment.find(' ');
    name = segment.substr(0, space);
    uint64_t token = 0;
    try {
      token = std::stoull(segment.substr(space == std::string::npos ? segment.size() : space + 1));
    } catch (const std::exception&) {
      name.clear();  // not rank 0's words: fall back to TCP
    }
    if (!name.empty()) {
      try {
        shm = ShmExchange::open(name, rank, size, token);
      } catch (const Error&) {
        shm = nullptr;
      }
    }
  }
  // Rank 0 removes the name once every rank opened it, or when set-up fails
  // (a rank that died in set-up must not leave it behind).
  struct Unlink {
    std::string name;
    ~Unlink() {
      if (name.empty()) return;
      ShmExchange::unlink(name);
      forget_on_sigterm(name);
    }
  } unlink_after{rank == 0 ? name : std::string()};
  const std::vector<int64_t> words = gather_setup_words(tcp, {shm != nullptr ? 1 : 0, pid_namespace()}, timeout,
                                                        "process group set-up (shared memory)");
  std::vector<int> missing;
  bool one_namespace = true;
  for (int r = 0; r < size; ++r) {
    if (words[static_cast<size_t>(2 * r)] == 0) missing.push_back(r);
    one_namespace = one_namespace && words[static_cast<size_t>(2 * r + 1)] == words[1];
  }
  if (missing.empty() && one_namespace) return shm;
  if (wanted == ExchangeTransport::kShm) {
    std::string why = "the ranks run in different pid namespaces";
    if (!missing.empty()) {
      std::string list;
      for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
      why = "rank(s) [" + list + "] could not open rank 0's segment (another machine, or another /dev/shm)";
    }
    TORCH_CHECK_VALUE(false,
                      "emu backend: EMUGPU_EXCHANGE=shm expected every rank of the group on this machine, "
                      "but ",
                      why, "; unset EMUGPU_EXCHANGE (auto) or set it to tcp");
  }
  return nullptr;
}

int64_t node_key() {
  const char* value = std::getenv("GROUP_RANK");
  if (value == nullptr) return -1;
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  return end != value && *end == '\0' ? parsed : -1;
}

int64_t clock_key() {
  const std::string boot = read_file("/proc/sys/kernel/random/boot_id");
  std::ostringstream parts;
  parts << boot << '|' << read_file("/proc/self/timens_offsets");
  if (boot.empty()) {  // no boot id to compare: trust nothing, measure
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    parts << '|' << getpid() << host;
  }
  return static_cast<int64_t>(fnv(parts.str()));
}

GroupTopology topology(const std::vector<int64_t>& nodes_of_ranks, int size) {
  if (std::find(nodes_of_ranks.begin(), nodes_of_ranks.end(), -1) != nodes_of_ranks.end()) {
    int local = size;
    if (const char* text = std::getenv("LOCAL_WORLD_SIZE")) local = std::atoi(text);
    const int per_node = local > 0 && local <= size && size % local == 0 ? local : size;
    return {per_node, size / per_node};
  }
  std::map<int64_t, int> counts;
  for (int64_t n : nodes_of_ranks) ++counts[n];
  int smallest = size;
  for (const auto& [node, count] : counts) smallest = std::min(smallest, count);
  // The cost model needs whole, equal nodes; for uneven ones, the largest
  // equal split no wider than the smallest node never hides a network hop.
  int per_node = 1;
  for (int d = 1; d <= smallest; ++d) {
    if (size % d == 0) per_node = d;
  }
  return {per_node, size / per_node};
}

TimeNs align_clocks(TcpTransport& tcp, Transport& words, const std::vector<int64_t>& clock_keys, int rank,
                    std::chrono::nanoseconds timeout) {
  if (std::all_of(clock_keys.begin(), clock_keys.end(), [&](int64_t k) { return k == clock_keys[0]; })) return 0;
  std::map<int64_t, int> leaders;
  for (int r = 0; r < static_cast<int>(clock_keys.size()); ++r) leaders.emplace(clock_keys[static_cast<size_t>(r)], r);
  constexpr int kRounds = 16;
  const int64_t mine_key = clock_keys[static_cast<size_t>(rank)];
  int64_t mine = 0;
  try {
    if (rank == 0) {
      for (const auto& [key, leader] : leaders) {
        if (key != clock_keys[0]) serve_clock(tcp, leader, host_now, kRounds, timeout);
      }
    } else if (leaders[mine_key] == rank && mine_key != clock_keys[0]) {
      mine = measure_clock_offset(tcp, 0, host_now, kRounds, timeout);
    }
  } catch (const Error& e) {
    C10_THROW_ERROR(DistBackendError, std::string("emu backend: rank ") + std::to_string(rank) +
                                          ": process group set-up (clock offsets) failed: " + e.what());
  }
  const std::vector<int64_t> offsets =
      gather_setup_words(words, {mine}, timeout, "process group set-up (clock offsets)");
  return offsets[static_cast<size_t>(leaders[mine_key])];
}

}  // namespace emugpu
