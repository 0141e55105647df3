// All-gathers among the ranks of one process group that share a machine,
// through one POSIX shared-memory segment: a few words per rank per
// collective (the emulated start times), and small byte buffers. It replaces
// a TCP round trip per collective with a store and a futex wake, which is
// what lets eight ranks on two cores exchange in microseconds.
//
// Gathers pair up across ranks by the order each rank starts them (ticket
// k of every rank is one gather), as the TCP transport's do. A rank may run
// up to kDepth word gathers ahead of the slowest reader before start waits.
// A rank that exits is noticed within kPollNs of a wait (its pid is gone or
// a zombie), not only at the timeout.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "exchange/transport.h"
#include "shm_segment.h"

namespace emugpu {

class ShmExchange : public Transport {
 public:
  static constexpr uint64_t kDepth = 1024;
  static constexpr uint64_t kDataDepth = 2;
  static constexpr size_t kDataCapacity = 256 * 1024;
  static constexpr int64_t kPollNs = 50'000'000;
  static constexpr int kMaxRanks = 4096;

  // Rank 0 creates the segment `name` ("/..." as shm_open wants, unique per
  // group; see private_segment_name), stamped with `token`; the other ranks
  // open it with the same token (a stale, foreign or other user's segment
  // fails to open).
  static std::unique_ptr<ShmExchange> create(const std::string& name, int size, uint64_t token);
  static std::unique_ptr<ShmExchange> open(const std::string& name, int rank, int size, uint64_t token);
  ~ShmExchange() override;
  ShmExchange(const ShmExchange&) = delete;
  ShmExchange& operator=(const ShmExchange&) = delete;

  // Removes the segment's name; every rank keeps its mapping. Call once all
  // ranks opened it, so that no crash leaves it behind.
  static void unlink(const std::string& name);

  // Publishes this rank's `count` words (count <= kMaxWords, the same on
  // every rank) and returns the gather's ticket; waits only while the ring
  // is full.
  uint64_t start_gather(const int64_t* words, int count, std::chrono::nanoseconds timeout) override;
  // Waits for every rank's words of `ticket` and writes them to `out`
  // (size() rows of `count`). Any thread; tickets may finish in any order.
  void finish_gather(uint64_t ticket, int64_t* out, int count, std::chrono::nanoseconds timeout) override;

  // All-gathers up to kDataCapacity bytes per rank (lengths may differ):
  // calls `read(rank, bytes, length)` for each rank, in rank order, while
  // the bytes are valid. One at a time per process.
  void gather_bytes(const void* data, size_t length, std::chrono::nanoseconds timeout, const ByteReader& read) override;
  size_t bytes_capacity() const override { return kDataCapacity; }
  const char* kind() const override { return "shm"; }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  struct Signal;
  struct Header;
  struct WordSlot;
  struct DataSlot;

 private:
  ShmExchange(ShmSegment segment, int rank, int size);
  static size_t segment_bytes(int size);
  WordSlot& word_slot(uint64_t ticket, int rank) const;
  DataSlot& data_slot(uint64_t ticket, int rank) const;
  // Waits until `ready()` holds, checking `missing()` ranks for exits.
  void wait_until(Signal& signal, const std::function<bool()>& ready, const std::function<int()>& missing,
                  std::chrono::nanoseconds timeout, const char* what, uint64_t ticket, const char* lag) const;
  void notify(Signal& signal) const;
  void finished(uint64_t ticket);
  // The first rank that has not yet read (word or byte) gather `ticket`, or -1.
  int first_behind(bool data, uint64_t ticket) const;
  // Waits until every rank read gather `reused`, whose slot `ticket` reuses.
  void wait_for_room(bool data, uint64_t reused, std::chrono::nanoseconds timeout, const char* what,
                     uint64_t ticket) const;

  ShmSegment segment_;  // mapped and locked for as long as the exchange lives
  void* base_;
  int rank_;
  int size_;
  Header* header_;
  std::mutex mutex_;  // tickets and the finished set (main thread and resolver thread)
  uint64_t next_ticket_ = 0;
  uint64_t low_unfinished_ = 0;
  std::set<uint64_t> finished_above_low_;
  uint64_t next_data_ticket_ = 0;
};

}  // namespace emugpu
