// The collectives of backend `emu`, one function per c10d collective: each
// checks its arguments as NCCL would (errors say what was expected and what
// was found), says which bytes each rank contributes and how each rank's
// result is made from what the ranks sent, and hands that to the group
// (GroupCollectives::run). The Python backend class forwards to these.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <vector>

#include "backend/distributed/group_collectives.h"

namespace emugpu {

using Work = c10::intrusive_ptr<c10d::Work>;
using TensorLists = std::vector<std::vector<at::Tensor>>;

// The device of `tensors` (the current one if there are none), once they
// are dense, contiguous emugpu tensors on one device, as NCCL wants them.
int checked_device(const std::string& name, const std::vector<at::Tensor>& tensors);

Work all_reduce(GroupCollectives& g, const std::string& name, const std::vector<at::Tensor>& tensors,
                c10d::ReduceOp::RedOpType op);
Work broadcast(GroupCollectives& g, const std::vector<at::Tensor>& tensors, int root);
Work reduce(GroupCollectives& g, const std::vector<at::Tensor>& tensors, int root, c10d::ReduceOp::RedOpType op);
Work all_gather(GroupCollectives& g, const TensorLists& outputs, const std::vector<at::Tensor>& inputs,
                const std::string& name);
Work all_gather_into_tensor(GroupCollectives& g, const std::vector<at::Tensor>& outputs,
                            const std::vector<at::Tensor>& inputs, const std::string& name);
Work reduce_scatter(GroupCollectives& g, const std::vector<at::Tensor>& outputs, const TensorLists& inputs,
                    c10d::ReduceOp::RedOpType op);
Work reduce_scatter_tensor(GroupCollectives& g, const std::vector<at::Tensor>& outputs,
                           const std::vector<at::Tensor>& inputs, c10d::ReduceOp::RedOpType op,
                           const std::string& name);
Work gather(GroupCollectives& g, const TensorLists& outputs, const std::vector<at::Tensor>& inputs, int root);
Work scatter(GroupCollectives& g, const std::vector<at::Tensor>& outputs, const TensorLists& inputs, int root);
Work all_to_all_single(GroupCollectives& g, const at::Tensor& output, const at::Tensor& input,
                       const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits);
Work all_to_all(GroupCollectives& g, const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& inputs);
Work barrier(GroupCollectives& g, int device);

}  // namespace emugpu
