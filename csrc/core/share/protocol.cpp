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
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    out_.insert(out_.end(), p, p + sizeof(T));
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
    for (const auto& g : gpus) text(g.name).put<uint64_t>(g.capacity).put<uint64_t>(g.total);
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

bool known_type(uint16_t t) { return t >= 1 && t <= static_cast<uint16_t>(MessageType::kError); }

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
  return encode(MessageType::kHello, id, Writer().put<int64_t>(hello.pid).text(hello.clock).text(hello.name).take());
}

std::vector<uint8_t> encode_welcome(uint32_t id, const Welcome& welcome) {
  return encode(MessageType::kWelcome, id, Writer().put<uint64_t>(welcome.client).gpus(welcome.gpus).take());
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
  w.gpus(status.gpus);
  for (size_t i = 0; i < status.gpus.size(); ++i) w.put<uint64_t>(i < status.used.size() ? status.used[i] : 0);
  w.put<uint32_t>(static_cast<uint32_t>(status.clients.size()));
  for (const auto& c : status.clients) {
    w.put<uint64_t>(c.id).put<int64_t>(c.pid).text(c.clock).text(c.name);
    for (size_t i = 0; i < status.gpus.size(); ++i) w.put<uint64_t>(i < c.bytes.size() ? c.bytes[i] : 0);
  }
  return encode(MessageType::kStatusReply, id, w.take());
}

std::vector<uint8_t> encode_error(uint32_t id, const std::string& message) {
  return encode(MessageType::kError, id, Writer().text(message).take());
}

Hello decode_hello(const Message& m) {
  expect(m, MessageType::kHello);
  Reader r(m);
  Hello h;
  h.pid = r.get<int64_t>();
  h.clock = r.text();
  h.name = r.text();
  r.done();
  return h;
}

Welcome decode_welcome(const Message& m) {
  expect(m, MessageType::kWelcome);
  Reader r(m);
  Welcome w;
  w.client = r.get<uint64_t>();
  w.gpus = r.gpus();
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
  s.gpus = r.gpus();
  for (size_t i = 0; i < s.gpus.size(); ++i) s.used.push_back(r.get<uint64_t>());
  s.clients.resize(r.count(kMaxClients, "clients"));
  for (auto& c : s.clients) {
    c.id = r.get<uint64_t>();
    c.pid = r.get<int64_t>();
    c.clock = r.text();
    c.name = r.text();
    for (size_t i = 0; i < s.gpus.size(); ++i) c.bytes.push_back(r.get<uint64_t>());
  }
  r.done();
  return s;
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
