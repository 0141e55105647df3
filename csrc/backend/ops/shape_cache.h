// The shape cache: what one (op, argument metadata) produced, reused on
// every later call with the same metadata, so steady-state iterations never
// run a Meta kernel or the cost model.
#pragma once

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <unordered_map>
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

// What one (op, argument metadata) produces: reused on every later call with
// the same metadata, so steady-state iterations never run a Meta kernel.
struct ShapeResult {
  std::vector<OutDesc> outs;
  OpCost cost;         // what the cost model was asked
  KernelCost charged;  // and what it charged (duration 0: no kernel)
};

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& k) const noexcept;
};

// Appends what determines an argument's effect on output shapes; false for
// argument kinds that cannot be keyed (the call then runs uncached).
bool encode(const c10::IValue& v, Key& key);

struct ShapeCache {
  int64_t generation = -1;
  std::unordered_map<Key, ShapeResult, KeyHash> entries;
};

// The calling thread's cache (emptied when the configuration changed).
ShapeCache& shape_cache();
void count_shape_lookup(bool hit);

}  // namespace emugpu
