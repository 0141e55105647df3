// Sparse layouts (COO, CSR/CSC/BSR/BSC) on emugpu: refused with an error that
// says what to do, instead of the dispatcher's "could not run ... with
// arguments from the 'SparsePrivateUse1' backend".
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace emugpu {
namespace {

void sparse_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      false, "emugpu: sparse tensors (COO and compressed layouts) are not supported yet (operator '",
      op.schema().name(), "'). Keep sparse tensors on the CPU (e.g. the adjacency of a GNN, with the "
      "dense features it multiplies), or convert them with .to_dense() before moving them to emugpu.");
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&sparse_fallback>());
}

}  // namespace
}  // namespace emugpu
