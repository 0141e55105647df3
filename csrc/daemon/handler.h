// emugpud's state and rules, as a pure request handler: the GPUs it owns,
// the attached processes and the memory each holds on each GPU. No I/O and
// no locks: sessions call it from the server's one thread.
//
// Memory is arbitrated at the grain of the caching allocator's segments
// (2 MiB and up, taken rarely once a job is warm), never per tensor: the
// processes' allocations together stay within each GPU's capacity, and the
// segment that does not fit is refused to the process that asked, which
// raises torch.OutOfMemoryError. Requests are served in arrival order.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "share/protocol.h"

namespace emugpu::share {

class Handler {
 public:
  explicit Handler(std::vector<GpuInfo> gpus);

  // A new connection; returns its client id (attached once it said hello).
  uint64_t connect();
  // The reply to client `client`'s message `m`. Throws emugpu::Error on a
  // message a client never sends (a reply type, a reserve before hello):
  // the caller drops that connection.
  std::vector<uint8_t> handle(uint64_t client, const Message& m);
  // The connection closed (or was dropped): what it held is released.
  void disconnect(uint64_t client);

  Status status() const;
  const std::vector<GpuInfo>& gpus() const { return gpus_; }
  size_t attached() const;

 private:
  struct Client {
    bool attached = false;
    Hello hello;
    std::vector<uint64_t> bytes;  // per GPU
  };
  std::vector<uint8_t> hello(uint64_t id, Client& c, const Message& m);
  std::vector<uint8_t> reserve(Client& c, const Message& m);
  std::vector<uint8_t> release(Client& c, const Message& m);

  std::vector<GpuInfo> gpus_;
  std::vector<uint64_t> used_;  // per GPU, by every client
  std::map<uint64_t, Client> clients_;
  uint64_t next_id_ = 1;
};

}  // namespace emugpu::share
