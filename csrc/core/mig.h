// MIG: a GPU split into instances, each an emulated GPU of its own with its
// profile's SMs, memory and share of the memory system, and no interference
// with its neighbours (MIG partitions SMs, L2 and memory controllers).
//
// A layout is a list of profile names ("3g.40gb,2g.20gb,1g.10gb,1g.10gb").
// It is valid when every instance finds a placement from its profile's list
// (the memory slices it starts at, as `nvidia-smi mig -lgipp` lists them)
// with no two instances on a common memory slice and at most the GPU's
// compute slices in all; the driver searches the placements, so does
// place_mig_layout.
#pragma once

#include <string>
#include <vector>

#include "catalog.h"

namespace emugpu {

struct MigInstance {
  const MigProfile* profile = nullptr;  // points into the GpuSpec's profiles
  int start = 0;                        // its first memory slice
};

// Profile names of a layout: comma-separated, case and a "MIG " prefix
// ignored; throws kValue naming `source` for an empty entry.
std::vector<std::string> parse_mig_layout(const std::string& text, const std::string& source);

// The profile `name` of `gpu`; throws kValue listing its profiles (or the
// GPUs that have MIG when `gpu` has none).
const MigProfile& find_mig_profile(const GpuSpec& gpu, const std::string& name);

// The instances of `profiles` on `gpu`, in the order given; throws kValue
// for an unknown profile or a layout no placement fits, listing the full
// layouts the GPU accepts.
std::vector<MigInstance> place_mig_layout(const GpuSpec& gpu, const std::vector<std::string>& profiles);

// Every layout of `gpu` to which no instance can be added (largest first),
// as "4g.40gb,3g.40gb": what an error offers instead of a bad layout.
std::vector<std::string> full_mig_layouts(const GpuSpec& gpu);

// An instance as an emulated GPU: the profile's SMs and memory, the peak
// rates of its SMs, the memory bandwidth of its memory slices; the PCIe link
// stays the GPU's (its copy engines are the instance's, the link is shared).
GpuSpec mig_instance_spec(const GpuSpec& gpu, const MigInstance& instance);

// nvidia-smi's UUID of an instance, "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx":
// the same for the same GPU index, profile and placement in every process,
// so that a process selects it by UUID as CUDA_VISIBLE_DEVICES does.
std::string mig_uuid(int gpu_index, const MigInstance& instance);

// One device of a node: a whole GPU or a MIG instance of one.
struct NodeGpu {
  int gpu = 0;        // the physical GPU's index
  int instance = -1;  // the instance's index on it; -1: the whole GPU
  GpuSpec spec;       // the instance's own for an instance
  std::string uuid;   // "MIG-..." for an instance
};

// `count` GPUs of `gpu`, whole (empty `layout`) or each split as `layout`
// says (throws as place_mig_layout).
std::vector<NodeGpu> node_devices(const GpuSpec& gpu, int count, const std::vector<std::string>& layout);

}  // namespace emugpu
