#include "backend/ops/shape_cache.h"

#include <atomic>
#include <bit>
#include <mutex>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>

#include "backend/ops/common.h"

namespace emugpu {
namespace {

std::atomic<int64_t> g_cache_generation{0};
std::atomic<int64_t> g_cache_hits{0};
std::atomic<int64_t> g_cache_misses{0};

void encode_tensor(const at::Tensor& t, Key& key) {
  if (!t.defined()) {
    key.push_back(-1);
    return;
  }
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(static_cast<int64_t>(t.device().type()) * 256 + t.device().index());
  key.push_back(t.dim());
  for (int64_t s : t.sizes()) key.push_back(s);
  for (int64_t s : t.strides()) key.push_back(s);
  key.push_back(t.storage_offset());
  key.push_back(t.has_storage() ? static_cast<int64_t>(t.storage().nbytes()) : -2);
}

}  // namespace

bool encode(const c10::IValue& v, Key& key, bool values) {
  // Each kind pushes its own tag first, so different kinds never collide.
  if (v.isTensor()) {
    key.push_back(1);
    encode_tensor(v.toTensor(), key);
  } else if (v.isNone() || v.isGenerator()) {
    key.push_back(2);
  } else if (v.isInt()) {
    key.push_back(3);
    key.push_back(v.toInt());
  } else if (v.isBool()) {
    key.push_back(v.toBool() ? 4 : 5);
  } else if (v.isDouble()) {
    key.push_back(6);
    if (values) key.push_back(std::bit_cast<int64_t>(v.toDouble()));
  } else if (v.isComplexDouble()) {
    const auto c = v.toComplexDouble();
    key.push_back(7);
    if (values) {
      key.push_back(std::bit_cast<int64_t>(c.real()));
      key.push_back(std::bit_cast<int64_t>(c.imag()));
    }
  } else if (v.isString()) {
    key.push_back(8);
    key.push_back(static_cast<int64_t>(std::hash<std::string_view>{}(v.toStringView())));
  } else if (v.isDevice()) {
    key.push_back(9);
    key.push_back(static_cast<int64_t>(v.toDevice().type()) * 256 + v.toDevice().index());
  } else if (v.isTensorList()) {
    key.push_back(10);
    key.push_back(static_cast<int64_t>(v.toTensorList().size()));
    for (const at::Tensor& t : v.toTensorList()) encode_tensor(t, key);
  } else if (v.isIntList()) {
    key.push_back(11);
    key.push_back(static_cast<int64_t>(v.toIntList().size()));
    for (int64_t x : v.toIntList()) key.push_back(x);
  } else if (v.isBoolList()) {
    key.push_back(12);
    key.push_back(static_cast<int64_t>(v.toBoolList().size()));
    for (bool x : v.toBoolList()) key.push_back(x ? 1 : 0);
  } else if (v.isDoubleList()) {
    key.push_back(13);
    key.push_back(static_cast<int64_t>(v.toDoubleList().size()));
    if (values) {
      for (double x : v.toDoubleList()) key.push_back(std::bit_cast<int64_t>(x));
    }
  } else if (v.isList()) {
    key.push_back(14);
    key.push_back(static_cast<int64_t>(v.toList().size()));
    for (const c10::IValue& e : v.toList()) {
      if (!encode(e, key, values)) return false;
    }
  } else {
    return false;
  }
  return true;
}

OpCost CostSummary::expand() const {
  OpCost c;
  c.flops = flops;
  c.bytes = bytes;
  c.kernels = kernels;
  c.family = family;
  c.dtype = dtype;
  return c;
}

namespace {

struct Fingerprint {
  uint64_t a = 0, b = 0;
  bool operator==(const Fingerprint&) const = default;
};

struct FingerprintHash {
  size_t operator()(const Fingerprint& f) const noexcept { return static_cast<size_t>(f.a); }
};

// Two independent 64-bit hashes: FNV-1a, and a multiply-rotate mix.
Fingerprint fingerprint(const Key& key) {
  uint64_t a = 1469598103934665603ull;
  uint64_t b = 0x9e3779b97f4a7c15ull ^ key.size();
  for (int64_t w : key) {
    const auto u = static_cast<uint64_t>(w);
    a = (a ^ u) * 1099511628211ull;
    b = std::rotl((b ^ u) * 0xbf58476d1ce4e5b9ull, 31) * 0x94d049bb133111ebull;
  }
  return {a, b};
}

struct Cache {
  std::shared_mutex mutex;
  int64_t generation = -1;
  std::unordered_map<Fingerprint, std::shared_ptr<const ShapeResult>, FingerprintHash> entries;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: ops may run during static destruction
  return *c;
}

}  // namespace

std::shared_ptr<const ShapeResult> find_shape(const Key& key) {
  const Fingerprint f = fingerprint(key);
  Cache& c = cache();
  std::shared_lock<std::shared_mutex> lock(c.mutex);
  if (c.generation != g_cache_generation.load(std::memory_order_relaxed)) return nullptr;
  const auto it = c.entries.find(f);
  return it == c.entries.end() ? nullptr : it->second;
}

void remember_shape(const Key& key, ShapeResult result) {
  const Fingerprint f = fingerprint(key);
  auto entry = std::make_shared<const ShapeResult>(std::move(result));
  Cache& c = cache();
  std::unique_lock<std::shared_mutex> lock(c.mutex);
  const int64_t generation = g_cache_generation.load(std::memory_order_relaxed);
  if (c.generation != generation || c.entries.size() >= kMaxShapeEntries) {
    c.entries = {};  // releases the buckets too
    c.generation = generation;
  }
  c.entries.emplace(f, std::move(entry));
}

void count_shape_lookup(bool hit) { (hit ? g_cache_hits : g_cache_misses).fetch_add(1, std::memory_order_relaxed); }

void invalidate_shape_caches() {
  g_cache_generation.fetch_add(1);
  Cache& c = cache();
  std::unique_lock<std::shared_mutex> lock(c.mutex);
  c.entries = {};
}

std::pair<int64_t, int64_t> shape_cache_stats() { return {g_cache_hits.load(), g_cache_misses.load()}; }

size_t shape_cache_entries() {
  Cache& c = cache();
  std::shared_lock<std::shared_mutex> lock(c.mutex);
  return c.generation == g_cache_generation.load() ? c.entries.size() : 0;
}

}  // namespace emugpu
