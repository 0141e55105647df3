// Measured per-batch timings of (GPU, model) pairs, loaded from JSON profile
// files (schema: profiles/README.md), with batch-size interpolation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "catalog.h"

namespace emugpu {

struct ProfilePoint {
  int64_t batch_size = 0;
  double forward_s = 0;
  double backward_s = 0;  // loss + zero_grad + backward + optimizer step
  std::optional<double> transfer_pageable_s;
  std::optional<double> transfer_pinned_s;
  std::optional<double> peak_bytes;
  std::optional<double> persistent_bytes;
};

struct ProfileTable {
  int gpu_count = 1;
  std::vector<ProfilePoint> points;  // strictly increasing batch sizes
};

// The measuring host's cost per launched op (provenance.host), in
// microseconds, each when measured: what the host of a virtual clock charges
// per op. Written by torch-emugpu profile (torch_emugpu/measure/host_cost.py).
struct HostProfile {
  std::optional<double> python_op_us;        // a torch op called from a Python loop
  std::optional<double> module_op_us;        // an aten op of an nn.Module's forward
  std::optional<double> autograd_op_us;      // an aten op of a backward (the engine's C++ path)
  std::optional<double> optimizer_param_us;  // one parameter of a foreach AdamW step
  std::string cpu;                           // the CPU's model name, when recorded
};

struct Profile {
  std::string path;
  std::string gpu;                    // as written in the file
  std::string model;                  // e.g. "resnet50"
  std::optional<int64_t> parameters;  // structural fingerprint, when known
  std::string source;                 // provenance.source
  std::string dtype;                  // provenance.dtype: what the model computed in
  bool amp = false;                   // provenance.amp: under autocast to `dtype`
  std::optional<HostProfile> host;    // provenance.host: absent in profiles from before it
  std::vector<ProfileTable> tables;   // one per GPU count, 1 first

  const ProfileTable* table(int gpu_count) const;
};

enum class LookupKind { kExact, kInterpolated, kExtrapolated };

struct ProfileLookup {
  ProfilePoint point;  // at the requested batch size
  LookupKind kind = LookupKind::kExact;
  const Profile* profile = nullptr;
};

// Parses and validates one profile; errors (kValue) name the file and field.
Profile parse_profile(std::string_view text, const std::string& path);
Profile load_profile_file(const std::string& path);
// A host cost file (`python -m torch_emugpu.measure.host_cost --out FILE`):
// its figures, checked as a profile's provenance.host is (unknown keys
// passed over); throws kValue naming the file and the field.
HostProfile parse_host_cost(std::string_view text, const std::string& path);
HostProfile load_host_cost_file(const std::string& path);

// Piecewise-linear in batch size between measured points; beyond the table,
// linear from its last (or first) two points, never below zero.
ProfileLookup interpolate(const Profile& profile, const ProfileTable& table, int64_t batch_size);

class ProfileDb {
 public:
  // Loads every *.json profile below each directory (missing ones are
  // skipped); earlier directories win for the same (GPU, model, count). A
  // malformed profile throws kValue naming the file; an entry that cannot
  // be read at all (a symlink loop, no permission, an I/O error) is skipped
  // with one warning in warnings(), and the other profiles still load.
  void scan(const std::vector<std::string>& directories);
  // What scan skipped, one line each, for the torch layer to warn with.
  const std::vector<std::string>& warnings() const { return warnings_; }
  void add(Profile profile);

  // The profile for `gpu_name` (matched with the catalog's loose rules) and
  // `model`, or nullptr.
  const Profile* find(const Catalog& catalog, std::string_view gpu_name, std::string_view model) const;
  // `model` may be empty: then any profile whose fingerprint equals `parameters`.
  const Profile* find_by_fingerprint(const Catalog& catalog, std::string_view gpu_name, int64_t parameters) const;
  const std::vector<Profile>& profiles() const { return profiles_; }

  // Every profile names a GPU of `catalog` (kValue naming file and field
  // otherwise); the profiler's CPU stand-in ("CPU ...") is exempt: it never
  // matches an emulated GPU.
  void check_gpus(const Catalog& catalog) const;
  // The entry for `gpu_name` at `batch_size` on `gpu_count` GPUs: by model
  // name when `model` is not empty, else by parameter count; nullopt when no
  // profile (or no table for that GPU count) matches.
  std::optional<ProfileLookup> lookup(const Catalog& catalog, std::string_view gpu_name, std::string_view model,
                                      std::optional<int64_t> parameters, int64_t batch_size, int gpu_count) const;

 private:
  std::vector<Profile> profiles_;
  std::vector<std::string> warnings_;
};

}  // namespace emugpu
