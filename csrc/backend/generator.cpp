#include "backend/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>

#include <cstring>
#include <deque>
#include <mutex>

#include "backend/runtime.h"

namespace emugpu {

namespace {

constexpr c10::DeviceType kEmuType = c10::DeviceType::PrivateUse1;

EmuGeneratorImpl* emu_generator(const at::Generator& g) {
  TORCH_CHECK(g.defined() && g.device().type() == kEmuType, "Expected a 'emugpu' device type for generator but found '",
              g.device().type(), "'; create it with torch.Generator(device='emugpu')");
  return static_cast<EmuGeneratorImpl*>(g.unsafeGetGeneratorImpl());
}

// The numel and dtype that size a kernel's grid: the first tensor it fills.
int64_t numel_of(const std::vector<at::Tensor>& written) { return written.empty() ? 0 : written[0].numel(); }

int unroll_of(const std::vector<at::Tensor>& written) {
  return !written.empty() && written[0].element_size() == 8 ? 2 : 4;
}

int arg_index(const c10::OperatorHandle& op, const char* name) {
  const auto& args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name() == name) return static_cast<int>(i);
  }
  return -1;
}

// Random ops without a generator argument, which use the device's default
// generator on CUDA: (whether it draws, how far it advances the offset).
std::optional<uint64_t> default_generator_increment(const c10::OperatorHandle& op, const std::vector<c10::IValue>& args,
                                                    const GpuSpec& gpu, const std::vector<at::Tensor>& written) {
  const std::string& name = op.schema().name();
  const int threads = max_threads_per_sm(gpu.major, gpu.minor);
  if (name == "aten::native_dropout") {  // (input, p, train?): eval mode and p = 0 draw nothing on CUDA
    const bool train = args.size() < 3 || args[2].isNone() || args[2].toBool();
    if (!train || args[1].toDouble() == 0) return std::nullopt;
    return philox_increment(numel_of(written), 4, gpu.sm_count, threads);
  }
  if (name.rfind("aten::_scaled_dot_product_", 0) == 0 && name.find("backward") == std::string::npos) {
    const int p = arg_index(op, "dropout_p");
    if (p < 0 || args[p].toDouble() == 0 || !args[0].isTensor() || args[0].toTensor().dim() < 2) return std::nullopt;
    const at::Tensor& q = args[0].toTensor();  // (batch, heads, ...): one Philox stream of 32 per head
    return static_cast<uint64_t>(q.size(0) * q.size(1) * 32);
  }
  return std::nullopt;
}

}  // namespace

EmuGeneratorImpl::EmuGeneratorImpl(c10::DeviceIndex index, uint64_t seed)
    : EmuGeneratorImpl(index, std::make_shared<PhiloxState>(PhiloxState{seed, 0})) {}

EmuGeneratorImpl::EmuGeneratorImpl(c10::DeviceIndex index, std::shared_ptr<PhiloxState> state)
    : c10::GeneratorImpl(c10::Device(kEmuType, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      state_(std::move(state)) {}

void EmuGeneratorImpl::set_current_seed(uint64_t seed) { *state_ = PhiloxState{seed, 0}; }

void EmuGeneratorImpl::set_offset(uint64_t offset) {
  TORCH_CHECK(offset % 4 == 0, "offset must be a multiple of 4 (as CUDA's Philox generator), got ", offset);
  state_->offset = offset;
}

uint64_t EmuGeneratorImpl::get_offset() const { return state_->offset; }
uint64_t EmuGeneratorImpl::current_seed() const { return state_->seed; }

uint64_t EmuGeneratorImpl::seed() {
  const uint64_t random = c10::detail::getNonDeterministicRandom(/*is_cuda=*/true);
  set_current_seed(random);
  return random;
}

void EmuGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  at::detail::check_rng_state(new_state);
  const auto size = static_cast<size_t>(new_state.numel());
  *state_ = translate_errors([&] { return decode_philox_state(new_state.data_dtype_initialized<uint8_t>(), size); });
}

c10::intrusive_ptr<c10::TensorImpl> EmuGeneratorImpl::get_state() const {
  at::Tensor out = at::detail::empty_cpu({static_cast<int64_t>(kPhiloxStateBytes)}, c10::ScalarType::Byte, std::nullopt,
                                         std::nullopt, std::nullopt, std::nullopt);
  const auto bytes = encode_philox_state(*state_);
  std::memcpy(out.data_ptr(), bytes.data(), bytes.size());
  return out.getIntrusivePtr();
}

void EmuGeneratorImpl::graphsafe_set_state(const c10::intrusive_ptr<c10::GeneratorImpl>& new_state) {
  auto* other = dynamic_cast<EmuGeneratorImpl*>(new_state.get());
  TORCH_CHECK(other != nullptr, "graphsafe_set_state expected an emugpu generator's state, got one of ",
              new_state->device());
  state_ = other->state_;
}

c10::intrusive_ptr<c10::GeneratorImpl> EmuGeneratorImpl::graphsafe_get_state() const {
  return c10::intrusive_ptr<c10::GeneratorImpl>::reclaim(new EmuGeneratorImpl(device_.index(), state_));
}

PhiloxState EmuGeneratorImpl::reserve(uint64_t increment) {
  const uint64_t start = state_->reserve(increment);
  return PhiloxState{state_->seed, start};
}

EmuGeneratorImpl* EmuGeneratorImpl::clone_impl() const {
  return new EmuGeneratorImpl(device_.index(), std::make_shared<PhiloxState>(*state_));
}

const at::Generator& default_generator(int device) {
  static std::mutex mutex;
  static std::deque<at::Generator> generators;  // stable addresses for the process's lifetime
  const int index = device < 0 ? current_device() : device;
  translate_errors([&] { Runtime::get().device(index); });  // an index past the devices: IndexError
  std::lock_guard<std::mutex> lock(mutex);
  while (static_cast<int>(generators.size()) <= index) {
    generators.push_back(at::make_generator<EmuGeneratorImpl>(static_cast<c10::DeviceIndex>(generators.size())));
  }
  return generators[index];
}

at::Generator new_generator(int device) {
  const int index = device < 0 ? current_device() : device;
  translate_errors([&] { Runtime::get().device(index); });
  return at::make_generator<EmuGeneratorImpl>(static_cast<c10::DeviceIndex>(index));
}

std::optional<RandomDraw> draw_random(const c10::OperatorHandle& op, int generator_arg,
                                      const std::vector<c10::IValue>& args, int device,
                                      const std::vector<at::Tensor>& written) {
  const GpuSpec& gpu = Runtime::get().device(device).gpu();
  uint64_t increment = 0;
  at::Generator gen;
  if (generator_arg >= 0) {
    if (args[generator_arg].isGenerator()) gen = args[generator_arg].toGenerator();
    increment =
        philox_increment(numel_of(written), unroll_of(written), gpu.sm_count, max_threads_per_sm(gpu.major, gpu.minor));
  } else {
    const auto inc = default_generator_increment(op, args, gpu, written);
    if (!inc) return std::nullopt;
    increment = *inc;
  }
  if (!gen.defined()) gen = default_generator(device);
  EmuGeneratorImpl* impl = emu_generator(gen);
  std::lock_guard<std::mutex> lock(impl->mutex_);
  const PhiloxState start = impl->reserve(increment);
  return RandomDraw{start.seed, start.offset};
}

HostRandomScope::HostRandomScope(const std::optional<RandomDraw>& draw, int generator_arg,
                                 torch::jit::Stack& host_args) {
  if (generator_arg >= 0) host_args[generator_arg] = c10::IValue();  // the host's default unless drawn below
  if (!draw) return;
  const uint64_t seed = host_seed_for(draw->seed, draw->offset);
  if (generator_arg >= 0) {
    host_args[generator_arg] = at::make_generator<at::CPUGeneratorImpl>(seed);
    return;
  }
  // Not thread-safe against other host threads drawing at this moment, as
  // no kernel without a generator argument can be handed one.
  at::Generator host = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(host.mutex());
  saved_ = host.clone();
  host.set_current_seed(seed);
}

HostRandomScope::~HostRandomScope() {
  if (!saved_) return;
  at::Generator host = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(host.mutex());
  host.set_state(saved_->get_state());
}

}  // namespace emugpu
