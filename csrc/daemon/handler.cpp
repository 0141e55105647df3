#include "daemon/handler.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "error.h"

namespace emugpu::share {

Handler::Handler(std::vector<GpuInfo> gpus, SharingConfig sharing, std::function<TimeNs()> real_now)
    : gpus_(std::move(gpus)), sharing_(sharing), real_now_(std::move(real_now)), used_(gpus_.size(), 0) {
  EMUGPU_CHECK(sharing_.slice_ns > 0 && sharing_.switch_ns >= 0 && sharing_.report_ns > 0 && sharing_.window_ns > 0 &&
                   sharing_.stale_ns > 0,
               kValue,
               "emugpud: expected a positive time slice, report interval, window and staleness and a context "
               "switch >= 0, got ",
               sharing_.slice_ns, ", ", sharing_.report_ns, ", ", sharing_.window_ns, ", ", sharing_.stale_ns, " and ",
               sharing_.switch_ns, " ns");
  EMUGPU_CHECK(!gpus_.empty() && gpus_.size() <= kMaxGpus, kValue, "emugpud: expected 1 to ", kMaxGpus, " GPUs, got ",
               gpus_.size());
}

uint64_t Handler::connect() {
  const uint64_t id = next_id_++;
  Client& c = clients_[id];
  c.bytes.assign(gpus_.size(), 0);
  c.reports.assign(gpus_.size(), {});
  c.reported_at.assign(gpus_.size(), 0);
  c.awaited_since.assign(gpus_.size(), kNoTime);
  c.granted.assign(gpus_.size(), kPpm);
  return id;
}

void Handler::disconnect(uint64_t client) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  for (size_t g = 0; g < gpus_.size(); ++g) used_[g] -= it->second.bytes[g];
  clients_.erase(it);
}

size_t Handler::attached() const {
  size_t n = 0;
  for (const auto& [id, c] : clients_) n += c.attached ? 1 : 0;
  return n;
}

std::vector<uint8_t> Handler::handle(uint64_t client, const Message& m) {
  auto it = clients_.find(client);
  EMUGPU_CHECK(it != clients_.end(), kRuntime, "emugpud: a message from unknown client ", client);
  Client& c = it->second;
  switch (m.type) {
    case MessageType::kHello: return hello(client, c, m);
    case MessageType::kReserve: return reserve(c, m);
    case MessageType::kRelease: return release(c, m);
    case MessageType::kShare: return share(client, c, m);
    case MessageType::kStatus:
      EMUGPU_CHECK(m.payload.empty(), kRuntime, "emugpud protocol: a status request carries no fields, got ",
                   m.payload.size(), " bytes");
      return encode_status(m.id, status());  // also before hello: smi only looks
    default:
      EMUGPU_CHECK(false, kRuntime, "emugpud: client ", client, " sent a ", message_type_name(m.type),
                   " message, which only the daemon sends");
  }
  return {};
}

std::vector<uint8_t> Handler::hello(uint64_t id, Client& c, const Message& m) {
  EMUGPU_CHECK(!c.attached, kRuntime, "emugpud: client ", id, " said hello twice");
  Hello h = decode_hello(m);
  if (h.clock != "real" && h.clock != "virtual") {
    return encode_error(m.id,
                        "emugpud: expected the clock \"real\" or \"virtual\", got \"" + echo_input(h.clock) + "\"");
  }
  // Every attached process runs one clock: their times are compared.
  for (const auto& [other_id, other] : clients_) {
    if (other.attached && other.hello.clock != h.clock) {
      std::ostringstream out;
      out << "emugpud: this process runs the " << h.clock << " clock but process " << other.hello.pid
          << " attached to the same daemon runs the " << other.hello.clock
          << " one; every process sharing emugpud's GPUs must run the same clock: set EMUGPU_CLOCK alike";
      return encode_error(m.id, out.str());
    }
  }
  h.name = valid_utf8(h.name.substr(0, kMaxName));  // smi prints it
  c.attached = true;
  c.hello = std::move(h);
  // A virtual clock joins at the earliest time the others reported: it never
  // runs behind what they already placed (0: none reported).
  TimeNs world = kNoTime;
  const TimeNs real = real_now_();
  for (const auto& [other_id, other] : clients_) {
    for (uint32_t g = 0; g < gpus_.size(); ++g) {
      if (other_id != id && fresh(other, g, real)) world = std::min(world, other.reports[g].now_ns);
    }
  }
  return encode_welcome(
      m.id, {id, gpus_, sharing_.name(), sharing_.report_ns, sharing_.window_ns, world == kNoTime ? 0 : world});
}

std::vector<uint8_t> Handler::reserve(Client& c, const Message& m) {
  EMUGPU_CHECK(c.attached, kRuntime, "emugpud: a reserve request before hello");
  const Bytes b = decode_bytes(m);
  if (b.gpu >= gpus_.size()) {
    return encode_error(
        m.id, "emugpud: expected a GPU index below " + std::to_string(gpus_.size()) + ", got " + std::to_string(b.gpu));
  }
  const GpuInfo& gpu = gpus_[b.gpu];
  if (b.bytes > gpu.capacity || used_[b.gpu] > gpu.capacity - b.bytes) {
    return encode_refused(m.id, {gpu.capacity, used_[b.gpu], c.bytes[b.gpu]});
  }
  used_[b.gpu] += b.bytes;
  c.bytes[b.gpu] += b.bytes;
  return encode(MessageType::kGranted, m.id);
}

std::vector<uint8_t> Handler::release(Client& c, const Message& m) {
  EMUGPU_CHECK(c.attached, kRuntime, "emugpud: a release request before hello");
  const Bytes b = decode_bytes(m);
  if (b.gpu >= gpus_.size() || b.bytes > c.bytes[b.gpu]) {
    return encode_error(m.id, "emugpud: release of " + std::to_string(b.bytes) + " bytes of GPU " +
                                  std::to_string(b.gpu) + ", more than this process holds there");
  }
  used_[b.gpu] -= b.bytes;
  c.bytes[b.gpu] -= b.bytes;
  return encode(MessageType::kReleased, m.id);
}

namespace {

Sharer sharer(const ShareReport& r, int32_t priority) {
  Sharer s{static_cast<double>(r.busy_ppm) / kPpm,   r.iteration_ns, priority,
           static_cast<double>(r.demand_ppm) / kPpm, r.hold_ns,      {}};
  for (size_t i = 0; i < r.bins.size(); ++i) {
    s.bins[i] = {static_cast<double>(r.bins[i].fraction_ppm) / kPpm, static_cast<double>(r.bins[i].demand_ppm) / kPpm,
                 r.bins[i].hold_ns, r.bins[i].kernel_ns, static_cast<double>(r.bins[i].bandwidth_ppm) / kPpm};
  }
  return s;
}

}  // namespace

bool Handler::fresh(const Client& c, uint32_t gpu, TimeNs now) const {
  return c.attached && c.reported_at[gpu] > 0 && now - c.reported_at[gpu] <= sharing_.stale_ns;
}

std::vector<uint8_t> Handler::share(uint64_t id, Client& c, const Message& m) {
  EMUGPU_CHECK(c.attached, kRuntime, "emugpud: a share report before hello");
  const ShareReport r = decode_share(m);
  if (r.gpu >= gpus_.size()) {
    return encode_error(
        m.id, "emugpud: expected a GPU index below " + std::to_string(gpus_.size()) + ", got " + std::to_string(r.gpu));
  }
  const TimeNs now = real_now_();
  if (c.reported_at[r.gpu] == 0 || c.reports[r.gpu].now_ns != r.now_ns) c.awaited_since[r.gpu] = kNoTime;
  c.reports[r.gpu] = r;
  c.reported_at[r.gpu] = now;
  std::vector<Sharer> others;
  TimeNs lowest = kNoTime;
  Client* laggard = nullptr;
  // A fifth of a window: how far ahead pacing lets a clock run (DaemonTimeShare), and how long past its
  // last report a quiet process still shares.
  const TimeNs skew = sharing_.window_ns / 5;
  for (auto& [other_id, other] : clients_) {
    if (other_id == id || !other.attached || other.reported_at[r.gpu] == 0) continue;
    const ShareReport& o = other.reports[r.gpu];
    // Pacing waits for the earliest clock that still moves: one that others
    // have waited on for the clients' patience without moving (a finished
    // process on its way out, one blocked outside the emulator) would hide
    // the next laggard. The patience counts from the first wait, not from
    // its last move or report: a process that sat blocked (on its input,
    // say) before the others ran ahead is still waited for once resumed.
    const TimeNs awaited = other.awaited_since[r.gpu];
    if ((awaited == kNoTime || now - awaited <= sharing_.patience_ns) && o.now_ns < lowest) {
      lowest = o.now_ns;
      laggard = &other;
    }
    if (!fresh(other, r.gpu, now)) continue;
    // A process shares the GPU from this one's time on only while its work
    // may still run then: its queued compute, or a little past its last
    // report. One that went quiet (finished, blocked outside the emulator)
    // stops counting as soon as this one's clock passes that.
    if (o.busy_ppm == 0 || r.now_ns > std::max(o.busy_until_ns, o.now_ns) + skew) continue;
    // One a whole window ahead (a process that joined at a later time and
    // waits for the others' clocks) reported no work at this one's time.
    if (o.now_ns > r.now_ns + sharing_.window_ns) continue;
    others.push_back(sharer(o, other.hello.priority));
  }
  // This process will wait (DaemonTimeShare's pacing): the laggard's patience starts now.
  if (laggard != nullptr && r.now_ns > lowest + skew && laggard->awaited_since[r.gpu] == kNoTime) {
    laggard->awaited_since[r.gpu] = now;
  }
  const Sharer me = sharer(r, c.hello.priority);
  const double rate = compute_share(sharing_, me, others);
  const auto ppm = static_cast<uint32_t>(std::clamp(std::lround(rate * kPpm), 1L, static_cast<long>(kPpm)));
  c.granted[r.gpu] = ppm;
  return encode_share_reply(m.id, {ppm, static_cast<uint32_t>(others.size()), lowest});
}

Status Handler::status() const {
  Status s;
  s.sharing = sharing_.name();
  s.gpus = gpus_;
  s.used = used_;
  const TimeNs now = real_now_();
  for (const auto& [id, c] : clients_) {
    if (!c.attached) continue;
    ClientInfo info{id, c.hello.pid, c.hello.clock, c.hello.name, c.bytes, c.hello.priority, {}, {}};
    for (uint32_t g = 0; g < gpus_.size(); ++g) {
      const bool live = fresh(c, g, now);
      info.busy_ppm.push_back(live ? c.reports[g].busy_ppm : 0);
      info.rate_ppm.push_back(live ? c.granted[g] : kPpm);
    }
    s.clients.push_back(std::move(info));
  }
  return s;
}

}  // namespace emugpu::share
