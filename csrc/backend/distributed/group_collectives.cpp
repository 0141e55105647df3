#include "backend/distributed/group_collectives.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>

#include "backend/allocator.h"
#include "backend/distributed/collective.h"
#include "backend/gil.h"
#include "backend/ops/common.h"
#include "backend/runtime.h"

namespace emugpu {

namespace {

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); }

// The address of element `i` of a contiguous host tensor.
uint8_t* element_at(const at::Tensor& t, int64_t i) {
  return static_cast<uint8_t*>(t.data_ptr()) + i * t.element_size();
}

// A launch's start on `stream` (rank 0's clock), learnt off the host's
// thread (the runner, the post lane): once `placed`, a pending point taken at
// the launch, is known, the held work before the launch is on the timeline.
// That work waits only for earlier collectives: no cycle.
struct LaterStart {
  std::shared_ptr<PendingTime> placed;
  int device;
  int64_t stream;
  TimeNs launched;  // host time of the launch
  TimeNs offset;    // this rank's clock minus rank 0's
  TimeNs operator()() const {
    placed->force();
    return Runtime::get().device(device).collective_start_at(stream, launched) - offset;
  }
};

c10::intrusive_ptr<c10::ivalue::Future> device_future(int device) {
  return c10::make_intrusive<c10::ivalue::Future>(
      c10::ListType::ofTensors(),
      std::vector<c10::Device>{c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device))});
}

// Whether the Python path must take this all_reduce to report an error of
// its own (it says what was expected and what was found).
bool all_reduce_args_ok(const std::vector<at::Tensor>& tensors, c10d::ReduceOp::RedOpType op) {
  if (tensors.empty() || op > c10d::ReduceOp::BXOR) return false;
  const auto device = tensors[0].device();
  for (const auto& t : tensors) {
    if (t.device().type() != c10::DeviceType::PrivateUse1 || t.device() != device) return false;
    if (t.layout() != c10::kStrided || !t.is_contiguous()) return false;
    const bool floating = at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type());
    const bool bitwise = op == c10d::ReduceOp::BAND || op == c10d::ReduceOp::BOR || op == c10d::ReduceOp::BXOR;
    if (bitwise && floating) return false;
    if (op == c10d::ReduceOp::AVG && !floating) return false;
  }
  return true;
}

}  // namespace

void reduce_into(at::Tensor& acc, const at::Tensor& part, c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG: at::add_out(acc, acc, part); break;
    case c10d::ReduceOp::PRODUCT: at::mul_out(acc, acc, part); break;
    case c10d::ReduceOp::MIN: at::minimum_out(acc, acc, part); break;
    case c10d::ReduceOp::MAX: at::maximum_out(acc, acc, part); break;
    case c10d::ReduceOp::BAND: at::bitwise_and_out(acc, acc, part); break;
    case c10d::ReduceOp::BOR: at::bitwise_or_out(acc, acc, part); break;
    case c10d::ReduceOp::BXOR: at::bitwise_xor_out(acc, acc, part); break;
    default: TORCH_CHECK(false, "emu backend: reduce op ", static_cast<int>(op), " reached the C++ path");
  }
}

const char* op_name(c10d::ReduceOp::RedOpType op) {
  static const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  return op <= c10d::ReduceOp::PREMUL_SUM ? names[op] : "UNUSED";
}

uint64_t collective_signature(const std::string& name, const std::string& extra,
                              const std::vector<at::Tensor>& tensors) {
  CollectiveSignature s(name, extra, tensors.size());
  for (const auto& t : tensors) {
    s.add_tensor(t.sizes().data(), t.dim(), static_cast<int64_t>(t.scalar_type()));
  }
  return s.value();
}

// --- EmuWork ------------------------------------------------------------------

EmuWork::EmuWork(std::vector<at::Tensor> outputs, int device, c10::intrusive_ptr<c10::ivalue::Future> future,
                 std::shared_ptr<PendingTime> end, std::shared_ptr<OrderedRunner::Ticket> ticket, bool blocks_host)
    : outputs_(std::move(outputs)),
      device_(device),
      future_(std::move(future)),
      end_(std::move(end)),
      ticket_(std::move(ticket)),
      blocks_host_(blocks_host) {}

TimeNs EmuWork::end() {
  return translate_errors([&] { return end_->force(); });
}

// Orders the caller's current stream after the collective; the host goes on.
bool EmuWork::wait(std::chrono::milliseconds /*timeout*/) {
  const EmulatorCall call(active_virtual_clock());
  translate_errors([&] {
    auto& device = Runtime::get().device(device_);
    if (blocks_host_) {
      without_gil([&] { device.wait_until(end_->force()); });
    } else {
      device.stream_wait(current_stream_id(device_), end_);
    }
  });
  return true;
}

// Done on the emulated device: its end is known and the host clock reached it.
bool EmuWork::isCompleted() {
  const EmulatorCall call(active_virtual_clock());  // a loop polling it is host work
  if (ticket_ && !ticket_->done()) return false;
  if (ticket_ && ticket_->error()) return true;
  return Runtime::get().device(device_).reached(end());
}

bool EmuWork::isSuccess() const { return !ticket_ || !ticket_->done() || !ticket_->error(); }

std::vector<at::Tensor> EmuWork::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> EmuWork::getFuture() { return future_; }

// --- GroupCollectives ----------------------------------------------------------

GroupCollectives::GroupCollectives(GroupSpec spec, std::shared_ptr<Transport> words, std::shared_ptr<TcpTransport> bulk,
                                   c10::intrusive_ptr<c10d::Store> reports)
    : spec_(spec),
      words_(std::move(words)),
      bulk_(std::move(bulk)),
      reports_(std::move(reports)),
      runner_(std::make_shared<OrderedRunner>()),
      poster_(std::make_shared<OrderedRunner>()) {
  TORCH_CHECK(words_ != nullptr && bulk_ != nullptr && reports_,
              "emu backend: a process group needs its transports "
              "and its store");
}

int64_t GroupCollectives::comm_stream(int device) {
  TORCH_CHECK_INDEX(device >= 0 && device < static_cast<int>(comm_.size()),
                    "emu backend: expected a device index in "
                    "[0, ",
                    comm_.size(), "), got ", device);
  auto& slot = comm_[static_cast<size_t>(device)];
  int64_t id = slot.load();
  if (id != 0) return id;
  const int64_t fresh = translate_errors([&] { return Runtime::get().device(device).pool_stream(false); });
  return slot.compare_exchange_strong(id, fresh) ? fresh : id;
}

uint64_t GroupCollectives::gather_words(const CollectiveWords& mine) {
  int64_t words[CollectiveWords::kCount];
  mine.encode(words);
  return words_->start_gather(words, CollectiveWords::kCount, spec_.timeout);
}

GatheredWords GroupCollectives::finish(uint64_t ticket, const std::string& name) {
  std::vector<int64_t> words(static_cast<size_t>(spec_.size) * CollectiveWords::kCount);
  try {
    words_->finish_gather(ticket, words.data(), CollectiveWords::kCount, spec_.timeout);
  } catch (const Error& e) {
    std::ostringstream message;
    message << "emu backend: rank " << spec_.rank << " of " << spec_.size << ": " << name
            << " failed: another rank exited or did not arrive within the process group's timeout ("
            << static_cast<double>(spec_.timeout.count()) / 1e9 << " s). Check the other ranks' output for their "
            << "error. Transport said: " << e.what();
    C10_THROW_ERROR(DistBackendError, message.str());
  }
  return GatheredWords(std::move(words), spec_.size);
}

TimeNs GroupCollectives::place(int device, int64_t comm, const GatheredWords& words, const std::string& model_kind) {
  const TimeNs start = words.start() + spec_.clock_offset;
  const auto bytes = static_cast<double>(words.max(CollectiveWords::kModelBytes));
  const TimeNs duration =
      spec_.size > 1 ? collective_duration(device, model_kind, bytes, spec_.size, spec_.ranks_per_node) : 0;
  return Runtime::get().device(device).collective_launch(comm, start, duration);
}

c10::intrusive_ptr<c10::ivalue::Future> GroupCollectives::completed_future(int device,
                                                                           const std::vector<at::Tensor>& outputs,
                                                                           std::shared_ptr<PendingTime> end) const {
  auto future = device_future(device);
  EventTimeScope scope(std::move(end));
  future->markCompleted(c10::IValue(outputs));
  return future;
}

c10::intrusive_ptr<c10d::Work> GroupCollectives::all_reduce(const std::string& name,
                                                            const std::vector<at::Tensor>& tensors,
                                                            c10d::ReduceOp::RedOpType op) {
  TORCH_CHECK(all_reduce_args_ok(tensors, op), "emu backend: ", name,
              " reached the group with arguments its checks "
              "refuse; please report this");
  const bool compute = Runtime::get().compute_mode();
  int64_t largest = 0;
  int64_t payload = 0;
  for (const auto& t : tensors) {
    largest = std::max(largest, nbytes(t));
    payload += nbytes(t);
  }
  const std::string extra = op_name(op);
  const int device = tensors[0].device().index();
  if (!compute && largest > spec_.data_threshold) {  // no rank moves these bytes
    bool real = true;
    for (const auto& t : tensors) real = real && tensor_materialized(t);
    return defer(name, "all_reduce", static_cast<double>(payload), largest, payload, real, tensors, tensors, tensors,
                 extra, device);
  }
  return translate_errors([&]() -> c10::intrusive_ptr<c10d::Work> {
    const uint64_t signature = collective_signature(name, extra, tensors);
    // The runner reads and writes the bytes where the storages are now (a
    // later set_() does not move them); the host waits for it only where it
    // touches them (await_collective_writes).
    std::vector<at::Tensor> hosts;
    std::vector<c10::Storage> storages;
    std::vector<const void*> touches;
    for (const auto& t : tensors) {
      hosts.push_back(host_alias(t));
      storages.push_back(t.storage());
      touches.push_back(t.storage().unsafeGetStorageImpl());
    }
    const int64_t comm = comm_stream(device);
    auto place = [self = weak_from_this(), name, extra, op, signature, largest, payload, compute, device, comm, tensors,
                  hosts, storages](TimeNs start) {
      const auto group = self.lock();
      TORCH_CHECK(group != nullptr, "emu backend: ", name, " was placed after its process group was destroyed");
      // Whether the bytes are real is read here: collectives before it in launch order may change it.
      bool real = compute;
      if (!compute) {
        real = true;
        for (const auto& st : storages) real = real && is_materialized(st);
      }
      const uint64_t ticket = group->gather_words({start, real, compute, signature, payload, largest, payload});
      const GatheredWords words = group->finish(ticket, name);
      group->check_signatures(words, signature, ticket, name, extra, tensors);
      const bool moves = words.moves_bytes(group->spec_.data_threshold);
      if (moves) group->reduce_bytes(name, hosts, op, payload);
      if (!compute) {
        for (const auto& st : storages) set_materialized(st, moves);
      }
      return group->place(device, comm, words, "all_reduce");
    };
    return defer_call(device, tensors, std::move(place), std::move(touches));
  });
}

void GroupCollectives::reduce_bytes(const std::string& name, const std::vector<at::Tensor>& hosts,
                                    c10d::ReduceOp::RedOpType op, int64_t payload) {
  // Every rank's bytes reduced in rank order: all ranks hold identical results.
  std::vector<at::Tensor> acc(hosts.size());
  auto add = [&](int rank, const void* bytes, size_t length) {
    TORCH_CHECK(length == static_cast<size_t>(payload), "emu backend: ", name, " expected ", payload,
                " bytes from rank ", rank, ", got ", length);
    size_t at = 0;
    for (size_t i = 0; i < hosts.size(); ++i) {
      at::Tensor part = at::empty(hosts[i].sizes(), hosts[i].options());
      const auto n = static_cast<size_t>(nbytes(hosts[i]));
      if (n > 0) std::memcpy(part.data_ptr(), static_cast<const uint8_t*>(bytes) + at, n);
      at += n;
      if (acc[i].defined()) {
        reduce_into(acc[i], part, op);
      } else {
        acc[i] = std::move(part);
      }
    }
  };
  auto finish_into = [&](Bytes& out) {
    size_t at = 0;
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (op == c10d::ReduceOp::AVG) acc[i].div_(spec_.size);
      const auto n = static_cast<size_t>(nbytes(hosts[i]));
      if (n > 0) std::memcpy(out.data() + at, acc[i].contiguous().data_ptr(), n);
      at += n;
    }
  };
  // Ranks with equal signatures have equal payloads: all pick the same path.
  const bool shm = std::string(words_->kind()) == "shm";
  if (shm && static_cast<size_t>(payload) <= words_->bytes_capacity()) {
    Bytes mine(static_cast<size_t>(payload));
    size_t offset = 0;
    for (const auto& h : hosts) {
      if (nbytes(h) > 0) std::memcpy(mine.data() + offset, h.data_ptr(), static_cast<size_t>(nbytes(h)));
      offset += static_cast<size_t>(nbytes(h));
    }
    words_->gather_bytes(mine.data(), mine.size(), spec_.timeout, add);
    finish_into(mine);
    offset = 0;
    for (const auto& h : hosts) {
      if (nbytes(h) > 0) std::memcpy(h.data_ptr(), mine.data() + offset, static_cast<size_t>(nbytes(h)));
      offset += static_cast<size_t>(nbytes(h));
    }
  } else if (shm) {
    reduce_bytes_in_rounds(name, hosts, op);
  } else {
    // Reduce-scatter, then all-gather (NCCL's ring moves as much): rank j
    // reduces slice j of every tensor, in rank order so that every rank ends
    // with the same bytes, and sends it to all. Each rank moves 2 (n-1)/n of
    // the payload each way; a root would move n times the payload.
    const int n = spec_.size;
    auto slice = [&](size_t i, int j) {
      const int64_t m = hosts[i].numel();
      return std::pair<int64_t, int64_t>{m * j / n, m * (j + 1) / n};
    };
    // One tensor (the common case): its slices are sent from where they lie.
    // Several (a coalesced batch): each rank's slices are packed first.
    std::vector<Bytes> outgoing(hosts.size() == 1 ? 0 : static_cast<size_t>(n));
    std::vector<const void*> chunks(static_cast<size_t>(n));
    std::vector<size_t> lengths(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      const auto uj = static_cast<size_t>(j);
      for (size_t i = 0; i < hosts.size(); ++i) {
        const auto [begin, end] = slice(i, j);
        const auto* base = static_cast<const uint8_t*>(hosts[i].data_ptr()) + begin * hosts[i].element_size();
        const auto length = static_cast<size_t>((end - begin) * hosts[i].element_size());
        if (outgoing.empty()) {
          chunks[uj] = base;
          lengths[uj] = length;
        } else {
          outgoing[uj].insert(outgoing[uj].end(), base, base + length);
        }
      }
      if (!outgoing.empty()) {
        chunks[uj] = outgoing[uj].data();
        lengths[uj] = outgoing[uj].size();
      }
    }
    Rows parts = bulk_->exchange(chunks, lengths, spec_.timeout);
    Bytes reduced(lengths[static_cast<size_t>(spec_.rank)]);
    for (int r = 0; r < n; ++r) {
      TORCH_CHECK(parts[static_cast<size_t>(r)].size() == reduced.size(), "emu backend: ", name, " expected ",
                  reduced.size(), " bytes of slice ", spec_.rank, " from rank ", r, ", got ",
                  parts[static_cast<size_t>(r)].size());
    }
    size_t at = 0;
    for (size_t i = 0; i < hosts.size(); ++i) {
      const auto [begin, end] = slice(i, spec_.rank);
      if (end == begin) continue;
      const auto options = hosts[i].options();
      at::Tensor sum;
      for (int r = 0; r < n; ++r) {
        at::Tensor part = at::from_blob(parts[static_cast<size_t>(r)].data() + at, {end - begin}, options);
        if (sum.defined()) {
          reduce_into(sum, part, op);
        } else {
          sum = part.clone();
        }
      }
      if (op == c10d::ReduceOp::AVG) sum.div_(spec_.size);
      const size_t length = static_cast<size_t>((end - begin) * hosts[i].element_size());
      std::memcpy(reduced.data() + at, sum.data_ptr(), length);
      at += length;
    }
    std::fill(chunks.begin(), chunks.end(), reduced.data());
    std::fill(lengths.begin(), lengths.end(), reduced.size());
    const Rows slices = bulk_->exchange(chunks, lengths, spec_.timeout);
    for (int r = 0; r < n; ++r) {
      const Bytes& from = slices[static_cast<size_t>(r)];
      size_t expected = 0;
      for (size_t i = 0; i < hosts.size(); ++i) {
        const auto [begin, end] = slice(i, r);
        expected += static_cast<size_t>((end - begin) * hosts[i].element_size());
      }
      TORCH_CHECK(from.size() == expected, "emu backend: ", name, " expected ", expected, " reduced bytes from rank ",
                  r, ", got ", from.size());
      size_t from_at = 0;
      for (size_t i = 0; i < hosts.size(); ++i) {
        const auto [begin, end] = slice(i, r);
        const auto length = static_cast<size_t>((end - begin) * hosts[i].element_size());
        if (length > 0) {
          std::memcpy(static_cast<uint8_t*>(hosts[i].data_ptr()) + begin * hosts[i].element_size(),
                      from.data() + from_at, length);
        }
        from_at += length;
      }
    }
  }
  add_payload_bytes_moved(static_cast<uint64_t>(payload));
}

void GroupCollectives::reduce_bytes_in_rounds(const std::string& name, const std::vector<at::Tensor>& hosts,
                                              c10d::ReduceOp::RedOpType op) {
  // Rounds of at most one shared-memory slot per rank. In each, every rank
  // publishes its bytes of the round's pieces and reduces its share of each
  // piece from every rank's slot, in rank order (so that one rank computes
  // each element and all end identical); the reduced shares are then
  // published and copied home in rounds of their own. Per rank, the payload
  // is written twice and read twice, with no system call but the futex.
  struct Piece {
    size_t tensor;
    int64_t begin, end;  // elements of the tensor
    size_t offset;       // bytes into the round's slot
  };
  const int n = spec_.size;
  const size_t capacity = words_->bytes_capacity();
  auto share = [n](const Piece& p, int rank) {
    const int64_t m = p.end - p.begin;
    return std::pair<int64_t, int64_t>{m * rank / n, m * (rank + 1) / n};
  };
  // The largest share of a piece over ranks: rounds are published when
  // these fill a slot, a decision every rank takes alike.
  auto largest_share = [n, &hosts](const Piece& p) {
    return static_cast<size_t>((p.end - p.begin + n - 1) / n) * static_cast<size_t>(hosts[p.tensor].element_size());
  };
  // Shares reduced by this rank and not yet published, their bytes, and
  // the largest such bytes over ranks.
  std::vector<Piece> reduced_pieces;
  Bytes reduced;
  reduced.reserve(capacity);  // the views below stay put
  size_t reduced_bound = 0;
  auto publish_reduced = [&] {
    if (reduced_pieces.empty()) return;
    words_->gather_bytes(reduced.data(), reduced.size(), spec_.timeout, [&](int r, const void* bytes, size_t length) {
      size_t at = 0;
      for (const Piece& p : reduced_pieces) {
        const auto [b, e] = share(p, r);
        const auto es = static_cast<size_t>(hosts[p.tensor].element_size());
        const size_t len = static_cast<size_t>(e - b) * es;
        TORCH_CHECK(at + len <= length, "emu backend: ", name, " expected at least ", at + len,
                    " reduced bytes from rank ", r, ", got ", length);
        if (r != spec_.rank && len > 0) {
          std::memcpy(element_at(hosts[p.tensor], p.begin + b), static_cast<const uint8_t*>(bytes) + at, len);
        }
        at += len;
      }
    });
    reduced_pieces.clear();
    reduced.clear();
    reduced_bound = 0;
  };
  auto run_round = [&](const std::vector<Piece>& pieces, size_t round_bytes) {
    Bytes packed;
    const void* mine = nullptr;
    if (pieces.size() == 1) {
      const Piece& p = pieces[0];
      mine = element_at(hosts[p.tensor], p.begin);
    } else {
      packed.resize(round_bytes);
      for (const Piece& p : pieces) {
        std::memcpy(packed.data() + p.offset, element_at(hosts[p.tensor], p.begin),
                    static_cast<size_t>((p.end - p.begin) * hosts[p.tensor].element_size()));
      }
      mine = packed.data();
    }
    // My shares land at the end of `reduced`, in piece order; reduced in place there.
    size_t round_bound = 0;
    for (const Piece& p : pieces) round_bound += largest_share(p);
    if (reduced_bound + round_bound > capacity) publish_reduced();
    reduced_bound += round_bound;
    std::vector<at::Tensor> acc;
    for (const Piece& p : pieces) {
      const auto [b, e] = share(p, spec_.rank);
      const size_t len = static_cast<size_t>((e - b) * hosts[p.tensor].element_size());
      reduced_pieces.push_back(p);
      const size_t at = reduced.size();
      reduced.resize(at + len);
      acc.push_back(at::from_blob(reduced.data() + at, {e - b}, hosts[p.tensor].options()));
    }
    words_->gather_bytes(mine, round_bytes, spec_.timeout, [&](int r, const void* bytes, size_t length) {
      TORCH_CHECK(length == round_bytes, "emu backend: ", name, " expected ", round_bytes, " bytes from rank ", r,
                  ", got ", length);
      for (size_t k = 0; k < pieces.size(); ++k) {
        const Piece& p = pieces[k];
        const auto [b, e] = share(p, spec_.rank);
        if (e == b) continue;
        const auto es = hosts[p.tensor].element_size();
        const auto* src = static_cast<const uint8_t*>(bytes) + p.offset + b * es;
        if (r == 0) {
          std::memcpy(acc[k].data_ptr(), src, static_cast<size_t>((e - b) * es));
        } else {
          reduce_into(acc[k], at::from_blob(const_cast<uint8_t*>(src), {e - b}, hosts[p.tensor].options()), op);
        }
      }
    });
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (op == c10d::ReduceOp::AVG) acc[k].div_(spec_.size);
      // This rank's own share goes home now; the others' arrive when published.
      const Piece& p = pieces[k];
      const auto [b, e] = share(p, spec_.rank);
      if (e > b) {
        std::memcpy(element_at(hosts[p.tensor], p.begin + b), acc[k].data_ptr(),
                    static_cast<size_t>((e - b) * hosts[p.tensor].element_size()));
      }
    }
  };
  // The pieces of each round, in tensor order, filling one slot.
  std::vector<Piece> round;
  size_t round_bytes = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const auto es = static_cast<size_t>(hosts[i].element_size());
    const int64_t m = hosts[i].numel();
    int64_t at = 0;
    while (at < m) {
      const auto room = static_cast<int64_t>((capacity - round_bytes) / es);
      if (room == 0) {
        run_round(round, round_bytes);
        round.clear();
        round_bytes = 0;
        continue;
      }
      const int64_t take = std::min(room, m - at);
      round.push_back(Piece{i, at, at + take, round_bytes});
      round_bytes += static_cast<size_t>(take) * es;
      at += take;
    }
  }
  if (!round.empty()) run_round(round, round_bytes);
  publish_reduced();
}

c10::intrusive_ptr<c10d::Work> GroupCollectives::defer(const std::string& name, const std::string& model_kind,
                                                       double model_bytes, int64_t largest, int64_t payload, bool real,
                                                       const std::vector<at::Tensor>& received,
                                                       const std::vector<at::Tensor>& outputs,
                                                       const std::vector<at::Tensor>& signed_, const std::string& extra,
                                                       int device) {
  return translate_errors([&]() -> c10::intrusive_ptr<c10d::Work> {
    for (const auto& t : received) set_tensor_materialized(t, false);  // after the collectives still writing it
    const int64_t comm = comm_stream(device);
    const uint64_t signature = collective_signature(name, extra, signed_);
    // Holds the group weakly: the runner's calls must not keep it alive. Holds
    // the tensors' shapes, not the tensors: their memory is the host's to free.
    auto place = [self = weak_from_this(), real, signature, model_bytes, largest, payload, name, extra,
                  shapes = shapes_of(signed_), model_kind, device, comm](TimeNs start) {
      const auto group = self.lock();
      TORCH_CHECK(group != nullptr, "emu backend: ", name, " was placed after its process group was destroyed");
      const uint64_t ticket =
          group->gather_words({start, real, false, signature, static_cast<int64_t>(model_bytes), largest, payload});
      const GatheredWords words = group->finish(ticket, name);
      group->check_signatures(words, signature, ticket, name, extra, shapes);
      return group->place(device, comm, words, model_kind);
    };
    return defer_call(device, outputs, std::move(place));
  });
}

std::pair<std::shared_ptr<OrderedRunner::Ticket>, std::shared_ptr<PendingTime>> GroupCollectives::submit_timed(
    OrderedRunner::Call call, std::vector<const void*> touches) {
  auto end = std::make_shared<PendingTime>();
  OrderedRunner::Call timed = [end, call = std::move(call)]() {
    const int64_t t = call();
    end->set(t);
    return t;
  };
  auto ticket = touches.empty() ? runner_->submit(std::move(timed))
                                : pending_writes().submit(runner_, std::move(touches), std::move(timed));
  end->set_force([runner = runner_, ticket] { return without_gil([&] { return runner->run_through(ticket); }); });
  return {ticket, end};
}

std::shared_ptr<OrderedRunner::Ticket> GroupCollectives::defer_post(int device, int64_t stream,
                                                                    std::function<void(TimeNs)> post) {
  return translate_errors([&] {
    auto& dev = Runtime::get().device(device);
    const LaterStart later{dev.stream_ready_pending(stream), device, stream, dev.clock().now(), spec_.clock_offset};
    const uint64_t watermark = pending_writes().watermark();  // a send reads what earlier collectives wrote
    return poster_->submit([later, watermark, post = std::move(post)]() -> int64_t {
      return translate_errors([&] {
        const TimeNs start = later();
        PendingWrites::Horizon horizon(watermark);
        post(start);
        return start;
      });
    });
  });
}

c10::intrusive_ptr<c10d::Work> GroupCollectives::defer_call(int device, const std::vector<at::Tensor>& outputs,
                                                            std::function<TimeNs(TimeNs)> place,
                                                            std::vector<const void*> touches) {
  return translate_errors([&]() -> c10::intrusive_ptr<c10d::Work> {
    const int64_t comm = comm_stream(device);
    auto& dev = Runtime::get().device(device);
    // NCCL's stream first waits for the caller's. Where the caller's stream
    // is held (behind an earlier collective whose end is not known yet), so
    // is this collective's start: the runner learns it, then exchanges it,
    // and the host goes on. One that autograd launches (a DDP bucket, an
    // FSDP reduce-scatter) is part of the backward, not the end of it.
    const LaterStart later{dev.follow(comm, current_stream_id(device), !in_backward()), device, comm, dev.clock().now(),
                           spec_.clock_offset};
    auto end = std::make_shared<PendingTime>();
    OrderedRunner::Call call = [later, end, place = std::move(place)]() {
      return translate_errors([&] {
        const TimeNs t = place(later());  // rank 0's clock in, this rank's out
        end->set(t);
        return t;
      });
    };
    auto ticket = touches.empty() ? runner_->submit(std::move(call))
                                  : pending_writes().submit(runner_, std::move(touches), std::move(call));
    // Its errors reach the host where it next waits for the collective's end.
    end->set_force([runner = runner_, ticket] { return without_gil([&] { return runner->run_through(ticket); }); });
    return c10::make_intrusive<EmuWork>(outputs, device, completed_future(device, outputs, end), end,
                                        std::move(ticket));
  });
}

// --- any collective ------------------------------------------------------------

namespace {

// Chunks of different lengths as one payload: their count and lengths
// (int64) first, so that any rank can cut another's apart.
Bytes framed(const Rows& chunks) {
  std::vector<int64_t> header{static_cast<int64_t>(chunks.size())};
  size_t total = 0;
  for (const auto& c : chunks) {
    header.push_back(static_cast<int64_t>(c.size()));
    total += c.size();
  }
  Bytes out(header.size() * 8 + total);
  std::memcpy(out.data(), header.data(), header.size() * 8);
  size_t at = header.size() * 8;
  for (const auto& c : chunks) {
    if (!c.empty()) std::memcpy(out.data() + at, c.data(), c.size());
    at += c.size();
  }
  return out;
}

// Chunk `index` of a framed payload.
Bytes unframed(const uint8_t* bytes, size_t length, size_t index) {
  int64_t count = 0;
  TORCH_CHECK(length >= 8, "emu backend: a framed payload of ", length, " bytes");
  std::memcpy(&count, bytes, 8);
  TORCH_CHECK(count >= 0 && index < static_cast<size_t>(count) && length >= 8 * (1 + static_cast<size_t>(count)),
              "emu backend: expected a framed payload with chunk ", index, ", got ", count, " chunks");
  size_t at = 8 * (1 + static_cast<size_t>(count));
  for (size_t i = 0; i < static_cast<size_t>(count); ++i) {
    int64_t n = 0;
    std::memcpy(&n, bytes + 8 * (1 + i), 8);
    TORCH_CHECK(n >= 0 && at + static_cast<size_t>(n) <= length, "emu backend: a framed payload's chunk ", i,
                " overruns it");
    if (i == index) return Bytes(bytes + at, bytes + at + n);
    at += static_cast<size_t>(n);
  }
  return {};
}

}  // namespace

Rows GroupCollectives::move_bytes(const CollectiveCall& call, int64_t longest) {
  const Rows packed = call.pack();
  const auto n = static_cast<size_t>(spec_.size);
  TORCH_CHECK(packed.size() == (call.per_destination ? n : 1), "emu backend: ", call.name, " packed ", packed.size(),
              " chunks, expected ", call.per_destination ? n : 1);
  Rows rows(n);
  // Every rank reads the same longest payload: all pick the same transport.
  if (std::string(words_->kind()) == "shm" && longest <= static_cast<int64_t>(words_->bytes_capacity())) {
    const Bytes mine = call.per_destination ? framed(packed) : packed[0];
    words_->gather_bytes(mine.data(), mine.size(), spec_.timeout, [&](int r, const void* bytes, size_t length) {
      const auto* p = static_cast<const uint8_t*>(bytes);
      rows[static_cast<size_t>(r)] =
          call.per_destination ? unframed(p, length, static_cast<size_t>(spec_.rank)) : Bytes(p, p + length);
    });
    return rows;
  }
  std::vector<const void*> chunks(n);
  std::vector<size_t> lengths(n);
  for (size_t r = 0; r < n; ++r) {
    const auto& c = packed[call.per_destination ? r : 0];
    chunks[r] = c.data();
    lengths[r] = c.size();
  }
  return bulk_->exchange(chunks, lengths, spec_.timeout);
}

TimeNs GroupCollectives::exchange_and_place(CollectiveCall& call, int64_t comm, bool compute, int64_t largest,
                                            uint64_t signature, TimeNs start) {
  // Read here, on the runner: collectives launched before may change them.
  bool real = true;
  if (!compute) {
    for (const auto& t : call.inputs) real = real && is_materialized(t.storage());
  }
  const uint64_t ticket =
      gather_words({start, real, compute, signature, static_cast<int64_t>(call.model_bytes), largest, call.payload});
  const GatheredWords words = finish(ticket, call.name);
  check_signatures(words, signature, ticket, call.name, call.extra, call.signed_);
  const bool moves = words.moves_bytes(spec_.data_threshold);
  if (moves) {
    Rows rows = move_bytes(call, words.max(CollectiveWords::kPayload));
    call.combine(rows);
    add_payload_bytes_moved(static_cast<uint64_t>(call.payload));
  }
  if (!compute) {
    for (const auto& t : call.received) set_materialized(t.storage(), moves);
  }
  return place(call.device, comm, words, call.model_kind);
}

c10::intrusive_ptr<c10d::Work> GroupCollectives::run(CollectiveCall call) {
  return translate_errors([&]() -> c10::intrusive_ptr<c10d::Work> {
    const bool compute = Runtime::get().compute_mode();
    std::vector<at::Tensor> tensors = call.inputs;
    tensors.insert(tensors.end(), call.received.begin(), call.received.end());
    int64_t largest = 0;
    for (const auto& t : tensors) largest = std::max(largest, nbytes(t));
    const uint64_t signature = collective_signature(call.name, call.extra, call.signed_);
    const int device = call.device;
    const int64_t comm = comm_stream(device);
    auto& dev = Runtime::get().device(device);
    if (call.blocks_host) {           // barrier: the host waits for it, as ProcessGroupNCCL's does
      without_gil([&] { drain(); });  // the collectives before it gather their words on the runner first
      dev.stream_wait(comm, dev.record_pending(current_stream_id(device), !in_backward()));
      const TimeNs start = without_gil([&] { return dev.collective_start(comm); }) - spec_.clock_offset;
      const TimeNs end =
          without_gil([&] { return exchange_and_place(call, comm, compute, largest, signature, start); });
      auto known = std::make_shared<PendingTime>(end);
      return c10::make_intrusive<EmuWork>(call.outputs, device, completed_future(device, call.outputs, known), known,
                                          nullptr, /*blocks_host=*/true);
    }
    if (!compute && largest > spec_.data_threshold) {  // no rank moves these bytes: the runner only places it
      bool real = true;
      for (const auto& t : call.inputs) real = real && tensor_materialized(t);
      return defer(call.name, call.model_kind, call.model_bytes, largest, call.payload, real, call.received,
                   call.outputs, call.signed_, call.extra, device);
    }
    std::vector<const void*> touches;
    for (const auto& t : tensors) {
      if (t.has_storage()) touches.push_back(t.storage().unsafeGetStorageImpl());
    }
    const std::vector<at::Tensor> outputs = call.outputs;
    auto shared = std::make_shared<CollectiveCall>(std::move(call));
    // The host goes on, as NCCL's does: the runner moves the bytes, and the
    // host waits for it where it touches these tensors (await_collective_writes).
    auto place = [self = weak_from_this(), shared, comm, compute, largest, signature](TimeNs start) {
      const auto group = self.lock();
      TORCH_CHECK(group != nullptr, "emu backend: ", shared->name, " was placed after its process group was destroyed");
      return group->exchange_and_place(*shared, comm, compute, largest, signature, start);
    };
    return defer_call(device, outputs, std::move(place), std::move(touches));
  });
}

std::string GroupCollectives::mismatch_message(const std::string& key, const std::string& name,
                                               const std::string& extra, const std::string& described,
                                               int other) const {
  const std::string mine = name + " on [" + described + "]" + (extra.empty() ? "" : ", " + extra);
  reports_->set(key + "/" + std::to_string(spec_.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<uint8_t> theirs;
  try {
    theirs = reports_->get(key + "/" + std::to_string(other));
  } catch (const std::exception& e) {
    C10_THROW_ERROR(DistBackendError, "emu backend: rank " + std::to_string(spec_.rank) + " of " +
                                          std::to_string(spec_.size) + ": " + name +
                                          " (mismatch report) failed: rank " + std::to_string(other) +
                                          " did not report within the store's timeout. Transport said: " + e.what());
  }
  return disagreement_message(spec_.rank, mine, other, std::string(theirs.begin(), theirs.end()));
}

namespace {
// Python's short name of a dtype ("float32"): torch's own table is not exported to extensions.
std::string python_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat: return "float32";
    case c10::kDouble: return "float64";
    case c10::kHalf: return "float16";
    case c10::kBFloat16: return "bfloat16";
    case c10::kLong: return "int64";
    case c10::kInt: return "int32";
    case c10::kShort: return "int16";
    case c10::kChar: return "int8";
    case c10::kByte: return "uint8";
    case c10::kUInt16: return "uint16";
    case c10::kUInt32: return "uint32";
    case c10::kUInt64: return "uint64";
    case c10::kBool: return "bool";
    case c10::kComplexHalf: return "complex32";
    case c10::kComplexFloat: return "complex64";
    case c10::kComplexDouble: return "complex128";
    case c10::kFloat8_e4m3fn: return "float8_e4m3fn";
    case c10::kFloat8_e5m2: return "float8_e5m2";
    case c10::kFloat8_e4m3fnuz: return "float8_e4m3fnuz";
    case c10::kFloat8_e5m2fnuz: return "float8_e5m2fnuz";
    default: return c10::toString(type);
  }
}
}  // namespace

std::string dtype_name(c10::ScalarType type) { return "torch." + python_dtype(type); }

TensorShapes shapes_of(const std::vector<at::Tensor>& tensors) {
  TensorShapes shapes;
  shapes.reserve(tensors.size());
  for (const auto& t : tensors) shapes.push_back({t.sizes().vec(), t.scalar_type()});
  return shapes;
}

std::string describe_tensors(const TensorShapes& shapes) {
  if (shapes.empty()) return "no tensors";
  std::ostringstream out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto& sizes = shapes[i].sizes;
    out << (i ? ", " : "") << "(";
    for (size_t d = 0; d < sizes.size(); ++d) out << (d ? ", " : "") << sizes[d];
    out << (sizes.size() == 1 ? ",)" : ")") << " " << python_dtype(shapes[i].dtype);
  }
  return out.str();
}

std::string describe_tensors(const std::vector<at::Tensor>& tensors) { return describe_tensors(shapes_of(tensors)); }

}  // namespace emugpu
