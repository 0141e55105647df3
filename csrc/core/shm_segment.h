// POSIX shared-memory segments private to one user and one job. /dev/shm is
// one namespace for every user of a machine, so a segment is only trusted
// when this user created it, nobody else may open it (mode 0600) and a
// process of this user still holds it. Every holder keeps a shared flock on
// it for as long as it maps it: the kernel drops the lock when the process
// dies, however it dies, so a segment nobody locks is stale and the next job
// of the same user removes it (sweep_stale_segments).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace emugpu {

// "/emugpu-u<uid>-<purpose>-<key>", as shm_open wants; `key` keeps
// [A-Za-z0-9_-] (others become '_') and at most 160 characters.
std::string private_segment_name(std::string_view purpose, std::string_view key);

class ShmSegment {
 public:
  // Creates `name` for this user only (O_EXCL, mode 0600), sized `length`
  // and zero-filled; fails if the name exists.
  static ShmSegment create(const std::string& name, size_t length);
  // Opens an existing segment of `length` bytes. Refuses one owned by another
  // user or that others may open, naming its owner and mode.
  static ShmSegment attach(const std::string& name, size_t length);
  // attach(), or create() where the name does not exist. `fresh` says whether
  // this process is the segment's first live holder: then it is zero-filled
  // (a stale segment of a dead job with the same name starts over).
  static ShmSegment attach_or_create(const std::string& name, size_t length, bool& fresh);

  ShmSegment(ShmSegment&& other) noexcept;
  ShmSegment& operator=(ShmSegment&& other) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();  // unmaps and releases the lock; the name stays (unlink())

  void* data() const { return data_; }
  size_t length() const { return length_; }
  const std::string& name() const { return name_; }

  // Removes a segment's name; holders keep their mappings. Never throws.
  static void unlink(const std::string& name);

 private:
  ShmSegment(std::string name, int fd, void* data, size_t length);
  std::string name_;
  int fd_ = -1;  // kept open: it holds the shared flock
  void* data_ = nullptr;
  size_t length_ = 0;
};

// Removes this user's emugpu segments that no live process holds and that
// are older than `min_age_s` (younger ones may be between creation and
// lock). Returns the names removed. Segments of other users are never
// touched.
std::vector<std::string> sweep_stale_segments(double min_age_s = 2.0);

// Names this process removes when SIGTERM ends it (normal exits remove
// them through their owners). The handler is installed only where SIGTERM
// has its default action, and then ends the process as SIGTERM would.
void unlink_on_sigterm(const std::string& name);
void forget_on_sigterm(const std::string& name);

}  // namespace emugpu
