#include "shm_segment.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "error.h"
#include "pcie_links.h"

namespace {

using emugpu::ShmSegment;

std::string test_name(const std::string& what) {
  return emugpu::private_segment_name("test", what + "-" + std::to_string(getpid()));
}

bool exists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const emugpu::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ShmSegment, NamesCarryTheUserAndOnlySafeCharacters) {
  const std::string name = emugpu::private_segment_name("pcie", "run/../x y");
  EXPECT_EQ(name, "/emugpu-u" + std::to_string(geteuid()) + "-pcie-run____x_y");
  EXPECT_LE(emugpu::private_segment_name("x", std::string(1000, 'a')).size(), 200u);
}

TEST(ShmSegment, CreatedSegmentsAreModeSixHundredAndOurs) {
  const std::string name = test_name("mode");
  const mode_t old = umask(0);  // a permissive umask must not widen them
  ShmSegment segment = ShmSegment::create(name, 4096);
  umask(old);
  struct stat st {};
  ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_THROW(ShmSegment::create(name, 4096), emugpu::Error);  // O_EXCL: never reuses a name
  ShmSegment::unlink(name);
}

TEST(ShmSegment, ASegmentOthersMayOpenIsRefusedNamingItsMode) {
  const std::string name = test_name("planted-mode");
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0666);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(fchmod(fd, 0666), 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  close(fd);
  bool fresh = false;
  const std::string error = error_of([&] { ShmSegment::attach_or_create(name, 4096, fresh); });
  EXPECT_NE(error.find("mode 0666"), std::string::npos) << error;
  EXPECT_NE(error.find(name), std::string::npos) << error;
  EXPECT_NE(error.find("will not use it"), std::string::npos) << error;
  EXPECT_NE(error_of([&] { ShmSegment::attach(name, 4096); }).find("mode 0666"), std::string::npos);
  ShmSegment::unlink(name);
}

TEST(ShmSegment, ASegmentOfAnotherUserIsRefusedNamingItsOwner) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to plant a segment as another user (uid 65534)";
  const std::string name = test_name("planted-owner");
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the hostile user: a private-looking segment, but theirs
    if (setuid(65534) != 0) _exit(2);
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    _exit(fd >= 0 && ftruncate(fd, 4096) == 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the second user could not plant the segment";
  bool fresh = false;
  const std::string error = error_of([&] { ShmSegment::attach_or_create(name, 4096, fresh); });
  EXPECT_NE(error.find("owned by"), std::string::npos) << error;
  EXPECT_NE(error.find("uid 65534"), std::string::npos) << error;
  ShmSegment::unlink(name);
}

TEST(ShmSegment, HoldersShareContentsAndTheFirstLiveHolderStartsOver) {
  const std::string name = test_name("holders");
  bool fresh = false;
  {
    ShmSegment first = ShmSegment::attach_or_create(name, 4096, fresh);
    EXPECT_TRUE(fresh);
    static_cast<int64_t*>(first.data())[0] = 42;
    ShmSegment second = ShmSegment::attach_or_create(name, 4096, fresh);
    EXPECT_FALSE(fresh);  // the first still holds it
    EXPECT_EQ(static_cast<int64_t*>(second.data())[0], 42);
  }
  // Nobody holds it now: a dead job's leftover, zeroed for the next.
  ShmSegment again = ShmSegment::attach_or_create(name, 4096, fresh);
  EXPECT_TRUE(fresh);
  EXPECT_EQ(static_cast<int64_t*>(again.data())[0], 0);
  bool ignored = false;
  EXPECT_NE(error_of([&] { ShmSegment::attach_or_create(name, 8192, ignored); }).find("expected 8192 bytes"),
            std::string::npos);
  ShmSegment::unlink(name);
}

TEST(ShmSegment, SweepRemovesOnlySegmentsNoLiveProcessHolds) {
  const std::string held = test_name("held");
  const std::string dead = test_name("dead");
  ShmSegment holding = ShmSegment::create(held, 4096);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // a rank SIGKILLed while holding its segment
    ShmSegment mine = ShmSegment::create(dead, 4096);
    raise(SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(exists(dead));
  const auto young = emugpu::sweep_stale_segments(3600);  // too young to judge
  EXPECT_EQ(std::find(young.begin(), young.end(), dead), young.end());
  const auto removed = emugpu::sweep_stale_segments(0);
  EXPECT_NE(std::find(removed.begin(), removed.end(), dead), removed.end());
  EXPECT_EQ(std::find(removed.begin(), removed.end(), held), removed.end());
  EXPECT_FALSE(exists(dead));
  EXPECT_TRUE(exists(held));
  ShmSegment::unlink(held);
}

TEST(ShmSegment, SigtermRemovesRegisteredNamesButNotAForkedChildsParents) {
  const std::string name = test_name("sigterm");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t rank = fork();
  ASSERT_GE(rank, 0);
  if (rank == 0) {
    ShmSegment mine = ShmSegment::create(name, 4096);
    emugpu::unlink_on_sigterm(name);
    const pid_t worker = fork();  // a data loader worker terminated on its own
    if (worker == 0) raise(SIGTERM);
    int worker_status = 0;
    waitpid(worker, &worker_status, 0);
    const char ok = exists(name) && WIFSIGNALED(worker_status) ? 'y' : 'n';
    if (write(ready[1], &ok, 1) != 1) _exit(3);
    for (;;) pause();
  }
  char ok = 0;
  ASSERT_EQ(read(ready[0], &ok, 1), 1);
  EXPECT_EQ(ok, 'y') << "a forked child's SIGTERM removed its parent's segment";
  kill(rank, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(rank, &status, 0), rank);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << "the handler must still end the process";
  EXPECT_FALSE(exists(name));
  close(ready[0]);
  close(ready[1]);
  ShmSegment::unlink(name);
}

TEST(PcieLinksShared, APlantedFreeTimeIsRefusedNotSummed) {
  const std::string name = test_name("pcie-planted");
  auto links = emugpu::PcieLinks::shared(name);
  {
    ShmSegment raw = ShmSegment::attach(name, 2 * emugpu::PcieLinks::kMaxUplinks * sizeof(int64_t));
    static_cast<int64_t*>(raw.data())[0] = INT64_MAX;  // uplink 0, to the device
  }
  const std::string error = error_of([&] { links->reserve(0, true, 1000, 10); });
  EXPECT_NE(error.find("busy until 9223372036854775807"), std::string::npos) << error;
  EXPECT_EQ(links->reserve(0, false, 1000, 10), 1000);  // the other direction is untouched
  emugpu::PcieLinks::unlink(name);
}

}  // namespace
