#include "share/address.h"

#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>

#include "error.h"

namespace emugpu::share {

std::string Address::text() const {
  return kind == Kind::kUnix ? "unix:" + path : "tcp:" + host + ":" + std::to_string(port);
}

Address parse_address(const std::string& text, const std::string& source) {
  Address a;
  const auto fail = [&](const std::string& why) {
    detail::throw_error(ErrorKind::kValue, source, ": ", why, ", got \"", echo_input(text),
                        "\"; expected unix:PATH (or a path) or tcp:HOST:PORT");
  };
  if (text.rfind("tcp:", 0) == 0) {
    const std::string rest = text.substr(4);
    const auto colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0) fail("a TCP address needs a host and a port");
    a.kind = Address::Kind::kTcp;
    a.host = rest.substr(0, colon);
    if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']')
      a.host = a.host.substr(1, a.host.size() - 2);
    const std::string port = rest.substr(colon + 1);
    char* end = nullptr;
    const long value = port.empty() ? -1 : std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || value < 0 || value > 65535) fail("expected a port from 0 to 65535");
    a.port = static_cast<uint16_t>(value);
    return a;
  }
  a.path = text.rfind("unix:", 0) == 0 ? text.substr(5) : text;
  if (a.path.empty()) fail("a Unix socket needs a path");
  if (a.path.size() >= sizeof(sockaddr_un::sun_path)) {
    fail("a Unix socket's path must be shorter than " + std::to_string(sizeof(sockaddr_un::sun_path)) + " bytes");
  }
  return a;
}

std::string default_address() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] != '\0') return std::string("unix:") + runtime + "/emugpud.sock";
  return "unix:/tmp/emugpud-" + std::to_string(getuid()) + ".sock";
}

}  // namespace emugpu::share
