#include "backend/distributed/point_to_point.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "backend/allocator.h"
#include "backend/distributed/collective.h"
#include "backend/distributed/collectives.h"
#include "backend/gil.h"
#include "backend/ops/common.h"
#include "backend/runtime.h"

namespace emugpu {

namespace {

enum Channel : uint64_t { kToReceiver = 0, kToSender = 1, kBytes = 2 };
constexpr int kPostWords = 4;  // start (rank 0's clock), carries bytes, shape signature, bytes

uint64_t channel(int tag, Channel c) { return 4 * static_cast<uint64_t>(tag) + c; }

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); }

c10::intrusive_ptr<c10::ivalue::Future> device_future(int device) {
  return c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::ofTensors(),
      std::vector<c10::Device>{c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device))});
}

// Completes `future` with `outputs`, its events at `end`.
void complete(const c10::intrusive_ptr<c10::ivalue::Future>& future, const std::vector<at::Tensor>& outputs,
              TimeNs end) {
  EventTimeScope scope(std::make_shared<PendingTime>(end));
  future->markCompleted(c10::IValue(outputs));
}

// The Work of a send, recv or batch: done on the device at its end, which
// the runner learns when the peer's words arrive. wait() makes the caller's
// stream wait for it (the device holds the stream's later work until the
// end is known) and does not block the host. A send whose post waits on the
// post lane has not copied its bytes yet: `pending` runs the lane through
// it first, on the runner, which the host awaits before it touches them.
class MessageWork : public c10d::Work {
 public:
  MessageWork(std::shared_ptr<GroupCollectives> group, std::vector<at::Tensor> outputs, int device,
              std::function<void()> pending,
              std::pair<std::shared_ptr<OrderedRunner::Ticket>, std::shared_ptr<PendingTime>> resolved,
              c10::intrusive_ptr<c10::ivalue::Future> future)
      : group_(std::move(group)),
        outputs_(std::move(outputs)),
        device_(device),
        pending_(std::move(pending)),
        ticket_(std::move(resolved.first)),
        end_(std::move(resolved.second)),
        future_(std::move(future)) {}

  bool wait(std::chrono::milliseconds /*timeout*/) override {
    translate_errors([&] {
      if (pending_) {  // after the launches so far: a ring's recvs come first
        auto pending = std::move(pending_);
        pending_ = nullptr;
        auto ticket = ticket_;
        auto group = group_;
        auto resubmitted = group_->submit_timed(
            [pending, ticket, group]() -> int64_t {
              pending();
              return group->run_through(ticket);  // its end (done: it ran before this call)
            },
            storage_keys());
        ticket_ = resubmitted.first;
        end_ = resubmitted.second;
      }
      Runtime::get().device(device_).stream_wait(current_stream_id(device_), end_);
    });
    return true;
  }
  bool isCompleted() override {
    if (!ticket_->done()) return false;
    if (ticket_->error()) return true;
    return Runtime::get().device(device_).reached(end_->value());
  }
  bool isSuccess() const override { return !ticket_->done() || !ticket_->error(); }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<const void*> storage_keys() const {
    std::vector<const void*> keys;
    for (const auto& t : outputs_) {
      if (t.has_storage()) keys.push_back(t.storage().unsafeGetStorageImpl());
    }
    return keys;
  }

  std::shared_ptr<GroupCollectives> group_;
  std::vector<at::Tensor> outputs_;
  int device_;
  std::function<void()> pending_;
  std::shared_ptr<OrderedRunner::Ticket> ticket_;
  std::shared_ptr<PendingTime> end_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

struct PointToPoint::Batch {
  std::mutex mutex;
  int device = -1;
  std::optional<TimeNs> start;  // the earliest op's start on this rank's clock, once posted
  std::vector<at::Tensor> tensors;
  bool carries = false;                          // whether some send moves bytes
  std::shared_ptr<OrderedRunner::Ticket> posts;  // its last post deferred to the post lane
  std::vector<TimeNs> ends;                      // each message's end, as the runner learns it

  void started(TimeNs t) {
    std::lock_guard<std::mutex> lock(mutex);
    start = start ? std::min(*start, t) : t;
  }
};

c10::intrusive_ptr<c10d::Work> PointToPoint::send(const std::vector<at::Tensor>& tensors, int peer, int tag) {
  return post_and_resolve(true, tensors, peer, tag);
}

c10::intrusive_ptr<c10d::Work> PointToPoint::recv(const std::vector<at::Tensor>& tensors, int peer, int tag) {
  return post_and_resolve(false, tensors, peer, tag);
}

c10::intrusive_ptr<c10d::Work> PointToPoint::post_and_resolve(bool sends, const std::vector<at::Tensor>& tensors,
                                                              int peer, int tag) {
  const GroupSpec& spec = group_->spec();
  const char* kind = sends ? "send" : "recv";
  TORCH_CHECK_VALUE(peer >= 0 && peer < spec.size && peer != spec.rank, "emu backend: ", kind,
                    " expected a peer rank in [0, ", spec.size, ") other than ", spec.rank, ", got ", peer);
  TORCH_CHECK_VALUE(tag >= 0 && tag < kTags, "emu backend: ", kind, " expected a tag in [0, ", kTags, "), got ", tag);
  const int dev = checked_device(kind, tensors);
  return translate_errors([&]() -> c10::intrusive_ptr<c10d::Work> {
    const bool compute = Runtime::get().compute_mode();
    int64_t total = 0;
    bool real = true;
    for (const auto& t : tensors) {
      total += nbytes(t);
      real = real && tensor_materialized(t);
    }
    const auto shape = static_cast<int64_t>(collective_signature("p2p", "", tensors));
    const bool carries = sends && (compute || (total <= spec.data_threshold && real));
    const std::string what = std::string(kind) + (sends ? " to rank " : " from rank ") + std::to_string(peer);
    // The backend's own stream, after the caller's, as NCCL's.
    auto& device = Runtime::get().device(dev);
    const int64_t comm = group_->comm_stream(dev);
    device.stream_wait(comm, device.record_pending(current_stream_id(dev), !in_backward()));

    auto future = device_future(dev);
    auto batch = batch_;
    if (batch) {
      std::lock_guard<std::mutex> lock(batch->mutex);
      TORCH_CHECK_VALUE(batch->device < 0 || batch->device == dev,
                        "emu backend: a batch of sends and recvs "
                        "expected one device, got emugpu:",
                        batch->device, " and emugpu:", dev);
      batch->device = dev;
      batch->tensors.insert(batch->tensors.end(), tensors.begin(), tensors.end());
      batch->carries = batch->carries || carries;
    }
    std::vector<at::Tensor> hosts;
    for (const auto& t : tensors) hosts.push_back(host_alias(t));
    auto posted_start = std::make_shared<std::atomic<TimeNs>>(0);
    std::weak_ptr<GroupCollectives> weak = group_;
    const Channel mine = sends ? kToReceiver : kToSender;
    const Channel back = sends ? kToSender : kToReceiver;
    auto post = [weak, posted_start, peer, tag, mine, carries, shape, total, hosts, batch](TimeNs start) {
      const auto group = weak.lock();
      TORCH_CHECK(group != nullptr, "emu backend: a send or recv was posted after its process group was destroyed");
      posted_start->store(start);
      const int64_t words[kPostWords] = {start, carries ? 1 : 0, shape, total};
      group->bulk().send(peer, channel(tag, mine), words, sizeof(words));
      if (carries) {  // copied now: the host may change the tensors once the post ran
        for (const auto& h : hosts) group->bulk().send(peer, channel(tag, kBytes), h.data_ptr(), nbytes(h));
        group->add_payload_bytes_moved(static_cast<uint64_t>(total));
      }
      if (batch) batch->started(start + group->spec().clock_offset);
    };
    std::shared_ptr<OrderedRunner::Ticket> ticket;
    if (device.held() || (last_post_ && !last_post_->done())) {
      ticket = last_post_ = group_->defer_post(dev, comm, post);
      if (batch) {
        std::lock_guard<std::mutex> lock(batch->mutex);
        batch->posts = ticket;
      }
    } else {
      post(without_gil([&] { return device.collective_start(comm); }) - spec.clock_offset);
    }

    auto resolve = [weak, ticket, posted_start, peer, tag, back, sends, kind, tensors, hosts, compute, shape, total,
                    dev, comm, batch, future, what]() -> int64_t {
      try {
        const auto group = weak.lock();
        TORCH_CHECK(group != nullptr, "emu backend: ", what, " was resolved after its process group was destroyed");
        const GroupSpec& spec = group->spec();
        if (ticket) group->run_through_post(ticket);
        Bytes message;
        try {
          message = group->bulk().recv(peer, channel(tag, back), spec.timeout);
        } catch (const Error& e) {
          C10_THROW_ERROR(DistBackendError, "emu backend: rank " + std::to_string(spec.rank) + " of " +
                                                std::to_string(spec.size) + ": " + what +
                                                " failed: another rank exited or did not arrive within the process "
                                                "group's timeout. Check the other ranks' output for their error. "
                                                "Transport said: " +
                                                e.what());
        }
        TORCH_CHECK(message.size() == sizeof(int64_t) * kPostWords, "emu backend: ", what, " expected ", kPostWords,
                    " words from rank ", peer, ", got ", message.size(), " bytes");
        int64_t theirs[kPostWords];
        std::memcpy(theirs, message.data(), sizeof(theirs));
        TORCH_CHECK_VALUE(theirs[2] == shape, "emu backend: rank ", spec.rank, " ", kind, "s [",
                          describe_tensors(tensors), "] but rank ", peer, " ", sends ? "receives" : "sends", " ",
                          theirs[3], " bytes of another shape or dtype; the two must match");
        if (!sends) {
          const bool arrived = theirs[1] != 0;
          if (arrived) {
            for (const auto& h : hosts) {
              const Bytes bytes = group->bulk().recv(peer, channel(tag, kBytes), spec.timeout);
              TORCH_CHECK_VALUE(static_cast<int64_t>(bytes.size()) == nbytes(h), "emu backend: ", what, " expected ",
                                nbytes(h), " bytes, got ", bytes.size(),
                                "; the send and the recv must have the same size");
              if (!bytes.empty()) std::memcpy(h.data_ptr(), bytes.data(), bytes.size());
            }
          }
          if (!compute) {
            for (const auto& t : tensors) set_materialized(t.storage(), arrived);
          }
        }
        const TimeNs duration = collective_duration(dev, "send_recv", static_cast<double>(std::max(total, theirs[3])),
                                                    spec.size, spec.ranks_per_node);
        const TimeNs begins = std::max(posted_start->load(), theirs[0]) + spec.clock_offset;
        TimeNs end = begins + duration;
        if (batch) {  // placed with its batch (end_coalescing)
          std::lock_guard<std::mutex> lock(batch->mutex);
          batch->ends.push_back(end);
        } else {
          end = Runtime::get().device(dev).collective_launch(comm, begins, duration);
        }
        complete(future, tensors, end);
        return end;
      } catch (...) {
        future->setErrorIfNeeded(std::current_exception());
        throw;
      }
    };
    // A recv's bytes arrive on the runner: the host awaits them before it touches the tensors.
    std::vector<const void*> touches;
    if (!sends) {
      for (const auto& t : tensors) {
        if (t.has_storage()) touches.push_back(t.storage().unsafeGetStorageImpl());
      }
    }
    auto resolved = group_->submit_timed(resolve, std::move(touches));
    std::function<void()> pending;
    if (carries && ticket) {
      auto group = group_;
      pending = [group, ticket] { group->run_through_post(ticket); };
    }
    return c10::make_intrusive<MessageWork>(group_, tensors, dev, std::move(pending), std::move(resolved), future);
  });
}

void PointToPoint::start_coalescing() {
  // A batch still open was abandoned by an error inside c10d's coalescing manager: its ops stand alone.
  batch_ = std::make_shared<Batch>();
}

c10::intrusive_ptr<c10d::Work> PointToPoint::end_coalescing() {
  auto batch = std::move(batch_);
  batch_ = nullptr;
  TORCH_CHECK_VALUE(batch != nullptr,
                    "emu backend: end_coalescing expected a batch started by start_coalescing, "
                    "got none");
  return translate_errors([&]() -> c10::intrusive_ptr<c10d::Work> {
    const int dev = batch->device >= 0 ? batch->device : current_device();
    auto& device = Runtime::get().device(dev);
    const int64_t comm = group_->comm_stream(dev);
    if (batch->device < 0) {  // collectives only: placed already, or earlier in the runner's order
      device.stream_wait(comm, device.record_pending(current_stream_id(dev), !in_backward()));
    }
    auto future = device_future(dev);
    auto resolve = [batch, dev, comm, future]() -> int64_t {
      try {
        std::vector<TimeNs> ends;
        std::optional<TimeNs> start;
        std::vector<at::Tensor> tensors;
        {
          std::lock_guard<std::mutex> lock(batch->mutex);
          ends = batch->ends;
          start = batch->start;
          tensors = batch->tensors;
        }
        auto& device = Runtime::get().device(dev);
        TimeNs end = 0;
        if (!ends.empty()) {
          TORCH_CHECK(start.has_value(),
                      "emu backend: a batch of sends and recvs ended before any of them was "
                      "posted; please report this");  // every op's post runs before its resolve
          const TimeNs last = *std::max_element(ends.begin(), ends.end());
          end = device.collective_launch(comm, *start, last - *start);
        } else {
          end = device.collective_start_at(comm, device.clock().now());  // where the stream is, past what it holds
        }
        complete(future, tensors, end);
        return end;
      } catch (...) {
        future->setErrorIfNeeded(std::current_exception());
        throw;
      }
    };
    std::function<void()> pending;
    if (batch->carries && batch->posts) {
      auto group = group_;
      auto posts = batch->posts;
      pending = [group, posts] { group->run_through_post(posts); };
    }
    return c10::make_intrusive<MessageWork>(group_, batch->tensors, dev, std::move(pending),
                                            group_->submit_timed(resolve, {}), future);
  });
}

}  // namespace emugpu
