#include "visible_devices.h"

#include <algorithm>
#include <optional>

#include "error.h"
#include "text.h"

namespace emugpu {
namespace {

std::optional<int> small_index(const std::string& text) {
  if (text.empty() || text.size() > 4 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return std::stoi(text);
}

std::string listing(const std::vector<NodeDevice>& node) {
  std::string out;
  for (const NodeDevice& d : node) {
    out += out.empty() ? "" : "; ";
    if (d.instance < 0) {
      out += std::to_string(d.gpu) + " (" + d.label + ")";
    } else {
      out += std::to_string(d.gpu) + ":" + std::to_string(d.instance) + " or " + d.uuid + " (" + d.label + ")";
    }
  }
  return out;
}

// The entry's device, or nullopt when it names none.
std::optional<size_t> resolve(const std::vector<NodeDevice>& node, const std::string& entry) {
  const size_t colon = entry.find(':');
  if (entry.rfind("MIG-", 0) == 0) {
    for (size_t i = 0; i < node.size(); ++i) {
      if (node[i].uuid == entry) return i;
    }
    return std::nullopt;
  }
  if (colon != std::string::npos) {
    const auto gpu = small_index(entry.substr(0, colon));
    const auto instance = small_index(entry.substr(colon + 1));
    if (!gpu || !instance) return std::nullopt;
    for (size_t i = 0; i < node.size(); ++i) {
      if (node[i].gpu == *gpu && node[i].instance == *instance) return i;
    }
    return std::nullopt;
  }
  const auto gpu = small_index(entry);
  if (!gpu) return std::nullopt;
  for (size_t i = 0; i < node.size(); ++i) {
    if (node[i].gpu == *gpu) return i;  // the whole GPU, or its first instance
  }
  return std::nullopt;
}

}  // namespace

std::vector<size_t> select_visible_devices(const std::vector<NodeDevice>& node, const std::string& spec,
                                           const std::string& source) {
  std::vector<size_t> listed;
  if (trim(spec).empty()) {
    for (size_t i = 0; i < node.size(); ++i) listed.push_back(i);
  } else {
    for (const std::string& entry : split_trimmed(spec, ',')) {
      const auto found = resolve(node, entry);
      EMUGPU_CHECK(
          found.has_value(), kValue, source, "='", spec, "': entry '", entry,
          "' names none of this node's devices; expected indices, GPU:INSTANCE or MIG UUIDs of: ", listing(node));
      EMUGPU_CHECK(std::find(listed.begin(), listed.end(), *found) == listed.end(), kValue, source, "='", spec,
                   "': entry '", entry, "' names a device listed before; list each device once");
      listed.push_back(*found);
    }
  }
  std::vector<size_t> out;
  bool mig_taken = false;
  for (const size_t i : listed) {
    if (node[i].instance >= 0) {
      if (mig_taken) continue;  // CUDA enumerates one MIG device per process
      mig_taken = true;
    }
    out.push_back(i);
  }
  EMUGPU_CHECK(!out.empty(), kValue, source, "='", spec, "' leaves no device visible; devices: ", listing(node));
  return out;
}

}  // namespace emugpu
