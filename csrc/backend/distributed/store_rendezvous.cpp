#include "backend/distributed/store_rendezvous.h"

#include <thread>

#include "core/clock.h"
#include "core/error.h"

namespace emugpu {

void StoreRendezvous::set(const std::string& key, const std::string& value) {
  store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

std::string StoreRendezvous::get(const std::string& key, std::chrono::nanoseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Polled, not one long store wait, so that Ctrl-C reaches a rank whose peer never comes.
  while (!store_->check({key})) {
    EMUGPU_CHECK(std::chrono::steady_clock::now() < deadline, kRuntime, "the store had no '", key, "' within ",
                 std::chrono::duration<double>(timeout).count(), " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    check_wait_interrupt();
  }
  const std::vector<uint8_t> value = store_->get(key);
  return std::string(value.begin(), value.end());
}

}  // namespace emugpu
