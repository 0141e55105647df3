#include "deferred_copies.h"

#include <utility>

#include "error.h"

namespace emugpu {

bool DeferredCopies::record(Block* dst, Block* src, Copy copy, bool whole, size_t max_pending) {
  EMUGPU_CHECK(dst != nullptr && src != nullptr && dst != src, kRuntime,
               "deferred copy: expected two different blocks, got ", static_cast<const void*>(dst), " and ",
               static_cast<const void*>(src), "; copies within one block are done at once");
  std::lock_guard lock(mutex_);
  resolve_readers_locked(dst);
  if (whole) drop_into_locked(dst);
  auto it = nodes_.find(dst);
  if (it != nodes_.end() && it->second.into.size() >= max_pending) return false;
  Node& into = nodes_[dst];
  Node& from = nodes_[src];
  into.into.push_back({src, std::move(copy)});
  from.readers.insert(dst);
  dst->deferred.store(true, std::memory_order_release);
  src->deferred.store(true, std::memory_order_release);
  stats_.recorded += 1;
  stats_.pending += 1;
  return true;
}

void DeferredCopies::resolve(Block* b) {
  if (!involved(b)) return;
  std::lock_guard lock(mutex_);
  resolve_locked(b);
}

void DeferredCopies::before_write(Block* b) {
  if (!involved(b)) return;
  std::lock_guard lock(mutex_);
  resolve_readers_locked(b);
  resolve_locked(b);
}

void DeferredCopies::discard(Block* b) {
  if (!involved(b)) return;
  std::lock_guard lock(mutex_);
  resolve_readers_locked(b);
  drop_into_locked(b);
}

Block* DeferredCopies::find(const void* p) const {
  const auto* byte = static_cast<const char*>(p);
  std::lock_guard lock(mutex_);
  for (const auto& [block, node] : nodes_) {
    if (byte >= block->ptr && byte < block->ptr + block->size) return block;
  }
  return nullptr;
}

void DeferredCopies::resolve_locked(Block* b) {
  auto it = nodes_.find(b);
  if (it == nodes_.end() || it->second.into.empty()) return;
  std::vector<Pending> work = std::move(it->second.into);
  it->second.into.clear();
  size_t i = 0;
  try {
    for (; i < work.size(); ++i) {
      // The source's own pending copies first: its bytes as they were when this copy was launched.
      resolve_locked(work[i].src);
      work[i].copy();
      stats_.done += 1;
      stats_.pending -= 1;
      unlink_locked(b, work, i);
    }
  } catch (...) {
    // The copies not done are dropped: the bytes of `b` are what they are, and no source keeps a dangling reader.
    for (; i < work.size(); ++i) {
      stats_.dropped += 1;
      stats_.pending -= 1;
      unlink_locked(b, work, i);
    }
    tidy_locked(b);
    throw;
  }
  tidy_locked(b);
}

void DeferredCopies::unlink_locked(Block* b, const std::vector<Pending>& copies, size_t i) {
  // A block may read one source several times (pieces of a buffer): it stays a reader until the last.
  for (size_t j = i + 1; j < copies.size(); ++j) {
    if (copies[j].src == copies[i].src) return;
  }
  auto src = nodes_.find(copies[i].src);
  if (src == nodes_.end()) return;
  src->second.readers.erase(b);
  tidy_locked(copies[i].src);
}

void DeferredCopies::resolve_readers_locked(Block* b) {
  auto it = nodes_.find(b);
  if (it == nodes_.end()) return;
  // Resolving a reader erases it from this set: iterate over a copy.
  const std::vector<Block*> readers(it->second.readers.begin(), it->second.readers.end());
  for (Block* r : readers) resolve_locked(r);
}

void DeferredCopies::drop_into_locked(Block* b) {
  auto it = nodes_.find(b);
  if (it == nodes_.end()) return;
  std::vector<Pending> dropped = std::move(it->second.into);
  it->second.into.clear();
  for (size_t i = 0; i < dropped.size(); ++i) {
    stats_.dropped += 1;
    stats_.pending -= 1;
    unlink_locked(b, dropped, i);
  }
  tidy_locked(b);
}

void DeferredCopies::tidy_locked(Block* b) {
  auto it = nodes_.find(b);
  if (it == nodes_.end() || !it->second.into.empty() || !it->second.readers.empty()) return;
  nodes_.erase(it);
  b->deferred.store(false, std::memory_order_release);
}

DeferredCopyStats DeferredCopies::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void DeferredCopies::reset_stats() {
  std::lock_guard lock(mutex_);
  stats_ = DeferredCopyStats{0, 0, 0, stats_.pending};
}

}  // namespace emugpu
