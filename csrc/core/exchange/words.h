// What ranks tell each other per collective, written once for every
// transport and both layers: the words each rank contributes, the check that
// all ranks called the same collective, and the data rule (when real bytes
// move). Words are int64 so that one all-gather carries them on any transport.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "clock.h"

namespace emugpu {

// Per-tensor size up to which timing mode moves real bytes: covers DDP's
// parameter-shape check and buffers of small models, losses and metrics.
constexpr int64_t kDataThresholdBytes = 64 * 1024;

// Each rank's words of one collective, in wire order.
struct CollectiveWords {
  enum Index : int { kStart, kReal, kCompute, kSignature, kModelBytes, kLargest, kPayload, kCount };

  TimeNs start = 0;         // where the collective starts on this rank (rank 0's clock)
  bool real = false;        // every input tensor holds real bytes on this rank
  bool compute = false;     // this rank runs in compute mode
  uint64_t signature = 0;   // CollectiveSignature of name, extra and tensors
  int64_t model_bytes = 0;  // bytes the cost model charges (ranks may differ: all_to_all)
  int64_t largest = 0;      // largest tensor's bytes (the data rule's per-tensor threshold)
  int64_t payload = 0;      // bytes this rank contributes if bytes move

  void encode(int64_t* out) const;
};

// Every rank's words of one collective, rank-major: what a gather returns.
class GatheredWords {
 public:
  GatheredWords(std::vector<int64_t> rows, int size);

  int size() const { return size_; }
  int64_t at(int rank, CollectiveWords::Index w) const;
  int64_t max(CollectiveWords::Index w) const;
  bool all(CollectiveWords::Index w) const;
  // The first rank whose signature differs from `signature`, or -1.
  int first_disagreeing(uint64_t signature) const;
  // The data rule: bytes move when every rank runs in compute mode, or when
  // every tensor is at most `threshold` bytes and real on every rank. Every
  // rank decides from the same words, so all decide alike.
  bool moves_bytes(int64_t threshold) const;
  // The collective's start on every rank: the latest rank's start.
  TimeNs start() const { return max(CollectiveWords::kStart); }
  const std::vector<int64_t>& rows() const { return rows_; }

 private:
  std::vector<int64_t> rows_;
  int size_;
};

// Identifies a collective's name, extra (op, root) and tensor shapes and
// dtypes: equal on every rank and machine that calls the same collective
// (FNV-1a, unlike std::hash). Dtypes enter as their numeric code.
class CollectiveSignature {
 public:
  CollectiveSignature(const std::string& name, const std::string& extra, size_t tensors);
  // Once per tensor, in the order every rank passes them.
  void add_tensor(const int64_t* sizes, int64_t dim, int64_t dtype);
  uint64_t value() const { return h_; }

 private:
  void mix(uint64_t v);
  void mix_text(const std::string& s);
  uint64_t h_ = 1469598103934665603ull;
};

// The error a collective whose ranks disagree raises (each rank's call
// described by the caller). `theirs` came through the store, which anyone
// who can reach it may write: it is only ever quoted, as printable ASCII
// (other bytes as \xNN) and at most kMaxReportChars of it.
constexpr size_t kMaxReportChars = 400;
std::string disagreement_message(int rank, const std::string& mine, int other, const std::string& theirs);

}  // namespace emugpu
