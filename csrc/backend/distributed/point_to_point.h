// send, recv and their batches (batch_isend_irecv) for backend `emu`.
//
// Each is deferred like a collective that moves no bytes: the host goes on
// at once (so batch_isend_irecv's rings cannot deadlock), and the message
// ends on both ranks at the later of their starts plus its modelled time.
// A rank's k-th send to a peer pairs with that peer's k-th recv from it per
// tag, as NCCL's do: each side posts its start (and the sender its bytes,
// where the data rule lets them travel) on channels of that tag, and the
// group's runner resolves the message once the peer's words arrive.
// Behind held work (an earlier collective's end not known yet) the start is
// not known either: the post waits for it on a lane of its own.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "backend/distributed/group_collectives.h"

namespace emugpu {

class PointToPoint {
 public:
  // User tags per channel: each tag owns four channels below this times four.
  static constexpr int64_t kTags = int64_t{1} << 28;

  explicit PointToPoint(std::shared_ptr<GroupCollectives> group) : group_(std::move(group)) {}

  c10::intrusive_ptr<c10d::Work> send(const std::vector<at::Tensor>& tensors, int peer, int tag);
  c10::intrusive_ptr<c10d::Work> recv(const std::vector<at::Tensor>& tensors, int peer, int tag);
  // c10d's NCCL-style coalescing: NCCL runs a batch's sends and recvs as one
  // fused kernel, so here they overlap: the batch starts where the stream
  // was and ends at its latest message's end.
  void start_coalescing();
  c10::intrusive_ptr<c10d::Work> end_coalescing();

  struct Batch;

 private:
  c10::intrusive_ptr<c10d::Work> post_and_resolve(bool sends, const std::vector<at::Tensor>& tensors, int peer,
                                                  int tag);

  std::shared_ptr<GroupCollectives> group_;
  std::shared_ptr<Batch> batch_;                      // between start_coalescing and end_coalescing
  std::shared_ptr<OrderedRunner::Ticket> last_post_;  // the latest post deferred to the post lane
};

}  // namespace emugpu
