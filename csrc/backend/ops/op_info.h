// What the fallback needs to know about an aten operator, read once from its
// schema: its cost family, whether its output sizes depend on values, which
// arguments it reads and writes, and which argument each return aliases.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

#include "core/op_cost.h"

namespace emugpu {

// Ops whose shapes do not come from a Meta kernel: output sizes that depend
// on values (taken from real bytes where the inputs hold them, else an upper
// bound, else an error), and a few ops PyTorch ships without a Meta kernel.
enum class DataDependent {
  kNone,
  kNonzero,
  kMaskedSelect,
  kUnique2,
  kUniqueDim,
  kUniqueConsecutive,
  kIndexWithMask,
  kNeedsValues,  // no bound exists (bincount, repeat_interleave): real inputs or an error
  kGruCell,
  kGruCellBackward,  // fused GRU cell: no Meta kernel in PyTorch
};

struct ReturnInfo {
  int alias_arg = -1;  // argument the return aliases, -1 for a fresh output
  bool write = false;  // in-place / out= (true) or view (false)
};

struct OpInfo {
  std::string name;
  OpFamily family = OpFamily::kElementwise;
  DataDependent data_dependent = DataDependent::kNone;
  bool value_dependent = false;  // output sizes depend on input values
  std::vector<ReturnInfo> returns;
  std::vector<bool> writes;  // per argument: mutated by the op
  std::vector<bool> reads;   // per argument: read by the op (all but out= arguments)
  // Per argument: a floating scalar (or a list of them) of an in-place op
  // (its outputs are written positional arguments, no out=): its value
  // cannot change their metadata, so the shape cache keys only its kind (an
  // optimizer's step size changes every step).
  std::vector<bool> value_free;
  bool metadata_only = true;        // only views: no kernel runs on the device
  bool per_tensor_devices = false;  // foreach / fused ops: list entries may sit on different devices
  bool host_index_tensors = false;  // CPU index or length tensors are accepted, as CUDA does
  bool keeps_values = false;        // resize_: its write changes the geometry, the bytes already there stay real
  // Arguments the cost estimate reads by name (-1: the schema has none).
  int groups_arg = -1;
  int stride_arg = -1;
  int transposed_arg = -1;
  int causal_arg = -1;
  int mask_arg = -1;  // convolution_backward's output_mask
  // Random numbers: the `Generator?` argument (-1: none), and whether the op
  // may draw from a generator at all (with one, or from the device's
  // default one as dropout and attention with dropout do on CUDA).
  int generator_arg = -1;
  bool random = false;
  // fill_, zero_ and random ops: the tensors they write are not read.
  bool overwrites = false;
  bool host_kernel = true;  // a CPU kernel exists (CUDA-only ops, such as flash attention, have none)
};

// The operator's information, computed on first use (per thread: no lock).
const OpInfo& info_for(const c10::OperatorHandle& op);

}  // namespace emugpu
