#include "backend/allocator.h"

#include <c10/core/Allocator.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "backend/deferred_copy.h"

namespace emugpu {

namespace {

void delete_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  if (block == nullptr) return;
  bytes_discarded(block);  // copies still to read it are done before its memory is reused
  block->owner->free(block);
}

// A memfd of another process, held open (one descriptor per file, shared by
// its mappings) so that opened storages can be shared on again.
struct SharedFile {
  int fd;
  explicit SharedFile(int f) : fd(f) {}
  ~SharedFile() { close(fd); }
  SharedFile(const SharedFile&) = delete;
  SharedFile& operator=(const SharedFile&) = delete;
};

// The context of a storage opened from another process: the stand-in block
// the storage helpers read (materialized flag), and what to unmap.
struct SharedMapping {
  Block block;  // owner == nullptr: not this process's allocation
  void* base = nullptr;
  size_t length = 0;
  uint64_t file_offset = 0;  // of the data in `file`
  std::shared_ptr<SharedFile> file;
};

void delete_shared_mapping(void* ctx) {
  auto* mapping = static_cast<SharedMapping*>(ctx);
  munmap(mapping->base, mapping->length);
  delete mapping;
}

// Files opened so far, by (device, inode) of the file.
std::shared_ptr<SharedFile> shared_file(int fd, const struct stat& st) {
  static std::mutex mutex;
  static auto* files = new std::map<std::pair<dev_t, ino_t>, std::weak_ptr<SharedFile>>();  // leaked, as Runtime
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*files)[{st.st_dev, st.st_ino}];
  if (auto file = slot.lock()) return file;
  const int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  TORCH_CHECK(own >= 0, "emugpu: could not duplicate the shared memory descriptor ", fd, ": ", std::strerror(errno),
              "; raise the open-files limit (ulimit -n)");
  auto file = std::make_shared<SharedFile>(own);
  slot = file;
  return file;
}

uint64_t page_size() {
  static const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return page;
}

void copy_stats(const StatArray& from, c10::CachingAllocator::StatArray& to) {
  for (size_t i = 0; i < from.size(); ++i) {
    to[i].current = from[i].current;
    to[i].peak = from[i].peak;
    to[i].allocated = from[i].allocated;
    to[i].freed = from[i].freed;
  }
}

}  // namespace

c10::DataPtr EmuDeviceAllocator::allocate(size_t nbytes) { return allocate_on(current_device(), nbytes); }

c10::DataPtr EmuDeviceAllocator::allocate_on(int device, size_t nbytes) {
  const c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  if (nbytes == 0) return {nullptr, nullptr, &delete_block, where};
  Block* block = translate_errors([&] { return Runtime::get().device(device).allocator().allocate(nbytes); });
  if (Runtime::get().compute_mode()) block->materialized = true;
  return {block->ptr, block, &delete_block, where};
}

c10::DeleterFnPtr EmuDeviceAllocator::raw_deleter() const { return &delete_block; }

void EmuDeviceAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  bytes_for_read(deferred_copies().find(src));
  bytes_for_write(deferred_copies().find(dest));
  std::memcpy(dest, src, count);
}

bool EmuDeviceAllocator::initialized() { return Runtime::get().configured(); }

void EmuDeviceAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  if (!Runtime::get().configured()) return;
  for (int i = 0; i < Runtime::get().device_count(); ++i) {
    Runtime::get().device(i).allocator().empty_cache();
  }
}

void EmuDeviceAllocator::recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) {
  // Blocks are handed out in timeline order; a freed block's reuse cannot
  // race with emulated work, so there is nothing to defer.
}

c10::CachingDeviceAllocator::DeviceStats EmuDeviceAllocator::getDeviceStats(c10::DeviceIndex device) {
  const AllocatorStats s = translate_errors([&] { return Runtime::get().device(device).allocator().stats(); });
  c10::CachingDeviceAllocator::DeviceStats out;
  copy_stats(s.allocation, out.allocation);
  copy_stats(s.segment, out.segment);
  copy_stats(s.active, out.active);
  copy_stats(s.inactive_split, out.inactive_split);
  copy_stats(s.allocated_bytes, out.allocated_bytes);
  copy_stats(s.reserved_bytes, out.reserved_bytes);
  copy_stats(s.active_bytes, out.active_bytes);
  copy_stats(s.inactive_split_bytes, out.inactive_split_bytes);
  copy_stats(s.requested_bytes, out.requested_bytes);
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  return out;
}

void EmuDeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  translate_errors([&] { Runtime::get().device(device).allocator().reset_accumulated_stats(); });
}

void EmuDeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  translate_errors([&] { Runtime::get().device(device).allocator().reset_peak_stats(); });
}

std::pair<size_t, size_t> EmuDeviceAllocator::getMemoryInfo(c10::DeviceIndex device) {
  return translate_errors([&] {
    Device& d = Runtime::get().device(device);
    const uint64_t total = d.gpu().memory_bytes;
    const uint64_t used = d.allocator().reserved() + kCudaContextBytes;
    return std::pair<size_t, size_t>(total > used ? total - used : 0, total);
  });
}

EmuDeviceAllocator& device_allocator() {
  static EmuDeviceAllocator allocator;
  return allocator;
}

// Registered at load time so that every emugpu storage comes from it.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &device_allocator());

Block* block_of(const c10::Storage& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get_deleter() == &delete_block) return static_cast<Block*>(data.get_context());
  if (data.get_deleter() == &delete_shared_mapping) return &static_cast<SharedMapping*>(data.get_context())->block;
  return nullptr;
}

bool is_materialized(const c10::Storage& storage) {
  const Block* block = block_of(storage);
  return block != nullptr && block->materialized;
}

void set_materialized(const c10::Storage& storage, bool value) {
  Block* block = block_of(storage);
  if (block == nullptr) return;
  // Placeholders now: copies deferred into it will never be needed, those reading it are done first.
  if (!value) bytes_discarded(block);
  block->materialized = value;
}

void resize_storage(const c10::Storage& storage, size_t nbytes) {
  if (nbytes == storage.nbytes()) return;
  TORCH_CHECK(storage.resizable(), "emugpu: trying to resize a storage that is not resizable");
  const int device = storage.device().index();
  c10::DataPtr fresh = device_allocator().allocate_on(device, nbytes);
  const size_t keep = std::min(nbytes, storage.nbytes());
  const bool real = is_materialized(storage);
  if (keep > 0 && real) bytes_for_read(block_of(storage));
  if (keep > 0 && real) std::memcpy(fresh.get(), storage.data(), keep);
  if (auto* block = static_cast<Block*>(fresh.get_context()); block != nullptr && real) block->materialized = true;
  storage.set_data_ptr_noswap(std::move(fresh));
  storage.set_nbytes(nbytes);
}

SharedStorage share_storage(const c10::Storage& storage) {
  TORCH_CHECK_VALUE(storage.device_type() == c10::DeviceType::PrivateUse1,
                    "emugpu sharing: expected an emugpu storage, got one on ", storage.device());
  Block* block = block_of(storage);
  TORCH_CHECK_VALUE(block != nullptr && storage.nbytes() > 0,
                    "emugpu sharing: expected a non-empty emugpu storage from the emugpu allocator, got ",
                    storage.nbytes(), " bytes", block == nullptr && storage.nbytes() > 0 ? " from elsewhere" : "");
  // Another process reads and writes these bytes directly: they must be real now and stay so.
  bytes_for_write(block);
  if (block->owner != nullptr) block->exported = true;
  SharedStorage out;
  out.device = storage.device().index();
  uint64_t data_file_offset = 0;
  const auto* data = static_cast<const char*>(storage.data());
  if (storage.data_ptr().get_deleter() == &delete_shared_mapping) {
    const auto* mapping = static_cast<const SharedMapping*>(storage.data_ptr().get_context());
    out.fd = mapping->file->fd;
    data_file_offset = mapping->file_offset;
  } else {
    const SharedRange range = translate_errors([&] { return block->owner->share_info(block); });
    out.fd = range.fd;
    data_file_offset = range.offset + static_cast<uint64_t>(data - block->ptr);
  }
  out.map_offset = data_file_offset / page_size() * page_size();
  out.data_offset = data_file_offset - out.map_offset;
  out.nbytes = storage.nbytes();
  out.map_length = (out.data_offset + out.nbytes + page_size() - 1) / page_size() * page_size();
  out.materialized = block->materialized;
  out.ready_ns =
      translate_errors([&] { return Runtime::get().device(out.device).stream_ready(current_stream_id(out.device)); });
  return out;
}

c10::Storage open_shared_storage(const SharedStorage& shared) {
  const int count = translate_errors([] { return Runtime::get().device_count(); });
  TORCH_CHECK_INDEX(
      shared.device >= 0 && shared.device < count, "emugpu sharing: the storage lives on emugpu:", shared.device,
      " of the sending process, but this process has ", count, " emulated device(s): expected an index below ", count,
      "; give it at least as many devices (EMUGPU_DEVICE_COUNT)");
  Device* device = translate_errors([&] { return &Runtime::get().device(shared.device); });
  TORCH_CHECK_VALUE(shared.nbytes > 0 && shared.map_offset % page_size() == 0 &&
                        shared.data_offset + shared.nbytes <= shared.map_length,
                    "emugpu sharing: expected a page-aligned map offset and data inside the mapping, got map offset ",
                    shared.map_offset, ", length ", shared.map_length, ", data at ", shared.data_offset, " for ",
                    shared.nbytes, " bytes");
  struct stat st {};
  TORCH_CHECK_VALUE(fstat(shared.fd, &st) == 0, "emugpu sharing: expected an open shared memory descriptor, got fd ",
                    shared.fd, " (", std::strerror(errno), ")");
  TORCH_CHECK_VALUE(static_cast<uint64_t>(st.st_size) >= shared.map_offset + shared.map_length,
                    "emugpu sharing: the shared memory file holds ", st.st_size, " bytes, expected at least ",
                    shared.map_offset + shared.map_length, "; the sender must keep the tensor alive while it is used");
  auto file = shared_file(shared.fd, st);
  void* base = mmap(nullptr, shared.map_length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, file->fd,
                    static_cast<off_t>(shared.map_offset));
  TORCH_CHECK(base != MAP_FAILED, "emugpu sharing: could not map ", shared.map_length,
              " bytes of shared memory: ", std::strerror(errno),
              "; raise the process's virtual memory limit (ulimit -v)");
  auto* mapping = new SharedMapping;
  mapping->base = base;
  mapping->length = shared.map_length;
  mapping->file_offset = shared.map_offset + shared.data_offset;
  mapping->file = std::move(file);
  mapping->block.ptr = static_cast<char*>(base) + shared.data_offset;
  mapping->block.size = shared.nbytes;
  mapping->block.allocated = true;
  mapping->block.materialized = shared.materialized;
  const c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(shared.device));
  c10::DataPtr data(mapping->block.ptr, mapping, &delete_shared_mapping, where);
  // As CUDA makes the receiver wait on an event the sender recorded.
  translate_errors([&] { device->stream_wait(current_stream_id(shared.device), shared.ready_ns); });
  // Not resizable: growing it would copy the bytes away from the other processes.
  return c10::Storage(c10::Storage::use_byte_size_t(), shared.nbytes, std::move(data), nullptr, false);
}

void refresh_shared_storage(const c10::Storage& storage, bool materialized, TimeNs ready_ns) {
  TORCH_CHECK_VALUE(storage.device_type() == c10::DeviceType::PrivateUse1,
                    "emugpu sharing: expected an emugpu storage, got one on ", storage.device());
  if (materialized) set_materialized(storage, true);
  const int device = storage.device().index();
  translate_errors([&] { Runtime::get().device(device).stream_wait(current_stream_id(device), ready_ns); });
}

}  // namespace emugpu
