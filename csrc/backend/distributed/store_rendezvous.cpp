#include "backend/distributed/store_rendezvous.h"

#include "core/error.h"

namespace emugpu {

void StoreRendezvous::set(const std::string& key, const std::string& value) {
  store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string StoreRendezvous::get(const std::string& key, std::chrono::nanoseconds timeout) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  try {
    store_->wait({key}, std::max(ms, std::chrono::milliseconds(1)));
  } catch (const std::exception& e) {
    EMUGPU_CHECK(false, kRuntime, "the store had no '", key, "' within ", static_cast<double>(ms.count()) / 1e3, " s (",
                 e.what(), ")");
  }
  const std::vector<uint8_t> value = store_->get(key);
  return std::string(value.begin(), value.end());
}

}  // namespace emugpu
