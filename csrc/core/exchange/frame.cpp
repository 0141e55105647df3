#include "exchange/frame.h"

#include <cstring>

#include "error.h"

namespace emugpu {

namespace {
constexpr uint32_t kMagic = 0x55474d45;  // "EMGU"

template <typename T>
void put(std::vector<uint8_t>& out, size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(T));  // the platforms we build for are little-endian
}

template <typename T>
T get(const uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

bool known_kind(uint8_t k) { return k >= 1 && k <= 4; }
}  // namespace

std::vector<uint8_t> encode_frame(FrameKind kind, uint64_t key, const void* payload, size_t length) {
  std::vector<uint8_t> out(kFrameHeaderBytes + length, 0);
  put<uint32_t>(out, 0, kMagic);
  out[4] = static_cast<uint8_t>(kind);
  put<uint64_t>(out, 8, key);
  put<uint64_t>(out, 16, length);
  if (length > 0) std::memcpy(out.data() + kFrameHeaderBytes, payload, length);
  return out;
}

std::vector<uint8_t> encode_hello(const Hello& hello) {
  std::vector<uint8_t> body(20);
  put<uint32_t>(body, 0, hello.version);
  put<int32_t>(body, 4, hello.rank);
  put<int32_t>(body, 8, hello.size);
  put<uint64_t>(body, 12, hello.token);
  return encode_frame(FrameKind::kHello, 0, body.data(), body.size());
}

Hello decode_hello(const Frame& frame) {
  EMUGPU_CHECK(frame.kind == FrameKind::kHello && frame.payload.size() == 20, kRuntime,
               "tcp exchange: expected a hello frame of 20 bytes first, got kind ", static_cast<int>(frame.kind),
               " with ", frame.payload.size(), " bytes");
  Hello h;
  const uint8_t* p = frame.payload.data();
  h.version = get<uint32_t>(p);
  h.rank = get<int32_t>(p + 4);
  h.size = get<int32_t>(p + 8);
  h.token = get<uint64_t>(p + 12);
  EMUGPU_CHECK(h.version == Hello::kVersion, kRuntime, "tcp exchange: expected protocol version ", Hello::kVersion,
               ", got ", h.version, "; every rank must run the same torch-emugpu");
  return h;
}

std::vector<int64_t> decode_words(const Frame& frame, int count) {
  EMUGPU_CHECK(frame.payload.size() == static_cast<size_t>(count) * 8, kRuntime, "tcp exchange: expected ", count,
               " words (", count * 8, " bytes) in gather ", frame.key, ", got ", frame.payload.size(),
               " bytes; every rank must run the same torch-emugpu and call the same collectives");
  std::vector<int64_t> words(static_cast<size_t>(count));
  if (count > 0) std::memcpy(words.data(), frame.payload.data(), frame.payload.size());
  return words;
}

void FrameParser::feed(const uint8_t* data, size_t length) {
  if (consumed_ > 0 && consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  }
  buffer_.insert(buffer_.end(), data, data + length);
  header_ready_locked();  // checks the header as soon as it is whole
}

bool FrameParser::header_ready_locked() {
  if (buffer_.size() - consumed_ < kFrameHeaderBytes) return false;
  const uint8_t* h = buffer_.data() + consumed_;
  const auto magic = get<uint32_t>(h);
  EMUGPU_CHECK(magic == kMagic, kRuntime, "tcp exchange: ", peer_, " sent bytes that are not a frame (magic ", magic,
               "); is something else connected to the exchange's port?");
  EMUGPU_CHECK(known_kind(h[4]) && h[5] == 0 && h[6] == 0 && h[7] == 0, kRuntime, "tcp exchange: ", peer_,
               " sent a frame of unknown kind ", static_cast<int>(h[4]), "; every rank must run the same torch-emugpu");
  const auto length = get<uint64_t>(h + 16);
  EMUGPU_CHECK(length <= kMaxFramePayload, kRuntime, "tcp exchange: ", peer_, " announced a frame of ", length,
               " bytes, expected at most ", kMaxFramePayload);
  return true;
}

bool FrameParser::next(Frame& out) {
  if (!header_ready_locked()) return false;
  const uint8_t* h = buffer_.data() + consumed_;
  const auto length = static_cast<size_t>(get<uint64_t>(h + 16));
  if (buffer_.size() - consumed_ - kFrameHeaderBytes < length) return false;
  out.kind = static_cast<FrameKind>(h[4]);
  out.key = get<uint64_t>(h + 8);
  out.payload.assign(h + kFrameHeaderBytes, h + kFrameHeaderBytes + length);
  consumed_ += kFrameHeaderBytes + length;
  if (consumed_ == buffer_.size()) {
    buffer_.clear();
    consumed_ = 0;
  } else if (consumed_ > (size_t{1} << 20) && consumed_ > buffer_.size() / 2) {
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(consumed_));
    consumed_ = 0;
  }
  return true;
}

}  // namespace emugpu
