// Where emugpud listens and its clients connect: "unix:PATH" (the default
// kind: a bare path is one too) or "tcp:HOST:PORT" (for a node's containers).
#pragma once

#include <cstdint>
#include <string>

namespace emugpu::share {

struct Address {
  enum class Kind { kUnix, kTcp };
  Kind kind = Kind::kUnix;
  std::string path;  // kUnix
  std::string host;  // kTcp
  uint16_t port = 0;
  std::string text() const;  // as parse_address() reads it
};

// Throws emugpu::Error (kValue) naming `source` (e.g. "EMUGPU_DAEMON") and
// the forms it accepts.
Address parse_address(const std::string& text, const std::string& source);

// The default socket: $XDG_RUNTIME_DIR/emugpud.sock, else /tmp/emugpud-UID.sock.
std::string default_address();

}  // namespace emugpu::share
