// How the ranks of one process group reach each other: the interface every
// cross-process protocol (collective words, clock offsets, later the virtual
// clock's timestamps and the sharing daemon's requests) is written against.
// Two implementations: ShmExchange (every rank on this machine: one shared
// segment, futex wakes) and TcpTransport (any ranks: Boost.Asio sockets).
// Transports only move bytes; what the bytes mean lives in words.h and the
// callers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace emugpu {

class Transport {
 public:
  static constexpr int kMaxWords = 8;
  // Called once per rank, in rank order, while `bytes` is valid.
  using ByteReader = std::function<void(int rank, const void* bytes, size_t length)>;

  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "shm" or "tcp": what users set in EMUGPU_EXCHANGE and read in errors.
  virtual const char* kind() const = 0;

  // Publishes this rank's `count` words (count <= kMaxWords, the same on
  // every rank) and returns the gather's ticket. Gathers pair up across
  // ranks in the order each rank starts them, whichever thread does.
  virtual uint64_t start_gather(const int64_t* words, int count, std::chrono::nanoseconds timeout) = 0;
  // Waits for every rank's words of `ticket` and writes them to `out`
  // (size() rows of `count`). Any thread; tickets may finish in any order.
  virtual void finish_gather(uint64_t ticket, int64_t* out, int count, std::chrono::nanoseconds timeout) = 0;

  // The most bytes per rank gather_bytes carries.
  virtual size_t bytes_capacity() const = 0;
  // All-gathers up to bytes_capacity() bytes per rank (lengths may differ).
  // Byte gathers pair up in start order too; one at a time per process.
  virtual void gather_bytes(const void* data, size_t length, std::chrono::nanoseconds timeout,
                            const ByteReader& read) = 0;
};

// A key-value store every rank of a group reaches (c10d's Store in the
// torch layer, a map in tests): how transports find each other.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for `key`; throws emugpu::Error if it never comes.
  virtual std::string get(const std::string& key, std::chrono::nanoseconds timeout) = 0;
};

}  // namespace emugpu
