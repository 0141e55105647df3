// A process's connection to emugpud: blocking requests and their replies,
// one at a time (a lock serialises the threads that allocate). Used at the
// grain of allocator segments and of share reports, never per op.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "share/address.h"
#include "share/protocol.h"

namespace emugpu::share {

class Client {
 public:
  // Connects and attaches. Throws emugpu::Error (kRuntime) naming the
  // address and how to start the daemon when none answers there, and the
  // daemon's own message when it refuses the process.
  Client(const std::string& address, const Hello& hello);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const Welcome& welcome() const { return welcome_; }
  const std::string& address() const { return address_; }
  // nullopt: granted; else what the daemon saw when it refused.
  std::optional<Refused> reserve(uint32_t gpu, uint64_t bytes);
  void release(uint32_t gpu, uint64_t bytes);
  // Reports this process's compute on a GPU; returns its share (every
  // welcome().report_ns of real time, never per op).
  ShareGrant share(const ShareReport& report);
  Status status();

  // The daemon's view without attaching (torch-emugpu smi).
  static Status query(const std::string& address);

 private:
  explicit Client(const std::string& address);  // connected, not attached
  Message request(const std::vector<uint8_t>& bytes, uint32_t id, const char* what);

  std::string address_;
  int fd_ = -1;
  std::mutex mutex_;
  uint32_t next_id_ = 1;
  Parser parser_;
  Welcome welcome_;
};

}  // namespace emugpu::share
