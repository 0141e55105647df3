// One emulated device's memory as a share of an emugpud GPU: the caching
// allocator's segments are taken from the daemon (csrc/core/caching_allocator.h).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "caching_allocator.h"
#include "share/client.h"

namespace emugpu::share {

class DaemonCapacity final : public SharedCapacity {
 public:
  DaemonCapacity(std::shared_ptr<Client> client, uint32_t gpu) : client_(std::move(client)), gpu_(gpu) {}

  bool take(uint64_t bytes, uint64_t& others) override {
    const auto refused = client_->reserve(gpu_, bytes);
    if (!refused) return true;
    others = refused->used - refused->mine;
    return false;
  }
  void give_back(uint64_t bytes) override { client_->release(gpu_, bytes); }

 private:
  std::shared_ptr<Client> client_;
  uint32_t gpu_;
};

}  // namespace emugpu::share
