// One attached process's connection: reads its messages, hands each to the
// handler and writes the replies back in order. A malformed message drops
// this connection only; when it closes, for any reason, the handler
// releases what the process held.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it
#include <vector>

#include <boost/asio.hpp>

#include "daemon/handler.h"
#include "share/protocol.h"

namespace emugpu::share {

using Socket = boost::asio::generic::stream_protocol::socket;

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `closed` is called once, from the server's thread, when the connection ends.
  Session(Socket socket, Handler& handler, std::function<void(Session*)> closed);
  void start();
  void close();
  uint64_t client() const { return client_; }

 private:
  void read();
  void write();
  void fail(const std::string& why);

  Socket socket_;
  Handler& handler_;
  std::function<void(Session*)> closed_;
  uint64_t client_;
  Parser parser_;
  std::array<uint8_t, 4096> in_{};
  std::deque<std::vector<uint8_t>> out_;
  bool open_ = true;
};

}  // namespace emugpu::share
