// The shape cache: what one (op, argument metadata) produced, reused on
// every later call with the same metadata, so steady-state iterations never
// run a Meta kernel or the cost model. One cache per process, shared by the
// threads that run ops (the main thread, autograd's device threads), and
// bounded: a sweep over ever-new shapes cannot grow it without limit.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/ops/tensor_util.h"
#include "core/clock.h"
#include "core/cost_model.h"

namespace emugpu {

struct OutDesc {
  enum class Kind { kTensor, kTensorList, kUndefined, kOther } kind = Kind::kOther;
  std::vector<TensorDesc> tensors;
  c10::IValue other;
};

// What the cost ledger needs of a cached op's cost. The full OpCost (GEMM
// and convolution shapes) is only kept for traces, which run uncached.
struct CostSummary {
  double flops = 0;
  double bytes = 0;
  int kernels = 1;
  OpFamily family = OpFamily::kElementwise;
  DType dtype = DType::kFloat32;

  static CostSummary of(const OpCost& cost) { return {cost.flops, cost.bytes, cost.kernels, cost.family, cost.dtype}; }
  OpCost expand() const;
};

// What one (op, argument metadata) produces.
struct ShapeResult {
  std::vector<OutDesc> outs;
  CostSummary cost;    // what the cost model was asked
  KernelCost charged;  // and what it charged (duration 0: no kernel)
};

// The argument metadata, word by word, built per call in a reused buffer.
using Key = std::vector<int64_t>;

// Appends what determines an argument's effect on output shapes; false for
// argument kinds that cannot be keyed (the call then runs uncached).
// `values`: false where the argument's value cannot change the outputs'
// metadata (a scalar of an in-place op): only its kind is keyed.
bool encode(const c10::IValue& v, Key& key, bool values = true);

// Entries are found by a 128-bit fingerprint of the key, not the key itself
// (which is hundreds of bytes for ops on several tensors): two keys that
// differ collide with probability about 2^-128 per pair.
std::shared_ptr<const ShapeResult> find_shape(const Key& key);
void remember_shape(const Key& key, ShapeResult result);
void count_shape_lookup(bool hit);

// At most this many entries per process; the cache starts over beyond.
constexpr size_t kMaxShapeEntries = 100'000;

}  // namespace emugpu
