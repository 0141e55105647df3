#include "pcie_links.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "error.h"

namespace emugpu {
namespace {

constexpr int kSlots = 2 * PcieLinks::kMaxUplinks;
constexpr size_t kLength = kSlots * sizeof(std::atomic<int64_t>);
static_assert(std::atomic<int64_t>::is_always_lock_free, "shared uplinks need address-free atomics");

}  // namespace

PcieLinks::PcieLinks(std::atomic<int64_t>* slots, void* mapping, size_t length)
    : slots_(slots), mapping_(mapping), length_(length) {}

std::shared_ptr<PcieLinks> PcieLinks::in_process() {
  auto own = std::make_unique<std::atomic<int64_t>[]>(kSlots);
  for (int i = 0; i < kSlots; ++i) own[i].store(0);
  std::shared_ptr<PcieLinks> links(new PcieLinks(own.get(), nullptr, 0));
  links->own_ = std::move(own);
  return links;
}

std::shared_ptr<PcieLinks> PcieLinks::shared(const std::string& name) {
  EMUGPU_CHECK(name.size() > 1 && name[0] == '/' && name.find('/', 1) == std::string::npos && name.size() < 250, kValue,
               "PCIe uplinks: expected a shared-memory name '/word' under 250 characters, got '", name, "'");
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  EMUGPU_CHECK(fd >= 0, kRuntime, "PCIe uplinks: could not open shared memory ", name, ": ", std::strerror(errno),
               "; unset EMUGPU_PCIE_SHARED_BY to give every GPU its own link");
  // Sizing is idempotent: the first opener zero-fills, later ones keep the contents.
  struct stat st {};
  if (fstat(fd, &st) != 0 || (static_cast<size_t>(st.st_size) != kLength && ftruncate(fd, kLength) != 0)) {
    const int err = errno;
    close(fd);
    EMUGPU_CHECK(false, kRuntime, "PCIe uplinks: could not size ", name, " to ", kLength,
                 " bytes: ", std::strerror(err));
  }
  void* base = mmap(nullptr, kLength, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  EMUGPU_CHECK(base != MAP_FAILED, kRuntime, "PCIe uplinks: could not map ", name, ": ", std::strerror(err));
  return std::shared_ptr<PcieLinks>(new PcieLinks(static_cast<std::atomic<int64_t>*>(base), base, kLength));
}

void PcieLinks::unlink(const std::string& name) { shm_unlink(name.c_str()); }

PcieLinks::~PcieLinks() {
  if (mapping_ != nullptr) munmap(mapping_, length_);
}

TimeNs PcieLinks::reserve(int uplink, bool to_device, TimeNs earliest, TimeNs occupancy) {
  EMUGPU_CHECK(uplink >= 0 && uplink < kMaxUplinks, kValue, "PCIe uplinks: expected an uplink from 0 to ",
               kMaxUplinks - 1, ", got ", uplink);
  EMUGPU_CHECK(occupancy >= 0, kValue, "PCIe uplinks: expected an occupancy >= 0 ns, got ", occupancy);
  std::atomic<int64_t>& free_at = slots_[2 * uplink + (to_device ? 0 : 1)];
  int64_t seen = free_at.load(std::memory_order_acquire);
  for (;;) {
    const TimeNs begin = std::max(earliest, seen);
    if (free_at.compare_exchange_weak(seen, begin + occupancy, std::memory_order_acq_rel)) return begin;
  }
}

}  // namespace emugpu
