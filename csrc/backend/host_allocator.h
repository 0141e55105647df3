// Pinned host memory for emugpu (see host_allocator.cpp).
#pragma once

#include <c10/core/Allocator.h>

namespace emugpu {

c10::Allocator* pinned_allocator();
bool is_pinned_ptr(const void* ptr);

}  // namespace emugpu
