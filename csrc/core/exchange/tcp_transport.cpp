#include "exchange/tcp_transport.h"

#include <utility>  // Boost 1.74's asio/awaitable.hpp uses std::exchange without it

#include <boost/asio.hpp>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include "clock.h"
#include "error.h"
#include "exchange/frame.h"

namespace emugpu {

namespace asio = boost::asio;
using asio::ip::tcp;
using Steady = std::chrono::steady_clock;

namespace {

double seconds(std::chrono::nanoseconds t) { return static_cast<double>(t.count()) / 1e9; }

std::string endpoint_text(const tcp::socket& s) {
  boost::system::error_code ec;
  const auto ep = s.remote_endpoint(ec);
  return ec ? std::string("an unknown address") : ep.address().to_string() + ":" + std::to_string(ep.port());
}

// host:port, the host possibly an IPv6 literal.
std::pair<std::string, std::string> split_address(const std::string& text) {
  const size_t colon = text.rfind(':');
  EMUGPU_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < text.size(), kRuntime,
               "tcp exchange: expected host:port in the rendezvous, got '", text, "'");
  return {text.substr(0, colon), text.substr(colon + 1)};
}

// Writes whose payload the caller lends (exchange()): it waits until every
// one was handed to the kernel or failed, before its memory may change.
struct LentWrites {
  std::mutex mutex;
  std::condition_variable done;
  int pending = 0;
};

// One queued frame: an encoded frame, or a header and a lent payload.
struct Outgoing {
  std::shared_ptr<const std::vector<uint8_t>> frame;
  const void* lent = nullptr;
  size_t lent_length = 0;
  std::shared_ptr<LentWrites> owner;

  void finished() const {
    if (owner == nullptr) return;
    std::lock_guard<std::mutex> lock(owner->mutex);
    --owner->pending;
    owner->done.notify_all();
  }
};

// Every rank's part of one gather, as it arrives.
struct Gather {
  std::vector<std::optional<Bytes>> rows;
  int arrived = 0;
};

}  // namespace

struct TcpTransport::Impl {
  struct Peer {
    explicit Peer(asio::io_context& io, int rank) : socket(io), parser("rank " + std::to_string(rank)) {}
    tcp::socket socket;
    FrameParser parser;
    std::deque<Outgoing> writes;  // I/O thread only
    bool writing = false;
  };

  Impl(int rank, int size, Options options) : rank(rank), size(size), options(std::move(options)) {}

  const int rank;
  const int size;
  const Options options;
  asio::io_context io;
  std::vector<std::unique_ptr<Peer>> peers;  // by rank; null for this rank
  std::thread thread;

  std::mutex mutex;
  std::condition_variable changed;
  std::map<uint64_t, Gather> words;
  std::map<uint64_t, Gather> bytes;
  std::map<std::pair<int, uint64_t>, std::deque<Bytes>> messages;
  std::vector<std::string> dead;  // by rank: why its connection ended ("" while it lives)
  uint64_t next_word_ticket = 0;
  uint64_t next_byte_ticket = 0;

  std::string who() const { return "tcp exchange: rank " + std::to_string(rank) + " of " + std::to_string(size); }

  // --- set-up ---------------------------------------------------------------
  void connect(Rendezvous& rendezvous);

  // --- steady state (I/O thread) ---------------------------------------------
  void read(int r) {
    Peer& p = *peers[static_cast<size_t>(r)];
    // Large payloads are read straight into their frame (FrameParser::prepare).
    const std::span<uint8_t> into = p.parser.prepare();
    p.socket.async_read_some(asio::buffer(into.data(), into.size()), [this, r](const boost::system::error_code& ec,
                                                                               size_t n) {
      Peer& peer = *peers[static_cast<size_t>(r)];
      if (ec) {
        const bool truncated = peer.parser.pending() > 0;
        lost(r, ec == asio::error::eof ? (truncated ? "closed its connection in the middle of a frame"
                                                    : "closed its connection (the process exited or left the group)")
                                       : "lost its connection: " + ec.message());
        return;
      }
      try {
        peer.parser.commit(n);
        Frame frame;
        while (peer.parser.next(frame)) deliver(r, std::move(frame));
      } catch (const Error& e) {
        lost(r, std::string("sent a malformed frame: ") + e.what());
        boost::system::error_code ignored;
        peer.socket.close(ignored);
        return;
      }
      read(r);
    });
  }

  void deliver(int r, Frame frame) {
    std::lock_guard<std::mutex> lock(mutex);
    switch (frame.kind) {
      case FrameKind::kWords: arrive(words[frame.key], r, std::move(frame.payload)); break;
      case FrameKind::kBytes: arrive(bytes[frame.key], r, std::move(frame.payload)); break;
      case FrameKind::kMessage: messages[{r, frame.key}].push_back(std::move(frame.payload)); break;
      case FrameKind::kHello: EMUGPU_CHECK(false, kRuntime, "rank ", r, " said hello twice");
    }
    changed.notify_all();
  }

  void arrive(Gather& g, int r, Bytes payload) {
    if (g.rows.empty()) g.rows.resize(static_cast<size_t>(size));
    auto& row = g.rows[static_cast<size_t>(r)];
    EMUGPU_CHECK(!row.has_value(), kRuntime, "rank ", r, " sent one gather twice");
    row = std::move(payload);
    ++g.arrived;
  }

  void lost(int r, const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (dead[static_cast<size_t>(r)].empty()) dead[static_cast<size_t>(r)] = why;
    changed.notify_all();
  }

  void write(int r, std::shared_ptr<const std::vector<uint8_t>> frame) {
    write(r, Outgoing{std::move(frame), nullptr, 0, nullptr});
  }

  void write(int r, Outgoing out) {
    asio::post(io, [this, r, out = std::move(out)]() mutable {
      Peer& p = *peers[static_cast<size_t>(r)];
      p.writes.push_back(std::move(out));
      if (!p.writing) write_next(r);
    });
  }

  void write_next(int r) {
    Peer& p = *peers[static_cast<size_t>(r)];
    p.writing = true;
    const Outgoing& out = p.writes.front();
    const std::array<asio::const_buffer, 2> buffers{asio::buffer(*out.frame), asio::buffer(out.lent, out.lent_length)};
    asio::async_write(p.socket, buffers, [this, r](const boost::system::error_code& ec, size_t) {
      Peer& peer = *peers[static_cast<size_t>(r)];
      peer.writes.front().finished();
      peer.writes.pop_front();
      peer.writing = false;
      if (ec) {
        lost(r, "lost its connection while this rank wrote to it: " + ec.message());
        for (const Outgoing& dropped : peer.writes) dropped.finished();
        peer.writes.clear();
        return;
      }
      if (!peer.writes.empty()) write_next(r);
    });
  }

  // Ends the connections that still hold `lent`'s writes after `timeout`.
  void abandon(const std::shared_ptr<LentWrites>& lent, std::chrono::nanoseconds timeout) {
    asio::post(io, [this, lent, timeout] {
      for (int r = 0; r < size; ++r) {
        Peer* p = peers[static_cast<size_t>(r)].get();
        if (p == nullptr) continue;
        const bool holds =
            std::any_of(p->writes.begin(), p->writes.end(), [&](const Outgoing& out) { return out.owner == lent; });
        if (!holds) continue;
        lost(r, "read nothing this rank sent for " + std::to_string(seconds(timeout)) + " s");
        boost::system::error_code ignored;
        p->socket.close(ignored);  // the pending writes complete with an error
      }
    });
  }

  // --- waits (any thread) -----------------------------------------------------
  // Waits for gather `ticket` of `table` to be whole; throws naming the
  // first missing rank that died, or the missing ones at the timeout.
  Gather take(std::map<uint64_t, Gather>& table, uint64_t ticket, std::chrono::nanoseconds timeout, const char* what) {
    const auto deadline = Steady::now() + timeout;
    std::unique_lock<std::mutex> lock(mutex);
    while (true) {
      Gather& g = table[ticket];
      if (g.rows.empty()) g.rows.resize(static_cast<size_t>(size));
      if (g.arrived == size) {
        Gather whole = std::move(g);
        table.erase(ticket);
        return whole;
      }
      std::vector<int> missing;
      for (int r = 0; r < size; ++r) {
        if (g.rows[static_cast<size_t>(r)].has_value()) continue;
        missing.push_back(r);
        const std::string& why = dead[static_cast<size_t>(r)];
        EMUGPU_CHECK(why.empty(), kRuntime, who(), ": ", what, " ", ticket, " needs rank ", r, ", which ", why);
      }
      if (Steady::now() < deadline) {
        // In slices, so that Ctrl-C reaches a rank that waits for a missing peer.
        changed.wait_until(lock, std::min(deadline, Steady::now() + std::chrono::nanoseconds(kInterruptSliceNs)));
        lock.unlock();
        check_wait_interrupt();
        lock.lock();
      } else {
        std::ostringstream list;
        for (size_t i = 0; i < missing.size(); ++i) list << (i ? ", " : "") << missing[i];
        EMUGPU_CHECK(false, kRuntime, who(), ": ", what, " ", ticket, ": rank(s) ", list.str(),
                     " did not arrive within ", seconds(timeout), " s");
      }
    }
  }
};

void TcpTransport::Impl::connect(Rendezvous& rendezvous) {
  const auto deadline = Steady::now() + options.timeout;
  peers.resize(static_cast<size_t>(size));
  dead.assign(static_cast<size_t>(size), "");

  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options.host, ec);
  EMUGPU_CHECK(!ec, kValue, who(), ": expected an IP address to listen on, got '", options.host, "' (", ec.message(),
               ")");
  tcp::acceptor acceptor(io);
  acceptor.open(address.is_v6() ? tcp::v6() : tcp::v4(), ec);
  if (!ec) acceptor.bind(tcp::endpoint(address, 0), ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  EMUGPU_CHECK(!ec, kRuntime, who(), ": could not listen on ", options.host, ": ", ec.message());
  const auto port = acceptor.local_endpoint().port();
  rendezvous.set(options.key_prefix + "addr/" + std::to_string(rank), options.host + ":" + std::to_string(port));

  const std::vector<uint8_t> hello = encode_hello(Hello{Hello::kVersion, rank, size, options.token});
  // Connect to every rank below this one (they accept from those above).
  for (int r = 0; r < rank; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Steady::now());
    const std::string text = rendezvous.get(options.key_prefix + "addr/" + std::to_string(r), left);
    const auto [host, service] = split_address(text);
    tcp::resolver resolver(io);
    auto peer = std::make_unique<Peer>(io, r);
    while (true) {
      const auto endpoints = resolver.resolve(host, service, ec);
      if (!ec) asio::connect(peer->socket, endpoints, ec);
      if (!ec) break;
      EMUGPU_CHECK(Steady::now() < deadline, kRuntime, who(), ": could not connect to rank ", r, " at ", text,
                   " within ", seconds(options.timeout), " s: ", ec.message());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      check_wait_interrupt();
    }
    peer->socket.set_option(tcp::no_delay(true));
    asio::write(peer->socket, asio::buffer(hello), ec);
    EMUGPU_CHECK(!ec, kRuntime, who(), ": could not greet rank ", r, " at ", text, ": ", ec.message());
    peers[static_cast<size_t>(r)] = std::move(peer);
  }

  // Accept the ranks above, each saying hello first. A connection that
  // sends no frame is not a rank of this group (a stale attempt, a port
  // scan): it is ignored, and named if the set-up times out.
  int expected = size - 1 - rank;
  std::vector<std::shared_ptr<tcp::socket>> greeting;   // accepted, hello not read yet
  std::map<const tcp::socket*, std::string> strangers;  // said nothing, or something that is not a hello
  std::string failure;
  std::function<void()> accept_next = [&]() {
    auto socket = std::make_shared<tcp::socket>(io);
    acceptor.async_accept(*socket, [&, socket](const boost::system::error_code& accepted) {
      if (accepted) return;  // the acceptor closed: set-up is over
      accept_next();
      boost::system::error_code ignored;
      socket->set_option(tcp::no_delay(true), ignored);
      const std::string from = endpoint_text(*socket);
      strangers[socket.get()] = from + " connected but sent no hello";
      greeting.push_back(socket);
      auto hello_bytes = std::make_shared<std::array<uint8_t, kFrameHeaderBytes + 20>>();
      asio::async_read(
          *socket, asio::buffer(*hello_bytes),
          [&, socket, hello_bytes, from](const boost::system::error_code& e, size_t) {
            if (e) {
              if (e != asio::error::operation_aborted) strangers[socket.get()] = from + " hung up before saying hello";
              return;
            }
            Frame frame;
            try {
              FrameParser parser(from);
              parser.feed(hello_bytes->data(), hello_bytes->size());
              if (!parser.next(frame) || frame.kind != FrameKind::kHello) throw Error(ErrorKind::kRuntime, "");
            } catch (const Error&) {
              strangers[socket.get()] = from + " sent bytes that are not a hello";
              return;
            }
            try {
              const Hello h = decode_hello(frame);
              if (h.token != options.token) {
                strangers[socket.get()] = from + " belongs to another instance of this group";
                return;
              }
              EMUGPU_CHECK(h.size == size, kRuntime, who(), ": ", from, " says it is rank ", h.rank, " of ", h.size,
                           ", expected a group of ", size);
              EMUGPU_CHECK(h.rank > rank && h.rank < size, kRuntime, who(), ": ", from, " says it is rank ", h.rank,
                           ", expected one of ranks ", rank + 1, "..", size - 1);
              auto& slot = peers[static_cast<size_t>(h.rank)];
              EMUGPU_CHECK(slot == nullptr, kRuntime, who(), ": rank ", h.rank, " connected twice (", from, ")");
              slot = std::make_unique<Peer>(io, h.rank);
              slot->socket = std::move(*socket);
              strangers.erase(socket.get());
              if (--expected == 0) acceptor.close();
            } catch (const Error& err) {
              if (failure.empty()) failure = err.what();
              acceptor.close();
            }
          });
    });
  };
  std::exception_ptr interrupted;
  if (expected > 0) {
    accept_next();
    while (!io.stopped() && Steady::now() < deadline) {
      io.run_until(std::min(deadline, Steady::now() + std::chrono::nanoseconds(kInterruptSliceNs)));
      try {
        check_wait_interrupt();  // Ctrl-C while a peer never connects
      } catch (...) {
        interrupted = std::current_exception();
        break;
      }
    }
  }
  // No handler of the set-up may outlive this frame.
  acceptor.close(ec);
  for (auto& s : greeting) {
    if (s->is_open()) s->close(ec);
  }
  io.restart();
  io.poll();
  io.restart();
  if (interrupted) std::rethrow_exception(interrupted);
  EMUGPU_CHECK(failure.empty(), kRuntime, failure);
  if (expected > 0) {
    std::ostringstream missing;
    for (int r = rank + 1; r < size; ++r) {
      if (peers[static_cast<size_t>(r)] == nullptr) missing << (missing.tellp() > 0 ? ", " : "") << r;
    }
    std::ostringstream others;
    for (const auto& [socket, what] : strangers) others << "; " << what;
    EMUGPU_CHECK(false, kRuntime, who(), ": rank(s) ", missing.str(), " did not connect within ",
                 seconds(options.timeout), " s", others.str(),
                 (strangers.empty() ? "; check their output for an error"
                                    : "; is something else connecting to this group's port?"));
  }
}

TcpTransport::TcpTransport(Rendezvous& rendezvous, int rank, int size, Options options) : rank_(rank), size_(size) {
  EMUGPU_CHECK(size >= 1 && rank >= 0 && rank < size, kValue, "tcp exchange: expected 0 <= rank < size, got rank ",
               rank, " of ", size);
  impl_ = std::make_unique<Impl>(rank, size, std::move(options));
  impl_->connect(rendezvous);
  for (int r = 0; r < size; ++r) {
    if (r != rank) impl_->read(r);
  }
  impl_->thread = std::thread([impl = impl_.get()] {
    auto guard = asio::make_work_guard(impl->io);
    impl->io.run();
  });
}

TcpTransport::~TcpTransport() {
  if (!impl_->thread.joinable()) return;
  asio::post(impl_->io, [impl = impl_.get()] {
    for (auto& p : impl->peers) {
      if (p == nullptr) continue;
      boost::system::error_code ignored;
      p->socket.shutdown(tcp::socket::shutdown_both, ignored);
      p->socket.close(ignored);
    }
    impl->io.stop();
  });
  impl_->thread.join();
}

uint64_t TcpTransport::start_gather(const int64_t* words, int count, std::chrono::nanoseconds /*timeout*/) {
  EMUGPU_CHECK(count >= 0 && count <= kMaxWords, kValue, "tcp exchange: expected at most ", kMaxWords, " words, got ",
               count);
  const size_t n = static_cast<size_t>(count) * 8;
  const auto* first = reinterpret_cast<const uint8_t*>(words);
  Bytes mine(first, first + n);
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    ticket = impl_->next_word_ticket++;
    impl_->arrive(impl_->words[ticket], rank_, mine);
    // Queued under the lock: every peer sees this rank's gathers in ticket order.
    auto frame = std::make_shared<const std::vector<uint8_t>>(encode_frame(FrameKind::kWords, ticket, words, n));
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) impl_->write(r, frame);
    }
  }
  return ticket;
}

void TcpTransport::finish_gather(uint64_t ticket, int64_t* out, int count, std::chrono::nanoseconds timeout) {
  Gather g = impl_->take(impl_->words, ticket, timeout, "word gather");
  for (int r = 0; r < size_; ++r) {
    Frame f{FrameKind::kWords, ticket, std::move(*g.rows[static_cast<size_t>(r)])};
    const std::vector<int64_t> row = decode_words(f, count);
    std::copy(row.begin(), row.end(), out + static_cast<size_t>(r) * static_cast<size_t>(count));
  }
}

size_t TcpTransport::bytes_capacity() const { return static_cast<size_t>(kMaxFramePayload); }

void TcpTransport::gather_bytes(const void* data, size_t length, std::chrono::nanoseconds timeout,
                                const ByteReader& read) {
  EMUGPU_CHECK(length <= bytes_capacity(), kValue, "tcp exchange: expected at most ", bytes_capacity(),
               " bytes to gather, got ", length);
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    ticket = impl_->next_byte_ticket++;
    const auto* p = static_cast<const uint8_t*>(data);
    impl_->arrive(impl_->bytes[ticket], rank_, Bytes(p, p + length));
    auto frame = std::make_shared<const std::vector<uint8_t>>(encode_frame(FrameKind::kBytes, ticket, data, length));
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) impl_->write(r, frame);
    }
  }
  Gather g = impl_->take(impl_->bytes, ticket, timeout, "byte gather");
  for (int r = 0; r < size_; ++r) {
    const auto& row = *g.rows[static_cast<size_t>(r)];
    read(r, row.data(), row.size());
  }
}

void TcpTransport::send(int peer, uint64_t channel, const void* data, size_t length) {
  EMUGPU_CHECK(peer >= 0 && peer < size_ && peer != rank_, kValue, "tcp exchange: expected a peer rank in [0, ", size_,
               ") other than ", rank_, ", got ", peer);
  impl_->write(peer,
               std::make_shared<const std::vector<uint8_t>>(encode_frame(FrameKind::kMessage, channel, data, length)));
}

Bytes TcpTransport::recv(int peer, uint64_t channel, std::chrono::nanoseconds timeout) {
  EMUGPU_CHECK(peer >= 0 && peer < size_ && peer != rank_, kValue, "tcp exchange: expected a peer rank in [0, ", size_,
               ") other than ", rank_, ", got ", peer);
  const auto deadline = Steady::now() + timeout;
  std::unique_lock<std::mutex> lock(impl_->mutex);
  while (true) {
    auto it = impl_->messages.find({peer, channel});
    if (it != impl_->messages.end() && !it->second.empty()) {
      Bytes message = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) impl_->messages.erase(it);
      return message;
    }
    const std::string& why = impl_->dead[static_cast<size_t>(peer)];
    EMUGPU_CHECK(why.empty(), kRuntime, impl_->who(), ": a message from rank ", peer, " on channel ", channel,
                 " cannot come: rank ", peer, " ", why);
    EMUGPU_CHECK(Steady::now() < deadline, kRuntime, impl_->who(), ": no message from rank ", peer, " on channel ",
                 channel, " within ", seconds(timeout), " s");
    impl_->changed.wait_until(lock, std::min(deadline, Steady::now() + std::chrono::nanoseconds(kInterruptSliceNs)));
    lock.unlock();
    check_wait_interrupt();
    lock.lock();
  }
}

std::vector<Bytes> TcpTransport::exchange(const std::vector<const void*>& chunks, const std::vector<size_t>& lengths,
                                          std::chrono::nanoseconds timeout) {
  EMUGPU_CHECK(chunks.size() == static_cast<size_t>(size_) && lengths.size() == chunks.size(), kValue,
               "tcp exchange: expected a chunk per rank (", size_, "), got ", chunks.size(), " chunks and ",
               lengths.size(), " lengths");
  for (int r = 0; r < size_; ++r) {  // before any is queued: a refusal leaves nothing lent behind
    EMUGPU_CHECK(lengths[static_cast<size_t>(r)] <= kMaxFramePayload, kValue, "tcp exchange: expected at most ",
                 kMaxFramePayload, " bytes for rank ", r, ", got ", lengths[static_cast<size_t>(r)]);
  }
  // The chunks are written from where they lie (no copy); this call returns
  // only once the I/O thread handed them all to the kernel, also when a recv
  // below throws.
  struct WaitForLent {
    Impl& impl;
    std::shared_ptr<LentWrites> lent;
    std::chrono::nanoseconds timeout;
    ~WaitForLent() {
      std::unique_lock<std::mutex> lock(lent->mutex);
      if (!lent->done.wait_for(lock, timeout, [&] { return lent->pending == 0; })) {
        lock.unlock();
        impl.abandon(lent, timeout);  // a peer that reads nothing: its connection ends, the writes fail
        lock.lock();
        lent->done.wait(lock, [&] { return lent->pending == 0; });
      }
    }
  } wait_for_lent{*impl_, std::make_shared<LentWrites>(), timeout};
  auto header = std::make_shared<const std::vector<uint8_t>>();
  const void* last_chunk = nullptr;
  size_t last_length = 0;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const auto u = static_cast<size_t>(r);
    if (header->empty() || chunks[u] != last_chunk || lengths[u] != last_length) {  // an all-gather shares one
      header = std::make_shared<const std::vector<uint8_t>>(
          encode_frame_header(FrameKind::kMessage, kExchangeChannel, lengths[u]));
      last_chunk = chunks[u];
      last_length = lengths[u];
    }
    {
      std::lock_guard<std::mutex> lock(wait_for_lent.lent->mutex);
      ++wait_for_lent.lent->pending;
    }
    impl_->write(r, Outgoing{header, chunks[u], lengths[u], wait_for_lent.lent});
  }
  std::vector<Bytes> got(static_cast<size_t>(size_));
  const auto* own = static_cast<const uint8_t*>(chunks[static_cast<size_t>(rank_)]);
  got[static_cast<size_t>(rank_)].assign(own, own + lengths[static_cast<size_t>(rank_)]);
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) got[static_cast<size_t>(r)] = recv(r, kExchangeChannel, timeout);
  }
  return got;
}

std::string TcpTransport::address_towards(const std::string& host) {
  try {
    asio::io_context io;
    asio::ip::udp::resolver resolver(io);
    const auto endpoints = resolver.resolve(host, "1");
    if (endpoints.empty()) return "";
    const auto target = endpoints.begin()->endpoint();
    if (target.address().is_loopback()) return target.address().is_v6() ? "::1" : "127.0.0.1";
    asio::ip::udp::socket probe(io, target.protocol());
    probe.connect(target);  // UDP: picks the route, sends nothing
    return probe.local_endpoint().address().to_string();
  } catch (const boost::system::system_error&) {
    return "";
  }
}

}  // namespace emugpu
