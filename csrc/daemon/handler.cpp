#include "daemon/handler.h"

#include <sstream>
#include <utility>

#include "error.h"

namespace emugpu::share {

Handler::Handler(std::vector<GpuInfo> gpus) : gpus_(std::move(gpus)), used_(gpus_.size(), 0) {
  EMUGPU_CHECK(!gpus_.empty() && gpus_.size() <= kMaxGpus, kValue, "emugpud: expected 1 to ", kMaxGpus, " GPUs, got ",
               gpus_.size());
}

uint64_t Handler::connect() {
  const uint64_t id = next_id_++;
  clients_[id].bytes.assign(gpus_.size(), 0);
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
  return encode_welcome(m.id, {id, gpus_});
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

Status Handler::status() const {
  Status s;
  s.gpus = gpus_;
  s.used = used_;
  for (const auto& [id, c] : clients_) {
    if (!c.attached) continue;
    s.clients.push_back({id, c.hello.pid, c.hello.clock, c.hello.name, c.bytes});
  }
  return s;
}

}  // namespace emugpu::share
