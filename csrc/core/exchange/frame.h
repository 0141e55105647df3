// The TCP transport's wire format, as pure functions: a fixed header
//   magic u32 | kind u8 | 3 zero bytes | key u64 | length u64   (little-endian)
// then `length` payload bytes. `key` is a gather's ticket or a channel's
// tag. The parser is fed whatever the socket delivered and hands out whole
// frames; a peer that sends garbage or truncated frames makes it throw
// emugpu::Error, never crash. It allocates at most kEagerPayload bytes for
// what a header announces, the rest as the bytes arrive.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace emugpu {

// Value-initialises nothing: a received payload is overwritten by the bytes
// that arrive, so zero-filling it first would be a wasted pass over memory.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  explicit UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// Bytes received from a peer.
using Bytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

enum class FrameKind : uint8_t {
  kHello = 1,    // payload: version u32, rank i32, size i32, group token u64
  kWords = 2,    // key: word-gather ticket; payload: int64 words
  kBytes = 3,    // key: byte-gather ticket; payload: the rank's bytes
  kMessage = 4,  // key: channel; payload: a point-to-point message
};

struct Frame {
  FrameKind kind = FrameKind::kHello;
  uint64_t key = 0;
  Bytes payload;
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
// Allocated at once for an announced payload: a large collective's slice
// is read straight into its frame, with no copy and no regrowth.
constexpr size_t kEagerPayload = size_t{64} << 20;

// The header followed by the payload, ready to write.
std::vector<uint8_t> encode_frame(FrameKind kind, uint64_t key, const void* payload, size_t length);
// The header alone, for a payload written from elsewhere.
std::vector<uint8_t> encode_frame_header(FrameKind kind, uint64_t key, size_t length);
std::vector<uint8_t> encode_hello(const Hello& hello);
// Throws emugpu::Error on a payload that is not a hello.
Hello decode_hello(const Frame& frame);
// Throws on a words payload of the wrong length.
std::vector<int64_t> decode_words(const Frame& frame, int count);

class FrameParser {
 public:
  // `peer` names the other end in errors ("rank 3", "127.0.0.1:4711").
  explicit FrameParser(std::string peer) : peer_(std::move(peer)) {}

  // Where the next bytes read from the socket go: straight into the payload
  // of the frame under way once its header was whole and much of it is
  // still to come, else a staging area. Pass the bytes read to commit().
  std::span<uint8_t> prepare();
  // `n` bytes were written at the start of prepare()'s span; throws on a
  // malformed header.
  void commit(size_t n);
  // Appends bytes as they arrived (copies them); throws on a malformed header.
  void feed(const uint8_t* data, size_t length);
  // Moves the next whole frame into `out`; false until one is complete.
  bool next(Frame& out);
  // Bytes of an incomplete frame: non-zero when the peer hung up mid-frame.
  size_t pending() const;

 private:
  void consume(const uint8_t* data, size_t length);
  void header_complete();
  void frame_complete();
  // Room for `count` more payload bytes, growing past kEagerPayload as they come.
  void reserve_payload(size_t count);

  std::string peer_;
  std::array<uint8_t, kFrameHeaderBytes> header_{};
  size_t header_have_ = 0;
  Frame current_;      // its payload sized to what was allocated so far
  size_t length_ = 0;  // what current_'s header announced
  size_t payload_have_ = 0;
  bool direct_ = false;  // prepare() handed out payload space, not staging
  std::vector<uint8_t> staging_;
  std::deque<Frame> ready_;
};

}  // namespace emugpu
