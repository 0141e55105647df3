#include "exchange/frame.h"

#include <algorithm>
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

std::vector<uint8_t> encode_frame_header(FrameKind kind, uint64_t key, size_t length) {
  std::vector<uint8_t> out(kFrameHeaderBytes, 0);
  put<uint32_t>(out, 0, kMagic);
  out[4] = static_cast<uint8_t>(kind);
  put<uint64_t>(out, 8, key);
  put<uint64_t>(out, 16, length);
  return out;
}

std::vector<uint8_t> encode_frame(FrameKind kind, uint64_t key, const void* payload, size_t length) {
  std::vector<uint8_t> out = encode_frame_header(kind, key, length);
  if (length > 0) {  // appended, not zeroed and then overwritten: collectives send megabytes
    out.reserve(kFrameHeaderBytes + length);
    const auto* p = static_cast<const uint8_t*>(payload);
    out.insert(out.end(), p, p + length);
  }
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

namespace {
constexpr size_t kStagingBytes = 64 * 1024;
// Below this much payload to come, a read goes through staging: it may hold
// the next frames too.
constexpr size_t kDirectMinBytes = 16 * 1024;
}  // namespace

std::span<uint8_t> FrameParser::prepare() {
  const bool in_payload = header_have_ == kFrameHeaderBytes;
  if (in_payload && length_ - payload_have_ >= kDirectMinBytes) {
    if (payload_have_ == current_.payload.size()) reserve_payload(std::min(length_ - payload_have_, kStagingBytes));
    direct_ = true;
    return {current_.payload.data() + payload_have_, current_.payload.size() - payload_have_};
  }
  direct_ = false;
  staging_.resize(kStagingBytes);
  return {staging_.data(), staging_.size()};
}

void FrameParser::commit(size_t n) {
  if (!direct_) {
    EMUGPU_CHECK(n <= staging_.size(), kRuntime, "tcp exchange: expected at most ", staging_.size(),
                 " bytes read into staging, got ", n);
    consume(staging_.data(), n);
    return;
  }
  direct_ = false;
  EMUGPU_CHECK(n <= current_.payload.size() - payload_have_, kRuntime, "tcp exchange: expected at most ",
               current_.payload.size() - payload_have_, " bytes read into a payload, got ", n);
  payload_have_ += n;
  if (payload_have_ == length_) frame_complete();
}

void FrameParser::feed(const uint8_t* data, size_t length) {
  direct_ = false;
  consume(data, length);
}

void FrameParser::consume(const uint8_t* data, size_t length) {
  while (length > 0) {
    if (header_have_ < kFrameHeaderBytes) {
      const size_t take = std::min(length, kFrameHeaderBytes - header_have_);
      std::memcpy(header_.data() + header_have_, data, take);
      header_have_ += take;
      data += take;
      length -= take;
      if (header_have_ == kFrameHeaderBytes) header_complete();  // checked as soon as it is whole
      continue;
    }
    const size_t take = std::min(length, length_ - payload_have_);
    if (payload_have_ + take > current_.payload.size()) reserve_payload(take);
    std::memcpy(current_.payload.data() + payload_have_, data, take);
    payload_have_ += take;
    data += take;
    length -= take;
    if (payload_have_ == length_) frame_complete();
  }
}

void FrameParser::header_complete() {
  const uint8_t* h = header_.data();
  const auto magic = get<uint32_t>(h);
  EMUGPU_CHECK(magic == kMagic, kRuntime, "tcp exchange: ", peer_, " sent bytes that are not a frame (magic ", magic,
               "); is something else connected to the exchange's port?");
  EMUGPU_CHECK(known_kind(h[4]) && h[5] == 0 && h[6] == 0 && h[7] == 0, kRuntime, "tcp exchange: ", peer_,
               " sent a frame of unknown kind ", static_cast<int>(h[4]), "; every rank must run the same torch-emugpu");
  const auto length = get<uint64_t>(h + 16);
  EMUGPU_CHECK(length <= kMaxFramePayload, kRuntime, "tcp exchange: ", peer_, " announced a frame of ", length,
               " bytes, expected at most ", kMaxFramePayload);
  current_.kind = static_cast<FrameKind>(h[4]);
  current_.key = get<uint64_t>(h + 8);
  current_.payload.clear();
  length_ = static_cast<size_t>(length);
  payload_have_ = 0;
  if (length_ == 0) frame_complete();
}

void FrameParser::reserve_payload(size_t count) {
  // Up to kEagerPayload at once; beyond it, at most double what arrived, so
  // a header's claim costs memory only as its bytes come.
  const size_t want = payload_have_ + count;
  const size_t grown = std::max(want, std::min(length_, std::max(kEagerPayload, 2 * current_.payload.size())));
  current_.payload.resize(std::min(grown, length_));
}

void FrameParser::frame_complete() {
  current_.payload.resize(length_);
  ready_.push_back(std::move(current_));
  current_ = Frame{};
  header_have_ = 0;
  length_ = 0;
  payload_have_ = 0;
}

bool FrameParser::next(Frame& out) {
  if (ready_.empty()) return false;
  out = std::move(ready_.front());
  ready_.pop_front();
  return true;
}

size_t FrameParser::pending() const { return header_have_ + (header_have_ == kFrameHeaderBytes ? payload_have_ : 0); }

}  // namespace emugpu
