#include "daemon/session.h"

#include <iostream>

#include "error.h"

namespace emugpu::share {

namespace asio = boost::asio;

Session::Session(Socket socket, Handler& handler, std::function<void(Session*)> closed)
    : socket_(std::move(socket)),
      handler_(handler),
      closed_(std::move(closed)),
      client_(handler.connect()),
      parser_("client " + std::to_string(client_)) {}

void Session::start() { read(); }

void Session::read() {
  socket_.async_read_some(asio::buffer(in_), [self = shared_from_this()](boost::system::error_code ec, size_t n) {
    if (!self->open_) return;
    if (ec) {
      self->close();  // the process exited, was killed, or closed its end
      return;
    }
    try {
      self->parser_.feed(self->in_.data(), n);
      Message m;
      const bool idle = self->out_.empty();
      while (self->parser_.next(m)) self->out_.push_back(self->handler_.handle(self->client_, m));
      if (idle && !self->out_.empty()) self->write();
    } catch (const Error& e) {
      self->fail(e.what());
      return;
    }
    self->read();
  });
}

void Session::write() {
  asio::async_write(socket_, asio::buffer(out_.front()),
                    [self = shared_from_this()](boost::system::error_code ec, size_t) {
                      if (!self->open_) return;
                      if (ec) {
                        self->close();
                        return;
                      }
                      self->out_.pop_front();
                      if (!self->out_.empty()) self->write();
                    });
}

void Session::fail(const std::string& why) {
  std::cerr << "emugpud: dropped client " << client_ << ": " << why << std::endl;
  close();
}

void Session::close() {
  if (!open_) return;
  open_ = false;
  boost::system::error_code ignored;
  socket_.shutdown(Socket::shutdown_both, ignored);
  socket_.close(ignored);
  handler_.disconnect(client_);
  if (closed_) closed_(this);
}

}  // namespace emugpu::share
