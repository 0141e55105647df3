// The torch side of deferred copies (core/deferred_copies.h): a copy between
// emugpu tensors whose source holds real bytes is recorded, not done, and
// done (on the CPU, as exactly as before) when its destination's bytes are
// needed. Every path that reads or writes device bytes goes through these
// helpers (host_alias, the allocator's free, resize and sharing), so a read
// always sees the values the copies in launch order would have produced.
// The host time of the copies done later is the emulator's own: the virtual
// clock charges it to nobody.
#pragma once

#include <ATen/ATen.h>

#include "core/deferred_copies.h"

namespace emugpu {

DeferredCopies& deferred_copies();

// Records `dst` <- `src` (emugpu tensors of the same sizes; `src` holds real
// bytes) to be done when `dst`'s bytes are needed. False when the copy must
// be done now: compute mode, a copy within one storage, memory another
// process may map, or a destination with many pieces already pending.
bool defer_copy(const at::Tensor& dst, const at::Tensor& src);
// `block`'s bytes are about to be read: its pending copies are done.
void bytes_for_read(Block* block);
// `block`'s bytes are about to be written: the copies that read it are done,
// then its own.
void bytes_for_write(Block* block);
// `block`'s bytes stop mattering (a placeholder overwrites it, or it is
// freed): the copies that read it are done, its own dropped. Never throws
// (it runs in a storage's deleter); a failure is reported as a warning.
void bytes_discarded(Block* block) noexcept;

}  // namespace emugpu
