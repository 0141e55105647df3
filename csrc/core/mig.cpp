#include "mig.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>

#include "error.h"
#include "text.h"

namespace emugpu {
namespace {

std::string profile_list(const GpuSpec& gpu) {
  std::string out;
  for (const MigProfile& p : gpu.mig_profiles) out += (out.empty() ? "" : ", ") + p.name;
  return out;
}

std::string layouts_list(const GpuSpec& gpu) {
  std::string out;
  for (const std::string& l : full_mig_layouts(gpu)) out += (out.empty() ? "" : " | ") + l;
  return out;
}

// Places `order`'s instances from `next` on, on the free memory slices of
// `used`; the first fit in placement order, as the driver picks.
bool place(const std::vector<const MigProfile*>& order, size_t next, uint32_t used, std::vector<int>& starts) {
  if (next == order.size()) return true;
  const MigProfile& p = *order[next];
  for (const int start : p.placements) {
    const uint32_t mask = ((1u << p.memory_slices) - 1u) << start;
    if ((used & mask) != 0) continue;
    starts[next] = start;
    if (place(order, next + 1, used | mask, starts)) return true;
  }
  return false;
}

// Starts of `profiles` (same order), or empty when none fits.
std::vector<int> fit(const GpuSpec& gpu, const std::vector<const MigProfile*>& profiles) {
  int compute = 0;
  for (const MigProfile* p : profiles) compute += p->compute_slices;
  if (compute > gpu.mig_compute_slices || profiles.empty()) return {};
  // Largest first: they have the fewest placements, so the search stays small.
  std::vector<size_t> by_size(profiles.size());
  for (size_t i = 0; i < by_size.size(); ++i) by_size[i] = i;
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return profiles[a]->memory_slices > profiles[b]->memory_slices; });
  std::vector<const MigProfile*> order;
  for (size_t i : by_size) order.push_back(profiles[i]);
  std::vector<int> starts(order.size(), 0);
  if (!place(order, 0, 0, starts)) return {};
  std::vector<int> out(profiles.size());
  for (size_t k = 0; k < by_size.size(); ++k) out[by_size[k]] = starts[k];
  return out;
}

// FNV-1a, then splitmix64's finaliser: names that differ in one character
// get UUIDs that differ everywhere, as real ones do.
uint64_t hash64(const std::string& text, uint64_t seed) {
  uint64_t h = fnv1a(text, seed);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

std::vector<std::string> parse_mig_layout(const std::string& text, const std::string& source) {
  std::vector<std::string> out = split_trimmed(text, ',');
  for (std::string& name : out) {
    if (name.size() > 4 && (name.compare(0, 4, "MIG ") == 0 || name.compare(0, 4, "mig ") == 0)) {
      name = trim(name.substr(4));
    }
    EMUGPU_CHECK(!name.empty(), kValue, source, "='", text,
                 "': expected MIG profile names separated by commas (e.g. 3g.40gb,2g.20gb,1g.10gb), found an empty "
                 "entry");
  }
  return out;
}

const MigProfile& find_mig_profile(const GpuSpec& gpu, const std::string& name) {
  EMUGPU_CHECK(!gpu.mig_profiles.empty(), kValue, gpu.name,
               " has no MIG (the catalog lists no MIG profiles for it); MIG needs an A100 or H100 "
               "(or a catalog entry with a 'mig' object)");
  const std::string key = normalize_gpu_name(name);
  for (const MigProfile& p : gpu.mig_profiles) {
    if (normalize_gpu_name(p.name) == key) return p;
  }
  detail::throw_error(ErrorKind::kValue, "unknown MIG profile '", name, "' of ", gpu.name, "; expected one of ",
                      profile_list(gpu));
}

std::vector<MigInstance> place_mig_layout(const GpuSpec& gpu, const std::vector<std::string>& profiles) {
  EMUGPU_CHECK(!profiles.empty(), kValue, "expected at least one MIG profile for ", gpu.name,
               ", found none; its profiles: ", profile_list(gpu));
  std::vector<const MigProfile*> chosen;
  std::string asked;
  for (const std::string& name : profiles) {
    chosen.push_back(&find_mig_profile(gpu, name));
    asked += (asked.empty() ? "" : ",") + chosen.back()->name;
  }
  const std::vector<int> starts = fit(gpu, chosen);
  EMUGPU_CHECK(!starts.empty(), kValue, "MIG layout '", asked, "' does not fit on ", gpu.name, " (",
               gpu.mig_compute_slices, " compute slices, ", gpu.mig_memory_slices,
               " memory slices, each profile at its own placements); layouts that fill it: ", layouts_list(gpu),
               " (or any part of one)");
  std::vector<MigInstance> out;
  for (size_t i = 0; i < chosen.size(); ++i) out.push_back({chosen[i], starts[i]});
  return out;
}

std::vector<std::string> full_mig_layouts(const GpuSpec& gpu) {
  const auto& all = gpu.mig_profiles;
  // Larger profiles first, so that a layout reads "4g.40gb,3g.40gb".
  std::vector<const MigProfile*> sorted;
  for (const MigProfile& p : all) sorted.push_back(&p);
  std::stable_sort(sorted.begin(), sorted.end(), [](const MigProfile* a, const MigProfile* b) {
    return a->compute_slices != b->compute_slices ? a->compute_slices > b->compute_slices
                                                  : a->memory_slices > b->memory_slices;
  });
  std::vector<std::string> out;
  std::vector<const MigProfile*> current;
  std::function<void(size_t)> grow = [&](size_t from) {
    bool extended = false;
    for (size_t i = 0; i < sorted.size(); ++i) {
      current.push_back(sorted[i]);
      if (!fit(gpu, current).empty()) {
        extended = true;
        if (i >= from) grow(i);  // multisets in sorted order: each once
      }
      current.pop_back();
    }
    if (!extended && !current.empty()) {
      std::string layout;
      for (const MigProfile* p : current) layout += (layout.empty() ? "" : ",") + p->name;
      out.push_back(layout);
    }
  };
  grow(0);
  return out;
}

GpuSpec mig_instance_spec(const GpuSpec& gpu, const MigInstance& instance) {
  const MigProfile& p = *instance.profile;
  GpuSpec s = gpu;
  s.name = gpu.name + " MIG " + p.name;
  s.aliases.clear();
  s.memory_bytes = p.memory_bytes;
  s.sm_count = p.sm_count;
  const double sms = static_cast<double>(p.sm_count) / gpu.sm_count;
  for (double* rate : {&s.fp32_flops, &s.tf32_flops, &s.fp16_flops, &s.bf16_flops, &s.fp64_flops}) *rate *= sms;
  s.memory_bandwidth = gpu.memory_bandwidth * p.memory_slices / gpu.mig_memory_slices;
  s.nvlink_bandwidth = 0;  // MIG instances have no peer-to-peer (NVLink or PCIe)
  s.mig_compute_slices = 0;
  s.mig_memory_slices = 0;
  s.mig_profiles.clear();
  s.mig_profile = p.name;
  s.parent_name = gpu.name;
  return s;
}

std::string mig_uuid(int gpu_index, const MigInstance& instance) {
  const std::string key =
      "emugpu-mig/" + std::to_string(gpu_index) + "/" + instance.profile->name + "/" + std::to_string(instance.start);
  const uint64_t hi = hash64(key, 1469598103934665603ull);
  const uint64_t lo = hash64(key, 0x9e3779b97f4a7c15ull);
  char buf[48];
  std::snprintf(buf, sizeof buf, "MIG-%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(hi >> 32),
                static_cast<unsigned>((hi >> 16) & 0xffff), static_cast<unsigned>(hi & 0xffff),
                static_cast<unsigned>(lo >> 48), static_cast<unsigned long long>(lo & 0xffffffffffffull));
  return buf;
}

std::vector<NodeGpu> node_devices(const GpuSpec& gpu, int count, const std::vector<std::string>& layout) {
  std::vector<NodeGpu> out;
  const std::vector<MigInstance> placed = layout.empty() ? std::vector<MigInstance>{} : place_mig_layout(gpu, layout);
  for (int g = 0; g < count; ++g) {
    if (placed.empty()) {
      out.push_back({g, -1, gpu, ""});
      continue;
    }
    for (size_t i = 0; i < placed.size(); ++i) {
      out.push_back({g, static_cast<int>(i), mig_instance_spec(gpu, placed[i]), mig_uuid(g, placed[i])});
      out.back().spec.uuid = out.back().uuid;
    }
  }
  return out;
}

}  // namespace emugpu
