// emugpud's listening side: accepts connections on one address (a Unix
// socket only its user may open, or TCP) and runs a Session for each.
// stop() closes the listener and every session (SIGINT/SIGTERM in main).
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>

#include "daemon/handler.h"
#include "daemon/session.h"
#include "share/address.h"

namespace emugpu::share {

class Server {
 public:
  // Throws emugpu::Error when it cannot listen there (another daemon
  // listens already, the path is not a socket, the port is taken).
  Server(boost::asio::io_context& io, Handler& handler, const Address& where);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Where it listens (tcp:HOST:0 becomes the port chosen).
  std::string address() const;
  size_t sessions() const { return sessions_.size(); }
  void stop();

 private:
  void accept();
  void admit(Socket socket);

  boost::asio::io_context& io_;
  Handler& handler_;
  Address where_;
  std::optional<boost::asio::local::stream_protocol::acceptor> unix_;
  std::optional<boost::asio::ip::tcp::acceptor> tcp_;
  std::set<std::shared_ptr<Session>> sessions_;
  bool stopped_ = false;
};

}  // namespace emugpu::share
