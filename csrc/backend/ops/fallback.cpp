// The boxed fallback for PrivateUse1: every aten op without an emugpu kernel
// runs here, as named steps: check devices; take the host path where output
// sizes depend on real values; find output shapes (shape cache, else Meta
// kernel or shape rule); make the outputs on the emulated allocator; compute
// values on the host in compute mode; charge the time to the device.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/graph_task.h>

#include <cstring>

#include "backend/allocator.h"
#include "backend/deferred_copy.h"
#include "backend/distributed/collective.h"
#include "backend/generator.h"
#include "backend/ops/common.h"
#include "backend/ops/compute_mode.h"
#include "backend/ops/estimate.h"
#include "backend/ops/op_info.h"
#include "backend/ops/shape_cache.h"
#include "backend/ops/shape_rules.h"
#include "backend/ops/tensor_util.h"
#include "core/exchange/words.h"

namespace emugpu {

namespace {

at::Tensor alias_of(const at::Tensor& t) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                       c10::DataPtr(const_cast<void*>(t.storage().data()), c10::Device(c10::kCPU)), nullptr,
                       /*resizable=*/false);
  auto host = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                       t.dtype());
  host.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return host;
}

}  // namespace

at::Tensor host_alias(const at::Tensor& t) {
  if (t.has_storage()) bytes_for_write(block_of(t.storage()));
  return alias_of(t);
}

at::Tensor host_read_alias(const at::Tensor& t) {
  if (t.has_storage()) bytes_for_read(block_of(t.storage()));
  return alias_of(t);
}

void move_bytes(const at::Tensor& dst_host_view, const at::Tensor& src_host_view) {
  if (dst_host_view.is_contiguous() && src_host_view.is_contiguous() &&
      dst_host_view.scalar_type() == src_host_view.scalar_type() && dst_host_view.sizes() == src_host_view.sizes()) {
    std::memcpy(dst_host_view.data_ptr(), src_host_view.data_ptr(), dst_host_view.nbytes());
  } else {
    dst_host_view.copy_(src_host_view);
  }
}

at::Tensor new_device_tensor(int device, const at::Tensor& like) {
  return new_device_tensor(device, TensorDesc::of(like));
}

namespace {

// EMUGPU_HOST_OP_US emulates a slower host's Python and framework time per
// op: ops launched from Python (forward, loss, optimizer) wait for it; those
// autograd's engine launches in C++ during backward keep this host's pace.
Device& paced(int device) {
  Device& d = Runtime::get().device(device);
  if (d.host_pace() > 0 && torch::autograd::get_current_graph_task_id() == -1) d.pace_host();
  return d;
}

}  // namespace

TimeNs charge(int device, Engine engine, TimeNs estimate, Occupancy occupancy) {
  return paced(device).launch(current_stream_id(device), engine, estimate, occupancy);
}

TimeNs charge_and_wait(int device, Engine engine, TimeNs estimate) {
  return paced(device).launch_and_wait(current_stream_id(device), engine, estimate);
}

namespace {

// Values decide the output sizes and the inputs hold real values (always in
// compute mode; in timing mode when every input holds copied-in bytes): the
// op runs on the host and its outputs are real. Reading the values is a host
// sync, as on CUDA (nonzero waits for its input).
void run_with_host_values(const c10::OperatorHandle& op, const OpInfo& info, const std::vector<c10::IValue>& args,
                          int device, torch::jit::Stack* stack) {
  torch::jit::Stack host;
  compute_on_host(op, args, host);
  torch::jit::drop(*stack, static_cast<int64_t>(args.size()));
  std::vector<at::Tensor> inputs, outputs;
  for (const auto& r : host) {
    at::Tensor out = new_device_tensor(device, r.toTensor());
    host_alias(out).copy_(r.toTensor());
    set_materialized(out.storage(), true);
    outputs.push_back(out);
    stack->emplace_back(out);
  }
  for (const auto& a : args)
    for_each_tensor(a, [&](const at::Tensor& t) {
      if (is_emu(t)) inputs.push_back(t);
    });
  translate_errors([&] {
    charge_and_wait(device, Engine::kCompute,
                    Runtime::get().device(device).cost().kernel(estimate(info, inputs, outputs, args)));
  });
}

// Step 1: output shapes, from the shape cache or from the op's shape rule.
struct Shapes {
  std::shared_ptr<const ShapeResult> cached;
  bool cacheable = true;
  Key miss_key;
  std::vector<OutDesc> fresh;
  const std::vector<OutDesc>& outs() const { return cached ? cached->outs : fresh; }
};

Shapes find_shapes(const c10::OperatorHandle& op, const OpInfo& info, const std::vector<c10::IValue>& args) {
  // The key is built in a per-thread buffer (no allocation per op) and copied only on a miss.
  thread_local Key key;
  key.clear();
  key.push_back(reinterpret_cast<intptr_t>(&op.schema()));
  key.push_back((at::globalContext().allowTF32CuBLAS() ? 1 : 0) + (at::globalContext().allowTF32CuDNN() ? 2 : 0));
  Shapes shapes;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!encode(args[i], key, !info.value_free[i])) {
      shapes.cacheable = false;
      break;
    }
  }
  if (shapes.cacheable) shapes.cached = find_shape(key);
  count_shape_lookup(shapes.cached != nullptr);
  if (shapes.cached == nullptr) {
    shapes.miss_key = key;  // the shape rule may re-enter the fallback and reuse `key`
    shapes.fresh = run_shape_rule(info, op, args, args.size());
  }
  return shapes;
}

// Step 2: outputs on emugpu: the inputs themselves for in-place and out= ops,
// views of inputs, or fresh tensors from the emulated allocator.
struct Outputs {
  std::vector<c10::IValue> results;  // what the op returns
  std::vector<at::Tensor> written;   // tensors the op writes
};

Outputs make_outputs(const OpInfo& info, const std::vector<OutDesc>& outs, const std::vector<c10::IValue>& args,
                     int device) {
  Outputs o;
  o.results.reserve(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const OutDesc& d = outs[i];
    const ReturnInfo r = i < info.returns.size() ? info.returns[i] : ReturnInfo{};
    if (d.kind == OutDesc::Kind::kOther) {
      o.results.push_back(d.other);
    } else if (d.kind == OutDesc::Kind::kUndefined) {
      o.results.emplace_back(at::Tensor());
    } else if (r.alias_arg >= 0) {
      const c10::IValue& base = args[r.alias_arg];
      at::Tensor self;
      for_each_tensor(base, [&](const at::Tensor& t) {
        if (!self.defined()) self = t;
      });
      if (d.kind == OutDesc::Kind::kTensor && r.write && base.isTensor()) {
        adopt_metadata(self, d.tensors[0]);
        o.written.push_back(self);
        o.results.emplace_back(self);
      } else if (d.kind == OutDesc::Kind::kTensor) {
        o.results.emplace_back(view_of(self, d.tensors[0]));
      } else {
        c10::List<at::Tensor> views;
        for (const TensorDesc& t : d.tensors) views.push_back(view_of(self, t));
        o.results.emplace_back(views);
      }
    } else if (d.kind == OutDesc::Kind::kTensor) {
      at::Tensor out = translate_errors([&] { return new_device_tensor(device, d.tensors[0]); });
      o.written.push_back(out);
      o.results.emplace_back(out);
    } else {
      c10::List<at::Tensor> list;
      for (const TensorDesc& t : d.tensors) {
        at::Tensor out = translate_errors([&] { return new_device_tensor(device, t); });
        o.written.push_back(out);
        list.push_back(out);
      }
      o.results.emplace_back(list);
    }
  }
  return o;
}

// Written values are real in compute mode and for small real ops, else placeholders.
// Returns the emugpu tensors the op reads (for the cost model, on a miss).
std::vector<at::Tensor> mark_writes(const OpInfo& info, const std::vector<c10::IValue>& args, const Outputs& o,
                                    bool compute, bool need_inputs) {
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (!is_emu(t)) return;
      if (need_inputs && info.reads[i]) inputs.push_back(t);
      if (info.writes[i] && !info.keeps_values) set_materialized(t.storage(), compute);
    });
  }
  if (!info.keeps_values) {
    for (const auto& out : o.written) set_materialized(out.storage(), compute);
  }
  return inputs;
}

// Timing mode computes an op's values after all where every tensor it reads
// holds real bytes and no tensor it reads or writes exceeds this (the size
// up to which collectives carry real bytes): control paths (object
// collectives' sizes, a checkpoint's metadata) then see the values a GPU
// would give, at the cost of a host kernel over at most 64 KiB per tensor.
constexpr int64_t kSmallRealBytes = kDataThresholdBytes;

bool small(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size() <= kSmallRealBytes; }

// Step 2b (timing mode): whether the op is small and reads only real bytes.
bool small_and_real(const OpInfo& info, const std::vector<c10::IValue>& args, const Outputs& o) {
  bool ok = info.host_kernel;
  for (size_t i = 0; i < args.size() && ok; ++i) {
    if (!info.reads[i] || (info.writes[i] && info.overwrites)) continue;
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (ok && is_emu(t)) ok = small(t) && (t.numel() == 0 || is_materialized(t.storage()));
    });
  }
  for (size_t i = 0; i < o.written.size() && ok; ++i) ok = small(o.written[i]);
  return ok;
}

// Step 3 (compute mode, or small and real): values from the CPU kernel over host aliases.
void compute_values(const c10::OperatorHandle& op, const OpInfo& info, const std::vector<c10::IValue>& args, int device,
                    const std::optional<RandomDraw>& draw, std::vector<c10::IValue>& results) {
  torch::jit::Stack host;
  compute_on_host(op, args, host, draw, info.generator_arg);
  for (size_t i = 0; i < host.size() && i < results.size(); ++i) {
    const ReturnInfo r = i < info.returns.size() ? info.returns[i] : ReturnInfo{};
    if (r.alias_arg >= 0) continue;  // written in place, or a view
    if (results[i].isTensor() && results[i].toTensor().defined() && host[i].isTensor()) {
      results[i] = store_host_result(device, results[i].toTensor(), host[i].toTensor());
    } else if (results[i].isTensorList()) {
      auto outs = results[i].toTensorList();
      auto values = host[i].toTensorList();
      for (size_t j = 0; j < outs.size(); ++j) outs.set(j, store_host_result(device, outs.get(j), values.get(j)));
    } else if (!results[i].isTensor()) {
      results[i] = host[i];
    }
  }
}

// Step 4: every op that runs a kernel is charged to the current stream; the
// estimate is remembered with the shapes.
void charge_time(const OpInfo& info, const std::vector<c10::IValue>& args, int device, bool estimate_now,
                 Shapes& shapes, const std::vector<at::Tensor>& inputs, const Outputs& o) {
  OpCost cost;
  KernelCost charged;
  Device& dev = Runtime::get().device(device);
  if (!estimate_now) {
    cost = shapes.cached->cost.expand();
    charged = shapes.cached->charged;
  } else if (!info.metadata_only) {
    cost = translate_errors([&] { return estimate(info, inputs, o.written, args); });
    charged = translate_errors([&] { return dev.cost().kernel_cost(cost); });
  }
  if (shapes.cached == nullptr && shapes.cacheable) {
    remember_shape(shapes.miss_key, ShapeResult{std::move(shapes.fresh), CostSummary::of(cost), charged});
  }
  if (!info.metadata_only) {
    dev.ledger().record(cost, charged, info.name);
    translate_errors([&] { charge(device, Engine::kCompute, charged.duration, charged.occupancy); });
  }
}

}  // namespace

void await_collective_writes(const std::vector<c10::IValue>& args) {
  if (pending_writes().empty()) return;
  for (const auto& a : args)
    for_each_tensor(a, [](const at::Tensor& t) {
      if (is_emu(t)) await_collective_writes(t);
    });
}

// The tensors in a foreach op's first list (a CUDA host's work grows with them), else 0.
int64_t list_tensors(const OpInfo& info, const torch::jit::Stack& stack, size_t num_args) {
  if (!info.per_tensor_devices || num_args == 0) return 0;
  const c10::IValue& first = stack[stack.size() - num_args];
  return first.isTensorList() ? static_cast<int64_t>(first.toTensorList().size()) : 0;
}

void emugpu_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  const OpInfo& info = info_for(op);
  const size_t num_args = op.schema().arguments().size();
  const EmulatorCall call(active_virtual_clock(), launched_op(), list_tensors(info, *stack, num_args));
  const std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  // A collective may still write these on its group's runner (stream order).
  await_collective_writes(args);
  const int device = op_device(info, args);
  const bool compute = Runtime::get().compute_mode();
  if (info.value_dependent && (compute || all_materialized(args))) {
    run_with_host_values(op, info, args, device, stack);
    return;
  }
  Shapes shapes = find_shapes(op, info, args);
  Outputs outputs = make_outputs(info, shapes.outs(), args, device);
  // Random ops advance their generator as CUDA's kernels do, in both modes.
  const std::optional<RandomDraw> draw =
      info.random ? draw_random(op, info.generator_arg, args, device, outputs.written) : std::nullopt;
  const bool real = !info.metadata_only && (compute || small_and_real(info, args, outputs));
  // A trace keeps each op's full cost (GEMM and convolution shapes), which the cache does not: estimate anew.
  const bool estimate_now = shapes.cached == nullptr || Runtime::get().device(device).ledger().tracing();
  const std::vector<at::Tensor> inputs = mark_writes(info, args, outputs, real, estimate_now);
  if (real && compute) {
    compute_values(op, info, args, device, draw, outputs.results);
  } else if (real) {
    try {
      compute_values(op, info, args, device, draw, outputs.results);
    } catch (const c10::Error&) {  // no host kernel for these inputs (a dtype the CPU lacks): placeholders, as before
      mark_writes(info, args, outputs, /*compute=*/false, /*need_inputs=*/false);
    }
  }
  charge_time(info, args, device, estimate_now, shapes, inputs, outputs);
  torch::jit::drop(*stack, static_cast<int64_t>(num_args));
  for (auto& r : outputs.results) stack->push_back(std::move(r));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&emugpu_fallback>()); }

}  // namespace emugpu
