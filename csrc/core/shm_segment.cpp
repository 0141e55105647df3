#include "shm_segment.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include "error.h"

namespace emugpu {
namespace {

constexpr const char* kShmDir = "/dev/shm";  // where glibc's shm_open keeps names

std::string user_prefix() { return "emugpu-u" + std::to_string(geteuid()) + "-"; }

std::string owner_name(uid_t uid) {
  const passwd* pw = getpwuid(uid);
  return (pw != nullptr ? std::string(pw->pw_name) + " " : std::string()) + "(uid " + std::to_string(uid) + ")";
}

void check_name(const std::string& name) {
  EMUGPU_CHECK(name.size() > 1 && name.size() < 250 && name[0] == '/' && name.find('/', 1) == std::string::npos, kValue,
               "shared memory: expected a name '/word' under 250 characters, got '", name.substr(0, 80), "'");
}

// Refuses a segment this user did not create or that others may open: its
// contents would come from someone this job does not trust.
void check_private(int fd, const std::string& name) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    EMUGPU_CHECK(false, kRuntime, "shared memory ", name, ": could not stat it: ", std::strerror(err));
  }
  const bool regular = S_ISREG(st.st_mode);
  const bool ours = st.st_uid == geteuid();
  const bool private_mode = (st.st_mode & 077) == 0;
  if (regular && ours && private_mode) return;
  close(fd);
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  EMUGPU_CHECK(false, kRuntime, "shared memory ", kShmDir, name, ": expected a segment created by you (",
               owner_name(geteuid()), ") with mode 0600, found one owned by ", owner_name(st.st_uid), " with mode ",
               mode, (regular ? "" : " that is not a regular file"),
               ". Another user may have planted it: this job will not use it. Remove it (as root or its owner) "
               "or run the job under another job id");
}

// Whether `fd` is still the object that `name` names (a sweep may have
// removed the name between our open and our lock).
bool still_named(int fd, const std::string& name) {
  struct stat by_fd {
  }, by_name{};
  if (fstat(fd, &by_fd) != 0) return false;
  const std::string path = std::string(kShmDir) + name;
  if (stat(path.c_str(), &by_name) != 0) return false;
  return by_fd.st_ino == by_name.st_ino && by_fd.st_dev == by_name.st_dev;
}

void* map_or_throw(int fd, size_t length, const std::string& name) {
  void* data = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int err = errno;
    close(fd);
    EMUGPU_CHECK(false, kRuntime, "shared memory ", name, ": could not map ", length, " bytes: ", std::strerror(err));
  }
  return data;
}

off_t size_of(int fd) {
  struct stat st {};
  return fstat(fd, &st) == 0 ? st.st_size : -1;
}

// Full paths to unlink on SIGTERM: fixed storage, since the handler may
// only call async-signal-safe functions (unlink is; allocation is not).
constexpr int kTermSlots = 16;
struct TermSlot {
  std::atomic<bool> used{false};
  pid_t owner = 0;  // a fork()ed child (a data loader worker) must not remove its parent's names
  char path[300] = {};
};
std::array<TermSlot, kTermSlots> term_slots;
std::mutex term_mutex;

void on_sigterm(int) {
  const pid_t me = getpid();
  for (auto& slot : term_slots)
    if (slot.used.load(std::memory_order_acquire) && slot.owner == me) ::unlink(slot.path);
  // SA_RESETHAND restored the default action; the signal is blocked until
  // this handler returns, and then ends the process as SIGTERM would.
  raise(SIGTERM);
}

void install_sigterm_handler() {
  struct sigaction current {};
  if (sigaction(SIGTERM, nullptr, &current) != 0) return;
  const bool default_action = !(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_DFL;
  if (!default_action) return;  // someone else's handler: their exit path runs the atexit cleanup
  struct sigaction ours {};
  ours.sa_handler = on_sigterm;
  sigemptyset(&ours.sa_mask);
  ours.sa_flags = SA_RESETHAND;
  sigaction(SIGTERM, &ours, nullptr);
}

}  // namespace

std::string private_segment_name(std::string_view purpose, std::string_view key) {
  std::string clean;
  for (char ch : key.substr(0, 160))
    clean.push_back(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' ? ch : '_');
  std::string name = "/";  // appended piecewise: GCC 12 warns (-Wrestrict) on "/" + string&&
  name.append(user_prefix()).append(purpose).append("-").append(clean);
  return name;
}

ShmSegment::ShmSegment(std::string name, int fd, void* data, size_t length)
    : name_(std::move(name)), fd_(fd), data_(data), length_(length) {}

ShmSegment::ShmSegment(ShmSegment&& other) noexcept
    : name_(std::move(other.name_)), fd_(other.fd_), data_(other.data_), length_(other.length_) {
  other.fd_ = -1;
  other.data_ = nullptr;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& other) noexcept {
  if (this != &other) {
    this->~ShmSegment();
    new (this) ShmSegment(std::move(other));
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) munmap(data_, length_);
  if (fd_ >= 0) close(fd_);
}

ShmSegment ShmSegment::create(const std::string& name, size_t length) {
  check_name(name);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  EMUGPU_CHECK(fd >= 0, kRuntime, "shared memory: could not create ", name, ": ", std::strerror(errno));
  // The umask may only remove bits; fchmod makes the mode exactly 0600 so
  // that the job's other processes (same user) can open it.
  if (fchmod(fd, 0600) != 0 || ftruncate(fd, static_cast<off_t>(length)) != 0 || flock(fd, LOCK_SH) != 0) {
    const int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    EMUGPU_CHECK(false, kRuntime, "shared memory: could not set up ", name, " (", length,
                 " bytes): ", std::strerror(err));
  }
  void* data = nullptr;
  try {
    data = map_or_throw(fd, length, name);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
  return ShmSegment(name, fd, data, length);
}

ShmSegment ShmSegment::attach(const std::string& name, size_t length) {
  check_name(name);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  EMUGPU_CHECK(fd >= 0, kRuntime, "shared memory: could not open ", name, ": ", std::strerror(errno));
  check_private(fd, name);
  const off_t found = size_of(fd);
  if (flock(fd, LOCK_SH) != 0 || found != static_cast<off_t>(length)) {
    close(fd);
    EMUGPU_CHECK(false, kRuntime, "shared memory ", name, ": expected ", length, " bytes, found ", found,
                 "; it belongs to another group or version");
  }
  return ShmSegment(name, fd, map_or_throw(fd, length, name), length);
}

ShmSegment ShmSegment::attach_or_create(const std::string& name, size_t length, bool& fresh) {
  check_name(name);
  for (int attempt = 0; attempt < 8; ++attempt) {
    int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd >= 0) {
      fchmod(fd, 0600);
    } else {
      EMUGPU_CHECK(errno == EEXIST, kRuntime, "shared memory: could not create ", name, ": ", std::strerror(errno));
      fd = shm_open(name.c_str(), O_RDWR, 0);
      if (fd < 0 && errno == ENOENT) continue;  // removed in between: try again
      EMUGPU_CHECK(fd >= 0, kRuntime, "shared memory: could not open ", name, ": ", std::strerror(errno));
    }
    check_private(fd, name);
    // The first live holder initialises, under an exclusive lock that no
    // other holder can have; everyone else waits for a shared one.
    fresh = flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (!fresh && flock(fd, LOCK_SH) != 0) {
      const int err = errno;
      close(fd);
      EMUGPU_CHECK(false, kRuntime, "shared memory ", name, ": could not lock it: ", std::strerror(err));
    }
    if (!still_named(fd, name)) {  // swept while we waited: start over with the name's new object
      close(fd);
      continue;
    }
    if (fresh && size_of(fd) != static_cast<off_t>(length) && ftruncate(fd, static_cast<off_t>(length)) != 0) {
      const int err = errno;
      close(fd);
      EMUGPU_CHECK(false, kRuntime, "shared memory ", name, ": could not size it to ", length,
                   " bytes: ", std::strerror(err));
    }
    const off_t found = size_of(fd);
    if (found != static_cast<off_t>(length)) {
      close(fd);
      EMUGPU_CHECK(false, kRuntime, "shared memory ", name, ": expected ", length, " bytes, found ", found,
                   "; it belongs to another version of torch-emugpu: stop that job or remove ", kShmDir, name);
    }
    void* data = map_or_throw(fd, length, name);
    if (fresh) {
      std::memset(data, 0, length);
      flock(fd, LOCK_SH);  // a conversion: holders that arrive from now on share it
    }
    return ShmSegment(name, fd, data, length);
  }
  EMUGPU_CHECK(false, kRuntime, "shared memory ", name, ": it kept disappearing while being opened; try again");
  return ShmSegment("", -1, nullptr, 0);  // not reached
}

void ShmSegment::unlink(const std::string& name) {
  if (!name.empty()) shm_unlink(name.c_str());
}

std::vector<std::string> sweep_stale_segments(double min_age_s) {
  std::vector<std::string> removed;
  DIR* dir = opendir(kShmDir);
  if (dir == nullptr) return removed;
  const std::string prefix = user_prefix();
  const time_t now = time(nullptr);
  while (const dirent* entry = readdir(dir)) {
    const std::string file = entry->d_name;
    if (file.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string path = std::string(kShmDir) + "/" + file;
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) continue;
    if (static_cast<double>(now - st.st_ctime) < min_age_s) continue;
    const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat by_fd {};
    const bool same = fstat(fd, &by_fd) == 0 && by_fd.st_ino == st.st_ino;
    if (same && flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(path.c_str()) == 0) removed.push_back("/" + file);
    close(fd);
  }
  closedir(dir);
  return removed;
}

void unlink_on_sigterm(const std::string& name) {
  const std::string path = std::string(kShmDir) + name;
  std::lock_guard<std::mutex> lock(term_mutex);
  static bool installed = false;
  if (!installed) {
    install_sigterm_handler();
    installed = true;
  }
  for (auto& slot : term_slots) {
    if (slot.used.load(std::memory_order_acquire) && path == slot.path) return;
  }
  for (auto& slot : term_slots) {
    if (slot.used.load(std::memory_order_acquire) || path.size() >= sizeof(slot.path)) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.owner = getpid();
    slot.used.store(true, std::memory_order_release);
    return;
  }
}

void forget_on_sigterm(const std::string& name) {
  const std::string path = std::string(kShmDir) + name;
  std::lock_guard<std::mutex> lock(term_mutex);
  for (auto& slot : term_slots) {
    if (slot.used.load(std::memory_order_acquire) && path == slot.path)
      slot.used.store(false, std::memory_order_release);
  }
}

}  // namespace emugpu
