#include "backend/ops/shape_cache.h"

#include <atomic>
#include <bit>
#include <string_view>

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

size_t KeyHash::operator()(const Key& k) const noexcept {
  uint64_t h = 1469598103934665603ull;
  for (int64_t w : k) h = (h ^ static_cast<uint64_t>(w)) * 1099511628211ull;
  return static_cast<size_t>(h);
}

bool encode(const c10::IValue& v, Key& key) {
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
    key.push_back(std::bit_cast<int64_t>(v.toDouble()));
  } else if (v.isComplexDouble()) {
    const auto c = v.toComplexDouble();
    key.push_back(7);
    key.push_back(std::bit_cast<int64_t>(c.real()));
    key.push_back(std::bit_cast<int64_t>(c.imag()));
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
    for (double x : v.toDoubleList()) key.push_back(std::bit_cast<int64_t>(x));
  } else if (v.isList()) {
    key.push_back(14);
    key.push_back(static_cast<int64_t>(v.toList().size()));
    for (const c10::IValue& e : v.toList()) {
      if (!encode(e, key)) return false;
    }
  } else {
    return false;
  }
  return true;
}

ShapeCache& shape_cache() {
  thread_local ShapeCache cache;
  const int64_t generation = g_cache_generation.load(std::memory_order_relaxed);
  if (cache.generation != generation || cache.entries.size() > 200000) {
    cache.entries.clear();
    cache.generation = generation;
  }
  return cache;
}

void count_shape_lookup(bool hit) { (hit ? g_cache_hits : g_cache_misses).fetch_add(1, std::memory_order_relaxed); }

void invalidate_shape_caches() { g_cache_generation.fetch_add(1); }

std::pair<int64_t, int64_t> shape_cache_stats() { return {g_cache_hits.load(), g_cache_misses.load()}; }

}  // namespace emugpu
