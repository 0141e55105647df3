// The transport for ranks on any machines: one TCP connection per pair of
// ranks (Boost.Asio, one I/O thread per group), found through a Rendezvous.
// Each rank listens on an ephemeral port of `host`, publishes host:port,
// connects to the ranks below it and accepts the ranks above it; a
// connection first says hello (rank, group size, the group's token), so a
// stale or foreign connection is refused, and a peer that connects and says
// nothing fails the set-up with an error naming its address.
//
// Word and byte gathers go all-to-all, keyed by ticket; point-to-point
// messages arrive in the order sent per (peer, channel). A peer whose
// connection closes or sends garbage is dead: waits that need it fail at
// once with the reason, not at the timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exchange/frame.h"
#include "exchange/transport.h"

namespace emugpu {

class TcpTransport : public Transport {
 public:
  // The channel exchange() uses; above the channels callers derive from user tags.
  static constexpr uint64_t kExchangeChannel = uint64_t{1} << 61;

  struct Options {
    std::string host = "127.0.0.1";  // bound and advertised: an address every rank reaches
    std::string key_prefix;          // this group's keys in the Rendezvous
    uint64_t token = 0;              // equal on every rank of this group instance
    std::chrono::nanoseconds timeout{std::chrono::seconds(300)};
  };

  TcpTransport(Rendezvous& rendezvous, int rank, int size, Options options);
  ~TcpTransport() override;
  TcpTransport(const TcpTransport&) = delete;
  TcpTransport& operator=(const TcpTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* kind() const override { return "tcp"; }
  uint64_t start_gather(const int64_t* words, int count, std::chrono::nanoseconds timeout) override;
  void finish_gather(uint64_t ticket, int64_t* out, int count, std::chrono::nanoseconds timeout) override;
  size_t bytes_capacity() const override;
  void gather_bytes(const void* data, size_t length, std::chrono::nanoseconds timeout, const ByteReader& read) override;

  // Queues a message to `peer` on `channel` and returns; messages on one
  // channel reach the peer's recv() in the order sent.
  void send(int peer, uint64_t channel, const void* data, size_t length);
  // The next message from `peer` on `channel`, waiting up to `timeout`.
  Bytes recv(int peer, uint64_t channel, std::chrono::nanoseconds timeout);

  // All-to-all of byte chunks: `chunks[r]` (of `chunks_length[r]` bytes)
  // goes to rank r; returns what every rank sent this one (this rank's own
  // chunk copied), in rank order. Collectives whose ranks need different
  // bytes (reduce-scatter, all-to-all, a rooted reduce) move only those.
  // Exchanges pair up across ranks in the order each rank calls them.
  std::vector<Bytes> exchange(const std::vector<const void*>& chunks, const std::vector<size_t>& lengths,
                              std::chrono::nanoseconds timeout);

  // The local address from which this machine reaches `host` (the route's
  // source address): one the other ranks reach if they all reach `host`.
  // "127.0.0.1" for a loopback host; "" if it cannot tell.
  static std::string address_towards(const std::string& host);

  struct Impl;

 private:
  int rank_;
  int size_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace emugpu
