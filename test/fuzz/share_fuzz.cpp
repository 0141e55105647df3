// Fuzz target for emugpud's protocol parser and request handler: what any
// process that connects to the daemon's socket sends. The input is cut into
// pieces as a socket might deliver them; every whole message goes to the
// handler as a session hands it over. The only acceptable failure is
// emugpu::Error (the session drops that connection), and the handler's
// books must balance: the GPUs' use is the sum of its clients'.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "daemon/handler.h"
#include "error.h"
#include "share/protocol.h"

namespace {
[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "emugpu_share_fuzz: %s\n", what);
  std::abort();
}

void check_books(const emugpu::share::Handler& handler) {
  const auto s = handler.status();
  for (size_t g = 0; g < s.gpus.size(); ++g) {
    uint64_t sum = 0;
    for (const auto& c : s.clients) sum += c.bytes[g];
    if (sum != s.used[g]) finding("a GPU's use is not the sum of its clients'");
    if (s.used[g] > s.gpus[g].capacity) finding("a GPU's use is beyond its capacity");
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = static_cast<size_t>(data[0]) + 1;  // reads may split messages anywhere
  ++data;
  --size;
  emugpu::share::Handler handler({{"fuzz GPU", 1ull << 30, 1ull << 30, 0, -1, "", ""},
                                  {"fuzz GPU", 1ull << 20, 1ull << 20, 0, 0, "1g.1gb", "MIG-x"}});
  const uint64_t first = handler.connect();
  const uint64_t second = handler.connect();
  // A well-behaved second client holds memory the fuzzed one must not disturb.
  (void)handler.handle(second, [] {
    emugpu::share::Parser p("seed");
    const auto bytes = emugpu::share::encode_hello(1, {1, "real", "seed"});
    p.feed(bytes.data(), bytes.size());
    emugpu::share::Message m;
    p.next(m);
    return m;
  }());
  emugpu::share::Parser parser("fuzz peer");
  size_t fed = 0;
  try {
    while (fed < size) {
      const size_t n = std::min(piece, size - fed);
      parser.feed(data + fed, n);
      fed += n;
      emugpu::share::Message m;
      while (parser.next(m)) {
        if (m.payload.size() > emugpu::share::kMaxPayload) finding("a message beyond the payload limit");
        const auto reply = handler.handle(first, m);
        emugpu::share::Parser back("reply");
        back.feed(reply.data(), reply.size());  // every reply is itself a well-formed message
        emugpu::share::Message r;
        if (!back.next(r) || back.pending() != 0) finding("a reply that is not one whole message");
        check_books(handler);
      }
    }
  } catch (const emugpu::Error&) {
  }
  handler.disconnect(first);
  check_books(handler);
  if (handler.status().used[0] != 0 || handler.status().used[1] != 0) finding("a dropped client's memory stayed");
  return 0;
}
