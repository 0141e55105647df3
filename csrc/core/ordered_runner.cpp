#include "ordered_runner.h"

#include "error.h"

#include <cxxabi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

namespace emugpu {

namespace {
thread_local bool running_a_call = false;
}  // namespace

bool OrderedRunner::in_call() { return running_a_call; }

struct OrderedRunner::State {
  std::mutex queue_mutex;
  std::condition_variable submitted;
  std::deque<std::pair<Call, std::shared_ptr<Ticket>>> pending;
  std::shared_ptr<Ticket> last;
  bool stopping = false;
  std::mutex running;                // held while one call runs: calls never overlap
  std::condition_variable finished;  // (with queue_mutex) after each call

  // Runs the oldest pending call, if any; the caller holds `running`.
  void step() {
    std::pair<Call, std::shared_ptr<Ticket>> next;
    {
      std::lock_guard lock(queue_mutex);
      if (pending.empty()) return;
      next = std::move(pending.front());
      pending.pop_front();
    }
    Ticket& t = *next.second;
    struct InCall {
      bool outer = running_a_call;
      InCall() { running_a_call = true; }
      ~InCall() { running_a_call = outer; }
    } in_call;
    try {
      t.value_ = next.first();
    } catch (const abi::__forced_unwind&) {
      throw;  // thread cancellation (Python ends threads that want the GIL while it finalizes)
    } catch (...) {
      t.error_ = std::current_exception();
    }
    next.first = nullptr;  // what the call holds goes before waiters see it done
    {
      std::lock_guard lock(queue_mutex);
      t.done_.store(true, std::memory_order_release);
    }
    finished.notify_all();
  }

  void loop() {
    for (;;) {
      {
        std::unique_lock lock(queue_mutex);
        submitted.wait(lock, [&] { return stopping || !pending.empty(); });
        if (stopping) return;
      }
      std::lock_guard run(running);
      step();
    }
  }
};

OrderedRunner::OrderedRunner() : state_(std::make_shared<State>()) {
  std::thread([state = state_] { state->loop(); }).detach();
}

OrderedRunner::~OrderedRunner() {
  std::deque<std::pair<Call, std::shared_ptr<Ticket>>> dropped;
  {
    std::lock_guard lock(state_->queue_mutex);
    state_->stopping = true;
    dropped.swap(state_->pending);
  }
  state_->submitted.notify_all();
  for (auto& [call, ticket] : dropped) {
    call = nullptr;
    ticket->error_ = std::make_exception_ptr(
        Error(ErrorKind::kRuntime, "emugpu: a deferred call was dropped: its process group was destroyed first"));
    ticket->done_.store(true, std::memory_order_release);
  }
}

std::shared_ptr<OrderedRunner::Ticket> OrderedRunner::submit(Call call) {
  auto ticket = std::make_shared<Ticket>();
  {
    std::lock_guard lock(state_->queue_mutex);
    state_->pending.emplace_back(std::move(call), ticket);
    state_->last = ticket;
  }
  state_->submitted.notify_one();
  return ticket;
}

int64_t OrderedRunner::run_through(const std::shared_ptr<Ticket>& ticket) {
  while (!ticket->done()) {
    std::unique_lock run(state_->running, std::try_to_lock);
    if (run.owns_lock()) {
      if (!ticket->done()) state_->step();
      continue;
    }
    // Another thread runs a call: never block on it, which may itself wait
    // for this thread (a post that a resolve waits for, on another runner).
    std::unique_lock lock(state_->queue_mutex);
    state_->finished.wait_for(lock, std::chrono::milliseconds(1), [&] { return ticket->done(); });
  }
  if (ticket->error_) std::rethrow_exception(ticket->error_);
  return ticket->value_;
}

void OrderedRunner::drain() {
  std::shared_ptr<Ticket> last;
  {
    std::lock_guard lock(state_->queue_mutex);
    last = state_->last;
  }
  if (last) run_through(last);
}

}  // namespace emugpu
