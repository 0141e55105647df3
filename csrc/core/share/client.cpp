#include "share/client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "error.h"

namespace emugpu::share {

namespace {

// Long enough for a daemon under load, short enough that a wedged one fails the process, not hangs it.
constexpr int kTimeoutSeconds = 30;

std::string how_to_start() {
  return "start it with `torch-emugpu daemon --listen ADDRESS` (or `emugpud`), or unset EMUGPU_DAEMON to run "
         "without sharing";
}

int connect_to(const Address& a) {
  int fd = -1;
  int err = 0;
  if (a.kind == Address::Kind::kUnix) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::memcpy(sa.sun_path, a.path.c_str(), a.path.size() + 1);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) err = errno;
  } else {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(a.host.c_str(), std::to_string(a.port).c_str(), &hints, &found);
    EMUGPU_CHECK(rc == 0, kRuntime, "emugpud at ", a.text(), ": cannot resolve ", echo_input(a.host), " (",
                 gai_strerror(rc), ")");
    err = ECONNREFUSED;
    for (addrinfo* p = found; p != nullptr && err != 0; p = p->ai_next) {
      fd = ::socket(p->ai_family, p->ai_socktype | SOCK_CLOEXEC, p->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, p->ai_addr, p->ai_addrlen) == 0) {
        err = 0;
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      } else {
        err = errno;
        ::close(fd);
        fd = -1;
      }
    }
    ::freeaddrinfo(found);
  }
  if (fd < 0 && err == 0) err = errno;
  if (err != 0) {
    if (fd >= 0) ::close(fd);
    detail::throw_error(ErrorKind::kRuntime, "emugpud: no daemon answers at ", a.text(), " (", std::strerror(err),
                        "); ", how_to_start());
  }
  timeval tv{kTimeoutSeconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  return fd;
}

}  // namespace

Client::Client(const std::string& address)
    : address_(parse_address(address, "EMUGPU_DAEMON").text()),
      fd_(connect_to(parse_address(address, "EMUGPU_DAEMON"))),
      parser_("emugpud at " + address_) {}

Client::Client(const std::string& address, const Hello& hello) : Client(address) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = next_id_++;
  const Message reply = request(encode_hello(id, hello), id, "attach");
  if (reply.type == MessageType::kError) {
    ::close(fd_);
    fd_ = -1;
    detail::throw_error(ErrorKind::kRuntime, decode_error(reply));
  }
  welcome_ = decode_welcome(reply);
}

Client::~Client() {
  if (fd_ >= 0) ::close(fd_);
}

Message Client::request(const std::vector<uint8_t>& bytes, uint32_t id, const char* what) {
  const auto lost = [&](const std::string& why) {
    detail::throw_error(ErrorKind::kRuntime, "emugpud at ", address_, ": lost the daemon during ", what, " (", why,
                        "); it stopped or was restarted, so this process's share of the GPU is gone: restart the "
                        "process once the daemon runs");
  };
  EMUGPU_CHECK(fd_ >= 0, kRuntime, "emugpud at ", address_, ": not connected");
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) lost(std::strerror(errno));
    sent += static_cast<size_t>(n);
  }
  Message reply;
  uint8_t buffer[4096];
  while (!parser_.next(reply)) {
    const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      lost("no reply within " + std::to_string(kTimeoutSeconds) + " s");
    }
    if (n <= 0) lost(n == 0 ? "it closed the connection" : std::strerror(errno));
    parser_.feed(buffer, static_cast<size_t>(n));
  }
  EMUGPU_CHECK(reply.id == id, kRuntime, "emugpud at ", address_, ": expected the reply to request ", id,
               ", got one to ", reply.id);
  return reply;
}

std::optional<Refused> Client::reserve(uint32_t gpu, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = next_id_++;
  const Message reply = request(encode_bytes(MessageType::kReserve, id, {gpu, bytes}), id, "an allocation");
  if (reply.type == MessageType::kGranted) return std::nullopt;
  if (reply.type == MessageType::kRefused) return decode_refused(reply);
  detail::throw_error(ErrorKind::kRuntime, reply.type == MessageType::kError
                                               ? decode_error(reply)
                                               : std::string("emugpud: unexpected reply to a reserve request"));
}

void Client::release(uint32_t gpu, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = next_id_++;
  const Message reply = request(encode_bytes(MessageType::kRelease, id, {gpu, bytes}), id, "a release");
  if (reply.type == MessageType::kError) detail::throw_error(ErrorKind::kRuntime, decode_error(reply));
  EMUGPU_CHECK(reply.type == MessageType::kReleased, kRuntime, "emugpud: unexpected reply to a release request");
}

ShareGrant Client::share(const ShareReport& report) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = next_id_++;
  const Message reply = request(encode_share(id, report), id, "a share report");
  if (reply.type == MessageType::kError) detail::throw_error(ErrorKind::kRuntime, decode_error(reply));
  return decode_share_reply(reply);
}

Status Client::status() {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t id = next_id_++;
  return decode_status(request(encode(MessageType::kStatus, id), id, "a status request"));
}

Status Client::query(const std::string& address) {
  Client c(address);
  return c.status();
}

}  // namespace emugpu::share
