#include "share/protocol.h"

#include <cstring>

#include "error.h"

namespace emugpu::share {

namespace {

// Appends fields to a payload (the platforms we build for are little-endian).
class Writer {
 public:
  template <typename T>
  Writer& put(T value) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &value, sizeof(T));
    return *this;
  }
  Writer& text(const std::string& s) {
    const auto n = static_cast<uint32_t>(std::min<size_t>(s.size(), kMaxString));  // longer names are cut
    put<uint32_t>(n);
    out_.insert(out_.end(), s.begin(), s.begin() + n);
    return *this;
  }
  Writer& gpus(const std::vector<GpuInfo>& gpus) {
    put<uint32_t>(static_cast<uint32_t>(gpus.size()));
    for (const auto& g : gpus) {
      text(g.name).put<uint64_t>(g.capacity).put<uint64_t>(g.total);
      put<int32_t>(g.gpu).put<int32_t>(g.instance).text(g.mig_profile).text(g.uuid);
    }
    return *this;
  }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  std::vector<uint8_t> out_;
};

// Reads fields of one message's payload; every read checks what is left.
class Reader {
 public:
  explicit Reader(const Message& m) : m_(m) {}
  template <typename T>
  T get() {
    need(sizeof(T), "a field");
    T value;
    std::memcpy(&value, m_.payload.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return value;
  }
  std::string text() {
    const auto n = get<uint32_t>();
    EMUGPU_CHECK(n <= kMaxString, kRuntime, "emugpud protocol: expected a string of at most ", kMaxString,
                 " bytes in a ", message_type_name(m_.type), " message, got ", n);
    need(n, "a string");
    std::string s(reinterpret_cast<const char*>(m_.payload.data() + at_), n);
    at_ += n;
    return s;
  }
  uint32_t count(uint32_t limit, const char* what) {
    const auto n = get<uint32_t>();
    EMUGPU_CHECK(n <= limit, kRuntime, "emugpud protocol: expected at most ", limit, " ", what, " in a ",
                 message_type_name(m_.type), " message, got ", n);
    return n;
  }
  std::vector<GpuInfo> gpus() {
    std::vector<GpuInfo> out(count(kMaxGpus, "GPUs"));
    for (auto& g : out) {
      g.name = text();
      g.capacity = get<uint64_t>();
      g.total = get<uint64_t>();
      g.gpu = get<int32_t>();
      g.instance = get<int32_t>();
      EMUGPU_CHECK(g.gpu >= 0 && g.gpu < static_cast<int32_t>(kMaxGpus) && g.instance >= -1 &&
                       g.instance < static_cast<int32_t>(kMaxGpus),
                   kRuntime, "emugpud protocol: expected a GPU index below ", kMaxGpus,
                   " and an instance index from -1 (whole GPU), got ", g.gpu, " and ", g.instance);
      g.mig_profile = text();
      g.uuid = text();
    }
    return out;
  }
  void done() const {
    EMUGPU_CHECK(at_ == m_.payload.size(), kRuntime, "emugpud protocol: a ", message_type_name(m_.type), " message of ",
                 m_.payload.size(), " bytes has ", m_.payload.size() - at_, " bytes after its fields");
  }

 private:
  void need(size_t n, const char* what) const {
    EMUGPU_CHECK(n <= m_.payload.size() - at_, kRuntime, "emugpud protocol: a ", message_type_name(m_.type),
                 " message of ", m_.payload.size(), " bytes ends inside ", what, " at byte ", at_);
  }
  const Message& m_;
  size_t at_ = 0;
};

void expect(const Message& m, MessageType type) {
  EMUGPU_CHECK(m.type == type, kRuntime, "emugpud protocol: expected a ", message_type_name(type), " message, got ",
               message_type_name(m.type));
}

bool known_type(uint16_t t) { return t >= 1 && t <= static_cast<uint16_t>(MessageType::kShareReply); }

// A fraction in millionths, at most one.
uint32_t ppm(Reader& r, const char* what) {
  const auto v = r.get<uint32_t>();
  EMUGPU_CHECK(v <= kPpm, kRuntime, "emugpud protocol: expected ", what, " of at most ", kPpm, " millionths, got ", v);
  return v;
}

template <typename T>
T load(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

}  // namespace

const char* message_type_name(MessageType type) {
  switch (type) {
    case MessageType::kHello: return "hello";
    case MessageType::kWelcome: return "welcome";
    case MessageType::kReserve: return "reserve";
    case MessageType::kGranted: return "granted";
    case MessageType::kRefused: return "refused";
    case MessageType::kRelease: return "release";
    case MessageType::kReleased: return "released";
    case MessageType::kStatus: return "status";
    case MessageType::kStatusReply: return "status reply";
    case MessageType::kError: return "error";
    case MessageType::kShare: return "share";
    case MessageType::kShareReply: return "share reply";
  }
  return "unknown";
}

std::vector<uint8_t> encode(MessageType type, uint32_t id, const std::vector<uint8_t>& payload) {
  EMUGPU_CHECK(payload.size() <= kMaxPayload, kRuntime, "emugpud protocol: a ", message_type_name(type), " message of ",
               payload.size(), " bytes is over the limit of ", kMaxPayload);
  std::vector<uint8_t> out(kHeaderBytes + payload.size());
  const uint16_t version = kVersion, kind = static_cast<uint16_t>(type);
  const auto length = static_cast<uint32_t>(payload.size());
  std::memcpy(out.data(), &kMagic, 4);  // the platforms we build for are little-endian
  std::memcpy(out.data() + 4, &version, 2);
  std::memcpy(out.data() + 6, &kind, 2);
  std::memcpy(out.data() + 8, &id, 4);
  std::memcpy(out.data() + 12, &length, 4);
  if (!payload.empty()) std::memcpy(out.data() + kHeaderBytes, payload.data(), payload.size());
  return out;
}

std::vector<uint8_t> encode_hello(uint32_t id, const Hello& hello) {
  return encode(
      MessageType::kHello, id,
      Writer().put<int64_t>(hello.pid).text(hello.clock).text(hello.name).put<int32_t>(hello.priority).take());
}

std::vector<uint8_t> encode_welcome(uint32_t id, const Welcome& welcome) {
  return encode(MessageType::kWelcome, id,
                Writer()
                    .put<uint64_t>(welcome.client)
                    .gpus(welcome.gpus)
                    .text(welcome.sharing)
                    .put<int64_t>(welcome.report_ns)
                    .put<int64_t>(welcome.window_ns)
                    .put<int64_t>(welcome.now_ns)
                    .take());
}

std::vector<uint8_t> encode_bytes(MessageType type, uint32_t id, const Bytes& bytes) {
  return encode(type, id, Writer().put<uint32_t>(bytes.gpu).put<uint64_t>(bytes.bytes).take());
}

std::vector<uint8_t> encode_refused(uint32_t id, const Refused& r) {
  return encode(MessageType::kRefused, id,
                Writer().put<uint64_t>(r.capacity).put<uint64_t>(r.used).put<uint64_t>(r.mine).take());
}

std::vector<uint8_t> encode_status(uint32_t id, const Status& status) {
  Writer w;
  w.text(status.sharing).gpus(status.gpus);
  for (size_t i = 0; i < status.gpus.size(); ++i) w.put<uint64_t>(i < status.used.size() ? status.used[i] : 0);
  w.put<uint32_t>(static_cast<uint32_t>(status.clients.size()));
  for (const auto& c : status.clients) {
    w.put<uint64_t>(c.id).put<int64_t>(c.pid).text(c.clock).text(c.name);
    w.put<int32_t>(c.priority);
    for (size_t i = 0; i < status.gpus.size(); ++i) {
      w.put<uint64_t>(i < c.bytes.size() ? c.bytes[i] : 0)
          .put<uint32_t>(i < c.busy_ppm.size() ? c.busy_ppm[i] : 0)
          .put<uint32_t>(i < c.rate_ppm.size() ? c.rate_ppm[i] : kPpm);
    }
  }
  return encode(MessageType::kStatusReply, id, w.take());
}

std::vector<uint8_t> encode_error(uint32_t id, const std::string& message) {
  return encode(MessageType::kError, id, Writer().text(message).take());
}

std::vector<uint8_t> encode_share(uint32_t id, const ShareReport& r) {
  Writer w;
  w.put<uint32_t>(r.gpu)
      .put<uint32_t>(r.busy_ppm)
      .put<int64_t>(r.iteration_ns)
      .put<int64_t>(r.now_ns)
      .put<int64_t>(r.busy_until_ns)
      .put<uint32_t>(r.demand_ppm)
      .put<int64_t>(r.hold_ns);
  for (const auto& b : r.bins) {
    w.put<uint32_t>(b.fraction_ppm).put<uint32_t>(b.demand_ppm).put<int64_t>(b.hold_ns).put<int64_t>(b.kernel_ns);
    w.put<uint32_t>(b.bandwidth_ppm);
  }
  return encode(MessageType::kShare, id, w.take());
}

std::vector<uint8_t> encode_share_reply(uint32_t id, const ShareGrant& g) {
  return encode(MessageType::kShareReply, id,
                Writer().put<uint32_t>(g.rate_ppm).put<uint32_t>(g.sharers).put<int64_t>(g.lowest_now).take());
}

Hello decode_hello(const Message& m) {
  expect(m, MessageType::kHello);
  Reader r(m);
  Hello h;
  h.pid = r.get<int64_t>();
  h.clock = r.text();
  h.name = r.text();
  h.priority = r.get<int32_t>();
  r.done();
  return h;
}

Welcome decode_welcome(const Message& m) {
  expect(m, MessageType::kWelcome);
  Reader r(m);
  Welcome w;
  w.client = r.get<uint64_t>();
  w.gpus = r.gpus();
  w.sharing = r.text();
  w.report_ns = r.get<int64_t>();
  w.window_ns = r.get<int64_t>();
  w.now_ns = r.get<int64_t>();
  EMUGPU_CHECK(w.report_ns > 0 && w.window_ns > 0, kRuntime,
               "emugpud protocol: expected positive share report and window times in a welcome, got ", w.report_ns,
               " and ", w.window_ns, " ns");
  r.done();
  return w;
}

Bytes decode_bytes(const Message& m) {
  EMUGPU_CHECK(m.type == MessageType::kReserve || m.type == MessageType::kRelease, kRuntime,
               "emugpud protocol: expected a reserve or release message, got ", message_type_name(m.type));
  Reader r(m);
  Bytes b;
  b.gpu = r.get<uint32_t>();
  b.bytes = r.get<uint64_t>();
  r.done();
  return b;
}

Refused decode_refused(const Message& m) {
  expect(m, MessageType::kRefused);
  Reader r(m);
  Refused out;
  out.capacity = r.get<uint64_t>();
  out.used = r.get<uint64_t>();
  out.mine = r.get<uint64_t>();
  r.done();
  return out;
}

Status decode_status(const Message& m) {
  expect(m, MessageType::kStatusReply);
  Reader r(m);
  Status s;
  s.sharing = r.text();
  s.gpus = r.gpus();
  for (size_t i = 0; i < s.gpus.size(); ++i) s.used.push_back(r.get<uint64_t>());
  s.clients.resize(r.count(kMaxClients, "clients"));
  for (auto& c : s.clients) {
    c.id = r.get<uint64_t>();
    c.pid = r.get<int64_t>();
    c.clock = r.text();
    c.name = r.text();
    c.priority = r.get<int32_t>();
    for (size_t i = 0; i < s.gpus.size(); ++i) {
      c.bytes.push_back(r.get<uint64_t>());
      c.busy_ppm.push_back(ppm(r, "a busy fraction"));
      c.rate_ppm.push_back(ppm(r, "a share"));
    }
  }
  r.done();
  return s;
}

ShareReport decode_share(const Message& m) {
  expect(m, MessageType::kShare);
  Reader r(m);
  ShareReport out;
  out.gpu = r.get<uint32_t>();
  out.busy_ppm = ppm(r, "a busy fraction");
  out.iteration_ns = r.get<int64_t>();
  out.now_ns = r.get<int64_t>();
  out.busy_until_ns = r.get<int64_t>();
  out.demand_ppm = ppm(r, "an SM demand");
  out.hold_ns = r.get<int64_t>();
  EMUGPU_CHECK(out.iteration_ns >= 0 && out.hold_ns >= 0, kRuntime,
               "emugpud protocol: expected iteration and block hold times >= 0 ns in a share report, got ",
               out.iteration_ns, " and ", out.hold_ns);
  uint64_t fractions = 0;
  for (auto& b : out.bins) {
    b.fraction_ppm = ppm(r, "a demand bin's fraction");
    b.demand_ppm = ppm(r, "a demand bin's SM demand");
    b.hold_ns = r.get<int64_t>();
    b.kernel_ns = r.get<int64_t>();
    b.bandwidth_ppm = ppm(r, "a demand bin's bandwidth share");
    EMUGPU_CHECK(b.hold_ns >= 0 && b.kernel_ns >= 0, kRuntime,
                 "emugpud protocol: expected a demand bin's block hold time and kernel duration >= 0 ns in a share "
                 "report, got ",
                 b.hold_ns, " and ", b.kernel_ns);
    fractions += b.fraction_ppm;
  }
  // Rounded millionths of fractions that add up to one.
  EMUGPU_CHECK(fractions <= kPpm + out.bins.size(), kRuntime,
               "emugpud protocol: expected demand bin fractions that add up to at most 1 in a share report, got ",
               static_cast<double>(fractions) / kPpm);
  r.done();
  return out;
}

ShareGrant decode_share_reply(const Message& m) {
  expect(m, MessageType::kShareReply);
  Reader r(m);
  ShareGrant out;
  out.rate_ppm = ppm(r, "a share");
  out.sharers = r.get<uint32_t>();
  out.lowest_now = r.get<int64_t>();
  EMUGPU_CHECK(out.rate_ppm > 0, kRuntime, "emugpud protocol: expected a share above 0 in a share reply, got 0");
  r.done();
  return out;
}

std::string decode_error(const Message& m) {
  expect(m, MessageType::kError);
  Reader r(m);
  std::string text = r.text();
  r.done();
  return text;
}

void Parser::feed(const uint8_t* data, size_t length) {
  buffer_.insert(buffer_.end(), data, data + length);
  size_t at = 0;
  while (buffer_.size() - at >= kHeaderBytes) {
    const uint8_t* h = buffer_.data() + at;
    const auto magic = load<uint32_t>(h);
    const auto version = load<uint16_t>(h + 4);
    const auto type = load<uint16_t>(h + 6);
    const auto length_field = load<uint32_t>(h + 12);
    EMUGPU_CHECK(magic == kMagic, kRuntime, "emugpud protocol: ", peer_,
                 " sent bytes that are not a message (expected the magic 0x", std::hex, kMagic, ", got 0x", magic,
                 std::dec, "); is it an emugpud client or daemon?");
    EMUGPU_CHECK(version == kVersion, kRuntime, "emugpud protocol: ", peer_, " speaks version ", version,
                 ", this side version ", kVersion, "; run the same torch-emugpu on both sides");
    EMUGPU_CHECK(known_type(type), kRuntime, "emugpud protocol: ", peer_, " sent a message of unknown type ", type);
    EMUGPU_CHECK(length_field <= kMaxPayload, kRuntime, "emugpud protocol: ", peer_, " announced a message of ",
                 length_field, " bytes, over the limit of ", kMaxPayload);
    if (buffer_.size() - at - kHeaderBytes < length_field) break;
    Message m;
    m.type = static_cast<MessageType>(type);
    m.id = load<uint32_t>(h + 8);
    m.payload.assign(h + kHeaderBytes, h + kHeaderBytes + length_field);
    ready_.push_back(std::move(m));
    at += kHeaderBytes + length_field;
  }
  buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(at));
}

bool Parser::next(Message& out) {
  if (ready_.empty()) return false;
  out = std::move(ready_.front());
  ready_.pop_front();
  return true;
}

}  // namespace emugpu::share
