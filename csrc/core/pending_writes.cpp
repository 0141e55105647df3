#include "pending_writes.h"

#include <algorithm>
#include <utility>

namespace emugpu {
namespace {
constexpr uint64_t kNoHorizon = UINT64_MAX;
thread_local uint64_t horizon = kNoHorizon;
}  // namespace

PendingWrites::Horizon::Horizon(uint64_t watermark) : outer_(horizon) { horizon = watermark; }
PendingWrites::Horizon::~Horizon() { horizon = outer_; }

uint64_t PendingWrites::watermark() const {
  std::lock_guard lock(mutex_);
  return next_id_;
}

std::shared_ptr<OrderedRunner::Ticket> PendingWrites::submit(const std::shared_ptr<OrderedRunner>& runner,
                                                             std::vector<const void*> keys, OrderedRunner::Call call) {
  // Registered under the lock that the call's removal takes, so the call
  // cannot end (and remove its entry) before the entry exists.
  std::lock_guard lock(mutex_);
  const uint64_t id = next_id_++;
  auto ticket = runner->submit([this, id, call = std::move(call)]() -> int64_t {
    // Goes whether the call returns or throws; its writes happen before
    // the removal, so a host that no longer finds the entry sees them.
    struct Release {
      PendingWrites* writes;
      uint64_t id;
      ~Release() { writes->remove(id); }
    } release{this, id};
    return call();
  });
  entries_.push_back({id, std::move(keys), runner, ticket});
  count_.store(entries_.size(), std::memory_order_release);
  return ticket;
}

void PendingWrites::remove(uint64_t id) {
  std::lock_guard lock(mutex_);
  std::erase_if(entries_, [&](const Entry& e) { return e.id == id; });
  count_.store(entries_.size(), std::memory_order_release);
}

void PendingWrites::await(const void* key) {
  // A deferred call that touches the memory itself: the calls registered
  // on it came later and run after it.
  const uint64_t limit = OrderedRunner::in_call() ? horizon : kNoHorizon;
  if (OrderedRunner::in_call() && limit == kNoHorizon) return;
  std::vector<std::pair<std::shared_ptr<OrderedRunner>, std::shared_ptr<OrderedRunner::Ticket>>> touching;
  {
    std::lock_guard lock(mutex_);
    // A call its runner dropped (the group destroyed first) never removes its entry.
    std::erase_if(entries_, [](const Entry& e) { return e.ticket->done(); });
    count_.store(entries_.size(), std::memory_order_release);
    for (const auto& e : entries_) {
      if (e.id < limit && std::find(e.keys.begin(), e.keys.end(), key) != e.keys.end()) {
        touching.emplace_back(e.runner, e.ticket);
      }
    }
  }
  // Not under the lock: the calls remove their entries as they end.
  for (auto& [runner, ticket] : touching) runner->run_through(ticket);
}

}  // namespace emugpu
