// Sparse tensors (COO and the compressed layouts) on emugpu: their member
// tensors (indices, values; compressed and plain indices) are ordinary
// emugpu tensors, so memory is charged as on CUDA. A sparse op runs on the
// host over CPU twins that alias those members; HostMap carries tensors
// across and back without copying what the op only re-used.
#pragma once

#include <ATen/ATen.h>

#include <utility>
#include <vector>

namespace emugpu {

inline bool is_sparse_layout(const at::Tensor& t) { return t.defined() && t.layout() != c10::kStrided; }

// The dense member tensors of a sparse tensor (empty for a strided one).
std::vector<at::Tensor> sparse_members(const at::Tensor& t);
// Stored entries of a sparse tensor (0 for a strided one).
int64_t sparse_nnz(const at::Tensor& t);

class HostMap {
 public:
  // `timing`: emugpu tensors that hold placeholders cross filled with
  // `placeholder` (zeros, as they read back; ones where an upper bound is the
  // policy, as for nonzero).
  HostMap(int device, bool timing, double placeholder = 0)
      : device_(device), timing_(timing), placeholder_(placeholder) {}

  // An emugpu tensor's host counterpart: a CPU alias of a strided tensor's
  // bytes, or a CPU sparse twin over aliases of a sparse tensor's members.
  // Tensors the op writes always cross as aliases, so the result lands.
  at::Tensor to_host(const at::Tensor& emu, bool written);
  // A host result on emugpu: the emugpu tensor it is the twin of, a view of
  // the emugpu storage it aliases, or a new emugpu tensor holding a copy.
  // Copies count as real values when `real`.
  at::Tensor to_emu(const at::Tensor& host, bool real);
  // Gives the sparse emugpu tensor `emu` the structure its twin has after an
  // in-place op (new sizes, members, coalesced flag).
  void write_back(const at::Tensor& emu, bool real);
  // True when every emugpu tensor that crossed held real bytes.
  bool all_real() const { return all_real_; }

 private:
  at::Tensor alias_to_host(const at::Tensor& emu, bool written);
  at::Tensor twin_of(const at::Tensor& emu) const;

  int device_;
  bool timing_;
  double placeholder_;
  bool all_real_ = true;
  std::vector<std::pair<const void*, at::Tensor>> aliases_;  // host data pointer -> emugpu tensor
  std::vector<std::pair<at::Tensor, at::Tensor>> twins_;     // (emugpu sparse, host twin)
};

}  // namespace emugpu
