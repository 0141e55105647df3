// The TCP transport's wire format, as pure functions: a fixed header
//   magic u32 | kind u8 | 3 zero bytes | key u64 | length u64   (little-endian)
// then `length` payload bytes. `key` is a gather's ticket or a channel's
// tag. The parser is fed whatever the socket delivered and hands out whole
// frames; a peer that sends garbage or truncated frames makes it throw
// emugpu::Error, never crash or allocate what the peer claims.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace emugpu {

enum class FrameKind : uint8_t {
  kHello = 1,    // payload: version u32, rank i32, size i32, group token u64
  kWords = 2,    // key: word-gather ticket; payload: int64 words
  kBytes = 3,    // key: byte-gather ticket; payload: the rank's bytes
  kMessage = 4,  // key: channel; payload: a point-to-point message
};

struct Frame {
  FrameKind kind = FrameKind::kHello;
  uint64_t key = 0;
  std::vector<uint8_t> payload;
};

struct Hello {
  static constexpr uint32_t kVersion = 1;
  uint32_t version = kVersion;
  int32_t rank = 0;
  int32_t size = 0;
  uint64_t token = 0;
};

constexpr size_t kFrameHeaderBytes = 24;
// Larger than any payload a collective carries (compute mode moves whole
// tensors), small enough that a garbage length is caught at once.
constexpr uint64_t kMaxFramePayload = uint64_t{1} << 40;

// The header followed by the payload, ready to write.
std::vector<uint8_t> encode_frame(FrameKind kind, uint64_t key, const void* payload, size_t length);
std::vector<uint8_t> encode_hello(const Hello& hello);
// Throws emugpu::Error on a payload that is not a hello.
Hello decode_hello(const Frame& frame);
// Throws on a words payload of the wrong length.
std::vector<int64_t> decode_words(const Frame& frame, int count);

class FrameParser {
 public:
  // `peer` names the other end in errors ("rank 3", "127.0.0.1:4711").
  explicit FrameParser(std::string peer) : peer_(std::move(peer)) {}

  // Appends bytes as they arrived; throws on a malformed header.
  void feed(const uint8_t* data, size_t length);
  // Moves the next whole frame into `out`; false until one is complete.
  bool next(Frame& out);
  // Bytes of an incomplete frame: non-zero when the peer hung up mid-frame.
  size_t pending() const { return buffer_.size() - consumed_; }

 private:
  bool header_ready_locked();
  std::string peer_;
  std::vector<uint8_t> buffer_;
  size_t consumed_ = 0;  // bytes of buffer_ already handed out
};

}  // namespace emugpu
