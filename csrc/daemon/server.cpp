#include "daemon/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <vector>

#include "error.h"

namespace emugpu::share {

namespace asio = boost::asio;
using boost::system::error_code;

namespace {

// A socket file at `path` that nobody accepts on is left over from a daemon
// that was killed: it may go. One that answers belongs to a running daemon.
void clear_stale_socket(asio::io_context& io, const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return;
  EMUGPU_CHECK(S_ISSOCK(st.st_mode), kValue, "emugpud: ", path,
               " exists and is not a socket; choose another address (--listen unix:PATH)");
  asio::local::stream_protocol::socket probe(io);
  error_code ec;
  probe.connect(asio::local::stream_protocol::endpoint(path), ec);
  EMUGPU_CHECK(ec, kValue, "emugpud: another daemon listens on unix:", path,
               " already; stop it first, or choose another address (--listen unix:PATH)");
  ::unlink(path.c_str());
}

}  // namespace

Server::Server(asio::io_context& io, Handler& handler, const Address& where)
    : io_(io), handler_(handler), where_(where) {
  error_code ec;
  if (where.kind == Address::Kind::kUnix) {
    clear_stale_socket(io, where.path);
    unix_.emplace(io);
    unix_->open(asio::local::stream_protocol(), ec);
    // Only this user may attach: the daemon's memory and time are theirs.
    const mode_t old_mask = ::umask(0177);
    if (!ec) unix_->bind(asio::local::stream_protocol::endpoint(where.path), ec);
    ::umask(old_mask);
    if (!ec) ::chmod(where.path.c_str(), 0600);
    if (!ec) unix_->listen(asio::socket_base::max_listen_connections, ec);
  } else {
    const auto address = asio::ip::make_address(where.host, ec);
    EMUGPU_CHECK(!ec, kValue, "emugpud: expected an IP address to listen on, got \"", echo_input(where.host), "\" (",
                 ec.message(), ")");
    tcp_.emplace(io);
    const asio::ip::tcp::endpoint endpoint(address, where.port);
    tcp_->open(endpoint.protocol(), ec);
    if (!ec) tcp_->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) tcp_->bind(endpoint, ec);
    if (!ec) tcp_->listen(asio::socket_base::max_listen_connections, ec);
  }
  EMUGPU_CHECK(!ec, kRuntime, "emugpud: cannot listen on ", where.text(), ": ", ec.message());
  accept();
}

Server::~Server() { stop(); }

std::string Server::address() const {
  if (tcp_) {
    Address a = where_;
    error_code ec;
    a.port = tcp_->local_endpoint(ec).port();
    return a.text();
  }
  return where_.text();
}

void Server::accept() {
  if (unix_) {
    unix_->async_accept([this](error_code ec, asio::local::stream_protocol::socket s) {
      if (stopped_) return;
      if (!ec) admit(Socket(std::move(s)));
      accept();
    });
  } else {
    tcp_->async_accept([this](error_code ec, asio::ip::tcp::socket s) {
      if (stopped_) return;
      if (!ec) {
        s.set_option(asio::ip::tcp::no_delay(true), ec);
        admit(Socket(std::move(s)));
      }
      accept();
    });
  }
}

void Server::admit(Socket socket) {
  if (sessions_.size() >= kMaxClients) {
    std::cerr << "emugpud: refused a connection: " << kMaxClients << " are open already" << std::endl;
    return;  // the socket closes here
  }
  auto session = std::make_shared<Session>(std::move(socket), handler_, [this](Session* closed) {
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      if (it->get() == closed) {
        sessions_.erase(it);
        break;
      }
    }
  });
  sessions_.insert(session);
  session->start();
}

void Server::stop() {
  if (stopped_) return;
  stopped_ = true;
  error_code ec;
  if (unix_) {
    unix_->close(ec);
    ::unlink(where_.path.c_str());
  }
  if (tcp_) tcp_->close(ec);
  const std::vector<std::shared_ptr<Session>> open(sessions_.begin(), sessions_.end());
  for (const auto& s : open) s->close();
  sessions_.clear();
}

}  // namespace emugpu::share
