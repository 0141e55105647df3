// The core's Rendezvous over c10d's Store: how a process group's TCP
// transport finds its peers through the store the user's rendezvous made
// (torchrun's TCPStore, a FileStore, ...), under the group's own prefix.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "core/exchange/transport.h"

namespace emugpu {

class StoreRendezvous : public Rendezvous {
 public:
  explicit StoreRendezvous(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::nanoseconds timeout) override;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace emugpu
