// emugpud's state and rules, as a pure request handler: the GPUs it owns,
// the attached processes and the memory each holds on each GPU. No I/O and
// no locks: sessions call it from the server's one thread.
//
// Memory is arbitrated at the grain of the caching allocator's segments
// (2 MiB and up, taken rarely once a job is warm), never per tensor: the
// processes' allocations together stay within each GPU's capacity, and the
// segment that does not fit is refused to the process that asked, which
// raises torch.OutOfMemoryError. Requests are served in arrival order.
//
// Compute is shared at the grain of share reports (policy.h): a process
// reports how busy it kept a GPU and gets back the share of the GPU's speed
// its kernels run at until its next report.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "daemon/policy.h"
#include "share/protocol.h"

namespace emugpu::share {

class Handler {
 public:
  // `real_now`: real time, for the age of share reports (tests inject their own).
  explicit Handler(
      std::vector<GpuInfo> gpus, SharingConfig sharing = {},
      std::function<TimeNs()> real_now = [] { return steady_clock().now(); });

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
  const SharingConfig& sharing() const { return sharing_; }
  size_t attached() const;

 private:
  struct Client {
    bool attached = false;
    Hello hello;
    std::vector<uint64_t> bytes;       // per GPU
    std::vector<ShareReport> reports;  // per GPU, the last one
    std::vector<TimeNs> reported_at;   // per GPU, real time (0: never)
    // Per GPU, real time another's pacing first waited on this clock since
    // the clock last moved (kNoTime: nobody waits on it).
    std::vector<TimeNs> awaited_since;
    std::vector<uint32_t> granted;  // per GPU, the share last granted (ppm)
  };
  std::vector<uint8_t> hello(uint64_t id, Client& c, const Message& m);
  std::vector<uint8_t> reserve(Client& c, const Message& m);
  std::vector<uint8_t> release(Client& c, const Message& m);
  std::vector<uint8_t> share(uint64_t id, Client& c, const Message& m);
  // Whether `c`'s report on `gpu` still counts at real time `now`.
  bool fresh(const Client& c, uint32_t gpu, TimeNs now) const;

  std::vector<GpuInfo> gpus_;
  SharingConfig sharing_;
  std::function<TimeNs()> real_now_;
  std::vector<uint64_t> used_;  // per GPU, by every client
  std::map<uint64_t, Client> clients_;
  uint64_t next_id_ = 1;
};

}  // namespace emugpu::share
