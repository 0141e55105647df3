// Pinned host memory for emugpu (see host_allocator.cpp).
#pragma once

#include <c10/core/Allocator.h>

namespace emugpu {

class HostAllocator;

c10::Allocator* pinned_allocator();
// The caching allocator behind pinned_allocator(), for its statistics.
HostAllocator& host_allocator();
bool is_pinned_ptr(const void* ptr);

}  // namespace emugpu
