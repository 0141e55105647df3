#include "exchange/shm_exchange.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <thread>

#include "clock.h"
#include "error.h"

namespace emugpu {

namespace {
constexpr uint64_t kMagic = 0x656d7567707573ULL;  // "emugpus"
constexpr size_t kLine = 64;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct alignas(kLine) PaddedCounter {
  std::atomic<uint64_t> value;
};

using Steady = std::chrono::steady_clock;

// Whether process `pid` is gone: no such process, or a zombie nobody reaped.
bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const size_t paren = text.rfind(')');
  return paren != std::string::npos && paren + 2 < text.size() && (text[paren + 2] == 'Z' || text[paren + 2] == 'X');
}
}  // namespace

// A futex word bumped on every notify, and how many wait on it (so that a
// notify with no sleeper costs no syscall).
struct alignas(kLine) ShmExchange::Signal {
  std::atomic<uint32_t> generation;
  std::atomic<uint32_t> sleepers;
};

struct ShmExchange::Header {
  uint64_t magic;
  uint64_t token;
  int32_t size;
  // Separate signals, so that each gather wakes its waiters once (when its
  // last rank arrives), not on every rank's arrival and every read.
  Signal arrived;   // a gather became complete
  Signal consumed;  // a rank finished reading a gather (ring-full waits)
};

struct alignas(kLine) ShmExchange::WordSlot {
  std::atomic<uint64_t> ticket_plus_one;  // 0: never written
  int32_t count;
  int64_t words[kMaxWords];
};

struct alignas(kLine) ShmExchange::DataSlot {
  std::atomic<uint64_t> ticket_plus_one;
  uint64_t length;
};

namespace {
// Offsets of the segment's arrays for `size` ranks.
struct Layout {
  size_t pids, consumed, data_consumed, words, data, total;
  explicit Layout(int size) {
    const size_t n = static_cast<size_t>(size);
    pids = round_up(sizeof(ShmExchange::Header), kLine);
    consumed = round_up(pids + n * sizeof(std::atomic<int32_t>), kLine);
    data_consumed = consumed + n * sizeof(PaddedCounter);
    words = data_consumed + n * sizeof(PaddedCounter);
    data = round_up(words + ShmExchange::kDepth * n * sizeof(ShmExchange::WordSlot), 4096);
    total = data + ShmExchange::kDataDepth * n * data_stride();
  }
  static size_t data_stride() { return round_up(sizeof(ShmExchange::DataSlot) + ShmExchange::kDataCapacity, 4096); }
};

template <typename T>
T* at(void* base, size_t offset) {
  return reinterpret_cast<T*>(static_cast<char*>(base) + offset);
}
}  // namespace

size_t ShmExchange::segment_bytes(int size) { return Layout(size).total; }

std::unique_ptr<ShmExchange> ShmExchange::create(const std::string& name, int size, uint64_t token) {
  EMUGPU_CHECK(size >= 1 && size <= kMaxRanks, kValue, "shared-memory exchange: expected 1 to ", kMaxRanks,
               " ranks, got ", size);
  // Sparse on tmpfs: pages cost memory only once written.
  ShmSegment segment = ShmSegment::create(name, segment_bytes(size));
  auto* header = static_cast<Header*>(segment.data());
  header->token = token;
  header->size = size;
  // The magic last: a rank that opens early sees a segment that is not ready.
  std::atomic_ref<uint64_t>(header->magic).store(kMagic, std::memory_order_release);
  return std::unique_ptr<ShmExchange>(new ShmExchange(std::move(segment), 0, size));
}

std::unique_ptr<ShmExchange> ShmExchange::open(const std::string& name, int rank, int size, uint64_t token) {
  EMUGPU_CHECK(size >= 1 && size <= kMaxRanks && rank >= 0 && rank < size, kValue,
               "shared-memory exchange: expected a rank in [0, ", size, ") of 1 to ", kMaxRanks, " ranks, got rank ",
               rank, " of ", size);
  ShmSegment segment = ShmSegment::attach(name, segment_bytes(size));
  auto* header = static_cast<Header*>(segment.data());
  const bool ours = std::atomic_ref<uint64_t>(header->magic).load(std::memory_order_acquire) == kMagic &&
                    header->token == token && header->size == size;
  EMUGPU_CHECK(ours, kRuntime, "shared-memory exchange: ", name, " is not this group's segment (token or size differ)");
  return std::unique_ptr<ShmExchange>(new ShmExchange(std::move(segment), rank, size));
}

void ShmExchange::unlink(const std::string& name) { ShmSegment::unlink(name); }

ShmExchange::ShmExchange(ShmSegment segment, int rank, int size)
    : segment_(std::move(segment)),
      base_(segment_.data()),
      rank_(rank),
      size_(size),
      header_(static_cast<Header*>(base_)) {
  at<std::atomic<int32_t>>(base_, Layout(size_).pids)[rank_].store(static_cast<int32_t>(getpid()));
}

ShmExchange::~ShmExchange() = default;

ShmExchange::WordSlot& ShmExchange::word_slot(uint64_t ticket, int rank) const {
  auto* slots = at<WordSlot>(base_, Layout(size_).words);
  return slots[(ticket % kDepth) * static_cast<uint64_t>(size_) + static_cast<uint64_t>(rank)];
}

ShmExchange::DataSlot& ShmExchange::data_slot(uint64_t ticket, int rank) const {
  const Layout layout(size_);
  const uint64_t index = (ticket % kDataDepth) * static_cast<uint64_t>(size_) + static_cast<uint64_t>(rank);
  return *at<DataSlot>(base_, layout.data + index * Layout::data_stride());
}

int ShmExchange::first_behind(bool data, uint64_t ticket) const {
  const Layout layout(size_);
  const auto* counters = at<PaddedCounter>(base_, data ? layout.data_consumed : layout.consumed);
  for (int r = 0; r < size_; ++r)
    if (counters[r].value.load(std::memory_order_seq_cst) <= ticket) return r;
  return -1;
}

void ShmExchange::wait_for_room(bool data, uint64_t reused, std::chrono::nanoseconds timeout, const char* what,
                                uint64_t ticket) const {
  auto behind = [&] { return first_behind(data, reused); };
  wait_until(
      header_->consumed, [&] { return behind() < 0; }, behind, timeout, what, ticket, " to read earlier gathers");
}

void ShmExchange::notify(Signal& signal) const {
  signal.generation.fetch_add(1, std::memory_order_seq_cst);
  if (signal.sleepers.load(std::memory_order_seq_cst) > 0) {
    syscall(SYS_futex, &signal.generation, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

void ShmExchange::wait_until(Signal& signal, const std::function<bool()>& ready, const std::function<int()>& missing,
                             std::chrono::nanoseconds timeout, const char* what, uint64_t ticket,
                             const char* lag) const {
  if (ready()) return;
  // A few yields first: on a busy host the other ranks often need only a time slice.
  for (int i = 0; i < 4; ++i) {
    std::this_thread::yield();
    if (ready()) return;
  }
  const auto deadline = Steady::now() + timeout;
  auto next_interrupt_check = Steady::now() + std::chrono::nanoseconds(kInterruptSliceNs);
  const auto* pids = at<std::atomic<int32_t>>(base_, Layout(size_).pids);
  for (;;) {
    signal.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t seen = signal.generation.load(std::memory_order_seq_cst);
    if (ready()) {
      signal.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      return;
    }
    const auto left = deadline - Steady::now();
    const int64_t nap = std::max<int64_t>(1, std::min<int64_t>(kPollNs, left.count()));
    const timespec ts{static_cast<time_t>(nap / 1'000'000'000), static_cast<long>(nap % 1'000'000'000)};
    syscall(SYS_futex, &signal.generation, FUTEX_WAIT, seen, &ts, nullptr, 0);
    signal.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (ready()) return;
    const int absent = missing();
    if (absent >= 0) {
      const int pid = pids[absent].load();
      EMUGPU_CHECK(!process_gone(pid), kRuntime, "rank ", rank_, " of ", size_, ": ", what, " ", ticket,
                   " cannot complete: rank ", absent, " (pid ", pid, ") exited");
    }
    EMUGPU_CHECK(Steady::now() < deadline, kRuntime, "rank ", rank_, " of ", size_, ": ", what, " ", ticket, " waited ",
                 std::chrono::duration<double>(timeout).count(), " s for rank ", absent, lag);
    if (Steady::now() >= next_interrupt_check) {  // Ctrl-C while a peer is missing
      check_wait_interrupt();
      next_interrupt_check = Steady::now() + std::chrono::nanoseconds(kInterruptSliceNs);
    }
  }
}

uint64_t ShmExchange::start_gather(const int64_t* words, int count, std::chrono::nanoseconds timeout) {
  EMUGPU_CHECK(count >= 0 && count <= kMaxWords, kValue, "shared-memory exchange: expected at most ", kMaxWords,
               " words per gather, got ", count);
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ticket = next_ticket_++;
  }
  // The slot last held ticket - kDepth: every rank must have read it.
  if (ticket >= kDepth) wait_for_room(false, ticket - kDepth, timeout, "word gather (ring full)", ticket);
  WordSlot& slot = word_slot(ticket, rank_);
  slot.count = count;
  std::memcpy(slot.words, words, sizeof(int64_t) * static_cast<size_t>(count));
  slot.ticket_plus_one.store(ticket + 1, std::memory_order_seq_cst);
  // The last rank to arrive wakes the waiters (seq_cst: of two arriving
  // together, the later one sees both).
  bool complete = true;
  for (int r = 0; r < size_ && complete; ++r)
    complete = word_slot(ticket, r).ticket_plus_one.load(std::memory_order_seq_cst) == ticket + 1;
  if (complete) notify(header_->arrived);
  return ticket;
}

void ShmExchange::finish_gather(uint64_t ticket, int64_t* out, int count, std::chrono::nanoseconds timeout) {
  auto first_missing = [&] {
    for (int r = 0; r < size_; ++r)
      if (word_slot(ticket, r).ticket_plus_one.load(std::memory_order_seq_cst) != ticket + 1) return r;
    return -1;
  };
  wait_until(
      header_->arrived, [&] { return first_missing() < 0; }, first_missing, timeout, "word gather", ticket,
      ", which did not arrive");
  for (int r = 0; r < size_; ++r) {
    const WordSlot& slot = word_slot(ticket, r);
    EMUGPU_CHECK(slot.count == count, kRuntime, "rank ", rank_, " of ", size_, ": word gather ", ticket, " expected ",
                 count, " words from every rank, got ", slot.count, " from rank ", r,
                 "; the ranks' collectives are out of step");
    std::memcpy(out + static_cast<ptrdiff_t>(r) * count, slot.words, sizeof(int64_t) * static_cast<size_t>(count));
  }
  finished(ticket);
}

void ShmExchange::finished(uint64_t ticket) {
  uint64_t low;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_above_low_.insert(ticket);
    while (!finished_above_low_.empty() && *finished_above_low_.begin() == low_unfinished_) {
      finished_above_low_.erase(finished_above_low_.begin());
      ++low_unfinished_;
    }
    low = low_unfinished_;
  }
  at<PaddedCounter>(base_, Layout(size_).consumed)[rank_].value.store(low, std::memory_order_seq_cst);
  notify(header_->consumed);
}

void ShmExchange::gather_bytes(const void* data, size_t length, std::chrono::nanoseconds timeout,
                               const std::function<void(int, const void*, size_t)>& read) {
  EMUGPU_CHECK(length <= kDataCapacity, kValue, "shared-memory exchange: expected at most ", kDataCapacity,
               " bytes per rank, got ", length);
  const uint64_t ticket = next_data_ticket_++;
  auto* consumed = at<PaddedCounter>(base_, Layout(size_).data_consumed);
  if (ticket >= kDataDepth) wait_for_room(true, ticket - kDataDepth, timeout, "byte gather (ring full)", ticket);
  DataSlot& mine = data_slot(ticket, rank_);
  mine.length = length;
  if (length > 0) std::memcpy(reinterpret_cast<char*>(&mine) + sizeof(DataSlot), data, length);
  mine.ticket_plus_one.store(ticket + 1, std::memory_order_seq_cst);
  auto first_missing = [&] {
    for (int r = 0; r < size_; ++r)
      if (data_slot(ticket, r).ticket_plus_one.load(std::memory_order_seq_cst) != ticket + 1) return r;
    return -1;
  };
  if (first_missing() < 0) notify(header_->arrived);
  wait_until(
      header_->arrived, [&] { return first_missing() < 0; }, first_missing, timeout, "byte gather", ticket,
      ", which did not arrive");
  for (int r = 0; r < size_; ++r) {
    const DataSlot& slot = data_slot(ticket, r);
    EMUGPU_CHECK(slot.length <= kDataCapacity, kRuntime, "rank ", rank_, " of ", size_, ": byte gather ", ticket,
                 " read a length of ", slot.length, " bytes from rank ", r, "'s slot, expected at most ", kDataCapacity,
                 "; the segment was written by something other than this group's ranks");
    read(r, reinterpret_cast<const char*>(&slot) + sizeof(DataSlot), slot.length);
  }
  consumed[rank_].value.store(ticket + 1, std::memory_order_seq_cst);
  notify(header_->consumed);
}

}  // namespace emugpu
