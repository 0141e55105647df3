// emugpu's random-number generators: CUDA's Philox state (a seed and a
// counter offset, 16 bytes in get_rng_state) so that DTensor's random ops
// and checkpointed RNG states see what they see on CUDA. Values are drawn on
// the host from a generator seeded by (seed, offset): the same state gives
// the same values, as on a GPU, though not the same values as CUDA's Philox.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <optional>
#include <vector>

#include "core/philox.h"

namespace emugpu {

class EmuGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit EmuGeneratorImpl(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;
  // Generators that share one state (as CUDA's graph-safe states do).
  void graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& new_state) override;
  c10::intrusive_ptr<c10::GeneratorImpl> graphsafe_get_state() const override;

  // Reserves one random kernel's offsets; returns the state it runs from.
  PhiloxState reserve(uint64_t increment);

 private:
  EmuGeneratorImpl(c10::DeviceIndex index, std::shared_ptr<PhiloxState> state);
  EmuGeneratorImpl* clone_impl() const override;

  std::shared_ptr<PhiloxState> state_;
};

// The per-device default generators (hooks.cpp hands them to PyTorch).
const at::Generator& default_generator(int device);
at::Generator new_generator(int device);

// What a random op draws: the state its kernel starts from, or nothing for
// an op that draws no random numbers (dropout with p = 0, eval mode).
struct RandomDraw {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// For an op with a generator argument (or one that uses the default
// generator: dropout, attention with dropout): advances its generator as
// CUDA's kernel would for `written` (the tensors it fills) on `device`.
std::optional<RandomDraw> draw_random(const c10::OperatorHandle& op, int generator_arg,
                                      const std::vector<c10::IValue>& args, int device,
                                      const std::vector<at::Tensor>& written);

// The CPU kernel of a random op draws from a host generator seeded by
// `draw`: passed as its generator argument, or else set as the host's
// default generator while the kernel runs (restored after).
class HostRandomScope {
 public:
  HostRandomScope(const std::optional<RandomDraw>& draw, int generator_arg, torch::jit::Stack& host_args);
  ~HostRandomScope();
  HostRandomScope(const HostRandomScope&) = delete;
  HostRandomScope& operator=(const HostRandomScope&) = delete;

 private:
  std::optional<at::Generator> saved_;  // the host default generator's state before
};

}  // namespace emugpu
