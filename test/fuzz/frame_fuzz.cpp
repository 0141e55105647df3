// Fuzz target for the TCP transport's frame parser: what a peer (or
// anything that connects to the exchange's port) sends. The input is cut
// into pieces as a socket might deliver them; the only acceptable failure is
// emugpu::Error, and a frame handed out must be whole and as announced.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "error.h"
#include "exchange/frame.h"

namespace {
[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "emugpu_frame_fuzz: %s\n", what);
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the piece size (1..256 bytes), as reads may split frames anywhere, and whether
  // pieces are fed (copied) or read into the space the parser hands out.
  const size_t piece = static_cast<size_t>(data[0]) + 1;
  ++data;
  --size;
  emugpu::FrameParser parser("fuzz peer");
  size_t fed = 0;
  size_t handed = 0;
  try {
    while (fed < size) {
      size_t n = std::min(piece, size - fed);
      if (piece % 2 == 0) {
        parser.feed(data + fed, n);
      } else {  // as the transport reads: into the space the parser hands out
        const auto into = parser.prepare();
        n = std::min(n, into.size());
        std::memcpy(into.data(), data + fed, n);
        parser.commit(n);
      }
      fed += n;
      emugpu::Frame frame;
      while (parser.next(frame)) {
        handed += emugpu::kFrameHeaderBytes + frame.payload.size();
        if (frame.kind == emugpu::FrameKind::kHello) {
          try {
            (void)emugpu::decode_hello(frame);
          } catch (const emugpu::Error&) {
          }
        } else if (frame.kind == emugpu::FrameKind::kWords) {
          try {
            const auto words = emugpu::decode_words(frame, static_cast<int>(frame.payload.size() / 8));
            if (words.size() * 8 != frame.payload.size()) finding("decoded words do not match the payload");
          } catch (const emugpu::Error&) {
          }
        }
      }
    }
  } catch (const emugpu::Error&) {
    return 0;
  }
  if (handed + parser.pending() != fed) finding("the parser lost or invented bytes");
  return 0;
}
