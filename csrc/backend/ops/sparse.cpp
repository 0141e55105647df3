// Sparse layouts (COO and the compressed ones) on emugpu, for what GNN
// training does with them: build adjacency matrices, move them, coalesce,
// transpose, multiply them with dense features (torch.sparse.mm, addmm,
// bmm, mv) and back-propagate through those products; sparse gradients
// (nn.Embedding(sparse=True)) too.
//
// Every aten op that PyTorch implements for sparse CPU tensors gets this
// kernel for the emugpu sparse keys (registered at load time, so it takes
// precedence over composite kernels that assume strided tensors). As named
// steps: check devices; in timing mode, sparse x dense products and
// to_dense take their (dense) output shapes from the dense op's Meta kernel
// and compute nothing, so large graphs cost no host time; every other op
// runs the CPU kernel over twins that alias the emugpu members (sparse
// structure is real wherever the indices were copied in); results come
// back as the inputs, views of them, or new emugpu tensors; time is charged
// by nnz. Ops whose output nnz depends on values (coalesce, to_sparse,
// sparse + sparse) are host syncs, as on CUDA.
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <unordered_set>

#include "backend/allocator.h"
#include "backend/ops/common.h"
#include "backend/ops/estimate.h"
#include "backend/ops/op_info.h"
#include "backend/ops/shape_rules.h"
#include "backend/ops/sparse_layout.h"
#include "backend/ops/tensor_util.h"

namespace emugpu {
namespace {

// Products with one sparse matrix operand whose result is dense; the
// sparse operand's argument index (or -1).
int sparse_product_operand(const OpInfo& info, const std::vector<c10::IValue>& args) {
  static const std::unordered_set<std::string> products = {"aten::mm", "aten::addmm", "aten::bmm",      "aten::baddbmm",
                                                           "aten::mv", "aten::addmv", "aten::_to_dense"};
  if (products.count(info.name) == 0) return -1;
  if (std::any_of(info.writes.begin(), info.writes.end(), [](bool w) { return w; })) return -1;
  int sparse = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].isTensor() || !is_sparse_layout(args[i].toTensor())) continue;
    if (sparse >= 0) return -1;  // sparse x sparse: the result is sparse
    sparse = static_cast<int>(i);
  }
  const bool accumulates = info.name.rfind("aten::add", 0) == 0 || info.name == "aten::baddbmm";
  if (accumulates && sparse == 0) return -1;  // a sparse `self` makes a sparse result
  return sparse;
}

TensorDesc contiguous_desc(at::IntArrayRef sizes, caffe2::TypeMeta dtype) {
  TensorDesc d;
  d.sizes = sizes.vec();
  const auto strides = c10::contiguous_strides(sizes);
  d.strides.assign(strides.begin(), strides.end());
  d.nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * dtype.itemsize();
  d.dtype = dtype;
  return d;
}

// Timing mode: the dense result's shape from the dense op's Meta kernel (the
// sparse operand stands in as a dense meta tensor); nothing is computed.
std::vector<c10::IValue> product_outputs(const c10::OperatorHandle& op, const OpInfo& info,
                                         const std::vector<c10::IValue>& args, int sparse, int device) {
  const at::Tensor s = args[sparse].toTensor();
  TensorDesc out;
  if (info.name == "aten::_to_dense") {
    const auto dtype =
        args.size() > 1 && !args[1].isNone() ? c10::scalarTypeToTypeMeta(args[1].toScalarType()) : s.dtype();
    out = contiguous_desc(s.sizes(), dtype);
  } else {
    std::vector<c10::IValue> dense_args = args;
    dense_args[sparse] = at::empty(s.sizes(), at::TensorOptions().dtype(s.scalar_type()).device(c10::kMeta));
    out = run_shape_rule(info, op, dense_args, args.size()).at(0).tensors.at(0);
  }
  return {translate_errors([&] { return new_device_tensor(device, out); })};
}

struct HostRun {
  std::vector<c10::IValue> results;
  bool nnz_from_values = false;  // a sparse result's size came from values: a host sync
};

// The CPU kernel over host twins of the arguments.
HostRun run_on_host(const c10::OperatorHandle& op, const OpInfo& info, const std::vector<c10::IValue>& args, int device,
                    bool compute) {
  // A dense input's sparsity is unknown in timing mode: every element counts
  // as stored (the upper bound, as for nonzero).
  const bool to_sparse = info.name.rfind("aten::_to_sparse", 0) == 0;
  HostMap map(device, /*timing=*/!compute, /*placeholder=*/to_sparse ? 1.0 : 0.0);
  std::unordered_set<int64_t> input_nnz;
  torch::jit::Stack host;
  host.reserve(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& a = args[i];
    if (a.isDevice() && a.toDevice().type() == kEmu) {
      host.emplace_back(c10::Device(c10::kCPU));
    } else if (a.isGenerator()) {
      host.emplace_back();  // the host's default generator
    } else {
      host.push_back(map_tensors(a, [&](const at::Tensor& t) {
        if (is_sparse_layout(t)) input_nnz.insert(sparse_nnz(t));
        return map.to_host(t, info.writes[i]);
      }));
    }
  }
  {
    c10::impl::ExcludeDispatchKeyGuard below_autograd(c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    op.callBoxed(host);
  }
  const bool real = compute || map.all_real();
  HostRun run;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!info.writes[i]) continue;
    for_each_tensor(args[i], [&](const at::Tensor& t) {
      if (!is_emu(t)) return;
      if (is_sparse_layout(t)) {
        map.write_back(t, real);
        if (input_nnz.count(sparse_nnz(t)) == 0) run.nnz_from_values = true;
      } else if (t.numel() > 0) {
        set_materialized(t.storage(), real);
      }
    });
  }
  for (const c10::IValue& r : host) {
    run.results.push_back(map_tensors(r, [&](const at::Tensor& h) {
      at::Tensor out = map.to_emu(h, real);
      if (is_sparse_layout(out) && input_nnz.count(sparse_nnz(out)) == 0) run.nnz_from_values = true;
      return out;
    }));
  }
  return run;
}

// True when the op ran a kernel: it wrote an argument or returned a tensor
// that is not a view of an argument.
bool runs_kernel(const OpInfo& info, const std::vector<c10::IValue>& results) {
  if (std::any_of(info.writes.begin(), info.writes.end(), [](bool w) { return w; })) return true;
  for (size_t i = 0; i < results.size(); ++i) {
    const bool view = i < info.returns.size() && info.returns[i].alias_arg >= 0;
    if (!view && (results[i].isTensor() || results[i].isTensorList())) return true;
  }
  return false;
}

void sparse_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  const OpInfo& info = info_for(op);
  const size_t num_args = op.schema().arguments().size();
  const std::vector<c10::IValue> args(stack->end() - static_cast<std::ptrdiff_t>(num_args), stack->end());
  await_collective_writes(args);  // dense operands a collective may still write
  const int device = op_device(info, args);
  const bool compute = Runtime::get().compute_mode();
  const int product = compute ? -1 : sparse_product_operand(info, args);
  HostRun run;
  if (product >= 0)
    run.results = product_outputs(op, info, args, product, device);
  else
    run = run_on_host(op, info, args, device, compute);
  if (runs_kernel(info, run.results)) {
    std::vector<at::Tensor> outputs;
    for (const auto& r : run.results) for_each_tensor(r, [&](const at::Tensor& t) { outputs.push_back(t); });
    translate_errors([&] {
      Device& dev = Runtime::get().device(device);
      const OpCost cost = estimate_sparse(info, args, outputs);
      const KernelCost charged = dev.cost().kernel_cost(cost);
      dev.ledger().record(cost, charged, info.name);
      const TimeNs d = charged.duration;
      if (run.nnz_from_values)
        charge_and_wait(device, Engine::kCompute, d);
      else
        charge(device, Engine::kCompute, d);
    });
  }
  torch::jit::drop(*stack, static_cast<int64_t>(num_args));
  for (auto& r : run.results) stack->push_back(std::move(r));
}

// What is left: PyTorch has no sparse kernel for the op on the CPU either.
void unsupported_sparse(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "emugpu: operator '", op.schema().name(),
      "' has no kernel for sparse tensors (PyTorch implements it for sparse tensors on CUDA only, or not at "
      "all). Convert with .to_dense(), or keep this part on the CPU.");
}

// One registration per op that PyTorch implements for sparse CPU tensors,
// and the conversions from strided tensors (dense key, sparse result).
struct SparseRegistrations {
  std::unique_ptr<torch::Library> dense, coo, compressed;
  SparseRegistrations()
      : dense(std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                               __LINE__)),
        coo(std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::SparsePrivateUse1,
                                             __FILE__, __LINE__)),
        compressed(std::make_unique<torch::Library>(torch::Library::IMPL, "aten",
                                                    c10::DispatchKey::SparseCsrPrivateUse1, __FILE__, __LINE__)) {
    auto& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      const auto op = dispatcher.findOp(name);
      if (!op) continue;
      std::string qualified = name.name.substr(6);
      if (!name.overload_name.empty()) qualified += "." + name.overload_name;
      if (op->hasKernelForDispatchKey(c10::DispatchKey::SparseCPU)) {
        coo->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&sparse_kernel>());
      }
      if (op->hasKernelForDispatchKey(c10::DispatchKey::SparseCsrCPU)) {
        compressed->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&sparse_kernel>());
      }
      if (name.name.rfind("aten::_to_sparse", 0) == 0 && op->hasKernelForDispatchKey(c10::DispatchKey::CPU)) {
        dense->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&sparse_kernel>());
      }
    }
  }
};

const SparseRegistrations registrations;

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_sparse>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unsupported_sparse>());
}

}  // namespace
}  // namespace emugpu
