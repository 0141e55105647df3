// Which of a node's GPUs and MIG instances a process sees, as CUDA decides
// it from CUDA_VISIBLE_DEVICES (torch-emugpu's EMUGPU_VISIBLE_DEVICES; the
// run mode passes CUDA's variable through).
//
// Entries, separated by commas: a GPU's index ("1"; a MIG-enabled GPU's
// index stands for its first instance), an instance as nvidia-smi numbers it
// ("0:2", GPU 0's instance 2), or an instance's UUID ("MIG-..."). As in CUDA,
// a process enumerates at most one MIG instance: the first one listed (or,
// with no list, the node's first). Unlike CUDA, which silently stops at an
// entry it does not know, an unknown or repeated entry is an error listing
// the node's devices: the variable is torch-emugpu's own.
#pragma once

#include <string>
#include <vector>

namespace emugpu {

struct NodeDevice {
  int gpu = 0;        // the physical GPU's index on the node
  int instance = -1;  // its MIG instance's index on that GPU; -1: the whole GPU
  std::string uuid;   // "MIG-..." for an instance, empty otherwise
  std::string label;  // for errors: "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
};

// Indices into `node` of the devices a process sees, in its device order.
// `spec` empty: every whole GPU and the first instance. Throws kValue naming
// `source` for an unknown or repeated entry, or when nothing is left.
std::vector<size_t> select_visible_devices(const std::vector<NodeDevice>& node, const std::string& spec,
                                           const std::string& source);

}  // namespace emugpu
