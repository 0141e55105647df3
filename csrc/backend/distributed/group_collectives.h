// The hot path of backend `emu` (torch_emugpu/distributed/_backend.py) in
// C++: all_reduce and every collective whose bytes stay put launch here
// without Python, on either transport, as does the placing of deferred
// collectives. Python keeps the rest (the bytes of the other collectives,
// send/recv, error reports) and submits its own deferred work to the same
// OrderedRunner, so every rank places a stream's collectives in launch order.
//
// Ranks all-gather the words of core/exchange/words.h per collective.
// Every collective launched here is deferred: launch returns at once, and
// the group's runner gathers its words (once its start is known: the
// caller's stream may be held behind an earlier collective) and places it
// when the other ranks' words arrive. An all_reduce whose bytes are real
// (compute mode, or small tensors of real bytes on every rank) also
// exchanges and reduces them there, into the tensors' storages; until it
// has, the host waits for it wherever it touches them (pending_writes(),
// backend/distributed/collective.h), as stream order makes a GPU's later work wait.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/exchange/tcp_transport.h"
#include "core/exchange/transport.h"
#include "core/exchange/words.h"
#include "core/ordered_runner.h"
#include "core/pending_time.h"

namespace emugpu {

struct GroupSpec {
  int rank = 0;
  int size = 1;
  int ranks_per_node = 1;
  TimeNs clock_offset = 0;  // this rank's steady clock minus rank 0's
  std::chrono::nanoseconds timeout{};
  int64_t data_threshold = 0;  // bytes per tensor up to which timing mode moves real bytes
};

// Bytes as they travel between ranks: what each rank sent this one.
using Rows = std::vector<Bytes>;

// One collective of any family (collectives.h builds them): what it reads
// and writes, how its bytes travel where the data rule moves them, and how
// this rank's result comes from what the ranks sent.
struct CollectiveCall {
  std::string name;        // the user-facing name, in errors and the signature
  std::string model_kind;  // core/collective_cost.h's kind
  std::string extra;       // op and root: part of the signature
  double model_bytes = 0;
  std::vector<at::Tensor> inputs;    // whose bytes this rank contributes
  std::vector<at::Tensor> received;  // whose bytes this rank writes
  std::vector<at::Tensor> outputs;   // the Work's result
  std::vector<at::Tensor> signed_;   // must match across ranks
  int device = 0;
  bool blocks_host = false;  // barrier: the host waits for its end
  // Where bytes move: every rank's pack()[0] goes to every rank (all-gather
  // style), or, per_destination, pack()[r] goes to rank r. `payload`: this
  // rank's bytes on the wire (per_destination: framed). Both run on the
  // group's runner, after the collectives launched before.
  bool per_destination = false;
  int64_t payload = 0;
  std::function<Rows()> pack;
  std::function<void(Rows&)> combine;
};

// Sizes and dtypes of tensors, for what must not hold the tensors: a
// deferred collective that only times them would keep their memory
// allocated until it is placed, so peak memory would follow the host's pace.
struct TensorShape {
  std::vector<int64_t> sizes;
  c10::ScalarType dtype;
};
using TensorShapes = std::vector<TensorShape>;
TensorShapes shapes_of(const std::vector<at::Tensor>& tensors);
// "(4,) float32, (2, 3) int64", as Python prints shapes and dtypes; "no tensors".
std::string describe_tensors(const TensorShapes& shapes);
std::string describe_tensors(const std::vector<at::Tensor>& tensors);

class GroupCollectives;

// A collective launched here. wait() makes the caller's current stream wait
// for its end (as WorkNCCL's does) and returns: for a deferred one whose end
// is not known yet, the device holds the stream's later work until it is
// (core/device.h). The future's value is the output tensors; it completes at
// launch, as NCCL's does, with events at the collective's end.
class EmuWork : public c10d::Work {
 public:
  EmuWork(std::vector<at::Tensor> outputs, int device, c10::intrusive_ptr<c10::ivalue::Future> future,
          std::shared_ptr<PendingTime> end, std::shared_ptr<OrderedRunner::Ticket> ticket, bool blocks_host = false);

  bool wait(std::chrono::milliseconds timeout) override;
  bool isCompleted() override;
  bool isSuccess() const override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  // When the collective ends on the emulated device (waits until known).
  TimeNs end();

 private:
  std::vector<at::Tensor> outputs_;
  int device_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<PendingTime> end_;
  std::shared_ptr<OrderedRunner::Ticket> ticket_;  // a deferred one's runner call
  bool blocks_host_;  // barrier: wait() blocks the host until the end, as ProcessGroupNCCL's does
};

class GroupCollectives : public std::enable_shared_from_this<GroupCollectives> {
 public:
  // `words` carries the word gathers and the byte gathers it has room for
  // (shared memory where every rank is on this machine, else `bulk`);
  // `bulk` (TCP) carries the larger ones.
  // `reports`: where ranks that disagree on a collective post their calls
  // (a side channel that works while gathers are in flight).
  GroupCollectives(GroupSpec spec, std::shared_ptr<Transport> words, std::shared_ptr<TcpTransport> bulk,
                   c10::intrusive_ptr<c10d::Store> reports);

  // Launches a collective of any family (see CollectiveCall): deferred to
  // the runner (the host goes on) unless it blocks the host (barrier).
  c10::intrusive_ptr<c10d::Work> run(CollectiveCall call);
  const GroupSpec& spec() const { return spec_; }

  // The backend's own stream of `device` (a pool stream, taken once).
  int64_t comm_stream(int device);
  // all_reduce (or its coalesced form).
  c10::intrusive_ptr<c10d::Work> all_reduce(const std::string& name, const std::vector<at::Tensor>& tensors,
                                            c10d::ReduceOp::RedOpType op);
  // A deferred collective (see the file comment) of any kind whose
  // arguments Python checked and whose bytes stay put.
  c10::intrusive_ptr<c10d::Work> defer(const std::string& name, const std::string& model_kind, double model_bytes,
                                       int64_t largest, int64_t payload, bool real,
                                       const std::vector<at::Tensor>& received, const std::vector<at::Tensor>& outputs,
                                       const std::vector<at::Tensor>& signed_, const std::string& extra, int device);

  // A deferred collective whose exchange and placement `place` does on the
  // runner: given this rank's start (rank 0's clock), it gathers the ranks'
  // words, checks them and places the collective, returning its end. The
  // Work and its future behave as defer()'s (which uses it).
  // `touches`: the storages (StorageImpl) whose bytes `place` reads or
  // writes; the host awaits it before it touches them (pending_writes()).
  c10::intrusive_ptr<c10d::Work> defer_call(int device, const std::vector<at::Tensor>& outputs,
                                            std::function<TimeNs(TimeNs)> place, std::vector<const void*> touches = {});

  // Python's deferred work (a send/recv), in this group's launch order; its
  // value is a device time (its end), also returned as a PendingTime known
  // once the call ran (forcing it runs the runner through the call).
  // `touches`: storages the call writes (pending_writes()).
  std::pair<std::shared_ptr<OrderedRunner::Ticket>, std::shared_ptr<PendingTime>> submit_timed(
      OrderedRunner::Call call, std::vector<const void*> touches);
  int64_t run_through(const std::shared_ptr<OrderedRunner::Ticket>& t) { return runner_->run_through(t); }

  // A send/recv launched on the current stream while it is held (core/
  // device.h): its start is known only once the held work before it is
  // placed, so `post(start)` (rank 0's clock) runs then, in launch order on
  // a runner of its own, and the host goes on. Posts never wait behind the
  // runner's calls that wait for the peers' posts (a ring of
  // batch_isend_irecv would deadlock).
  std::shared_ptr<OrderedRunner::Ticket> defer_post(int device, int64_t stream, std::function<void(TimeNs)> post);
  int64_t run_through_post(const std::shared_ptr<OrderedRunner::Ticket>& t) { return poster_->run_through(t); }
  void drain() {
    poster_->drain();
    runner_->drain();
  }

  TcpTransport& bulk() { return *bulk_; }
  // "shm" or "tcp": the transport of the word gathers.
  const char* transport() const { return words_->kind(); }
  uint64_t payload_bytes_moved() const { return payload_moved_.load(); }
  void add_payload_bytes_moved(uint64_t n) { payload_moved_.fetch_add(n); }

 private:
  uint64_t gather_words(const CollectiveWords& mine);
  GatheredWords finish(uint64_t ticket, const std::string& name);
  // Exchanges the ranks' bytes of `hosts` (`payload` in all) and reduces
  // them into `hosts`: an all-gather where shared memory holds them whole;
  // else a reduce-scatter and an all-gather, in shared-memory rounds on one
  // machine and over TCP across machines (each rank moves its bytes twice,
  // not once per rank).
  void reduce_bytes(const std::string& name, const std::vector<at::Tensor>& hosts, c10d::ReduceOp::RedOpType op,
                    int64_t payload);
  void reduce_bytes_in_rounds(const std::string& name, const std::vector<at::Tensor>& hosts,
                              c10d::ReduceOp::RedOpType op);
  // What each rank sent this one (CollectiveCall's rule); `longest`: the
  // longest payload over ranks, the same on every rank, picks the transport.
  Rows move_bytes(const CollectiveCall& call, int64_t longest);
  // Gathers the words from this rank's `start` (rank 0's clock), checks
  // them, moves the bytes where the data rule says so and places the
  // collective on `comm`; returns its end.
  TimeNs exchange_and_place(CollectiveCall& call, int64_t comm, bool compute, int64_t largest, uint64_t signature,
                            TimeNs start);
  // The error message of a collective the ranks disagree on, after posting
  // this rank's call (`described`: its tensors) under `key` and reading `other`'s.
  std::string mismatch_message(const std::string& key, const std::string& name, const std::string& extra,
                               const std::string& described, int other) const;
  // Throws the ranks' disagreement (ValueError) if any signature differs.
  // `signed_`: the tensors or their shapes, described only on a mismatch.
  template <typename Signed>
  void check_signatures(const GatheredWords& words, uint64_t signature, uint64_t ticket, const std::string& name,
                        const std::string& extra, const Signed& signed_) const {
    const int other = words.first_disagreeing(signature);
    if (other >= 0) {
      TORCH_CHECK_VALUE(
          false, mismatch_message("mismatch/" + std::to_string(ticket), name, extra, describe_tensors(signed_), other));
    }
  }
  TimeNs place(int device, int64_t comm, const GatheredWords& words, const std::string& model_kind);
  // A future completed now, its events at `end`.
  c10::intrusive_ptr<c10::ivalue::Future> completed_future(int device, const std::vector<at::Tensor>& outputs,
                                                           std::shared_ptr<PendingTime> end) const;

  const GroupSpec spec_;
  std::shared_ptr<Transport> words_;
  std::shared_ptr<TcpTransport> bulk_;
  c10::intrusive_ptr<c10d::Store> reports_;
  std::shared_ptr<OrderedRunner> runner_;
  std::shared_ptr<OrderedRunner> poster_;        // defer_post
  std::array<std::atomic<int64_t>, 64> comm_{};  // 0: not taken yet
  std::atomic<uint64_t> payload_moved_{0};
};

// Identifies a collective's name, extra (op, root) and tensor shapes and
// dtypes: the same on every rank that calls the same collective.
uint64_t collective_signature(const std::string& name, const std::string& extra,
                              const std::vector<at::Tensor>& tensors);
// acc (op)= part, elementwise, in place.
void reduce_into(at::Tensor& acc, const at::Tensor& part, c10d::ReduceOp::RedOpType op);
// "SUM", "AVG", ... as c10d's ReduceOp names them.
const char* op_name(c10d::ReduceOp::RedOpType op);
// Python's name of a dtype ("torch.float32"), as errors print it.
std::string dtype_name(c10::ScalarType type);

}  // namespace emugpu
