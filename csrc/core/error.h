// One exception type for the whole core; the torch layer maps `kind` onto
// PyTorch's exception classes.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace emugpu {

enum class ErrorKind {
  kValue,           // bad argument or configuration -> ValueError
  kIndex,           // index out of range -> IndexError
  kOutOfMemory,     // emulated device memory exhausted -> torch.OutOfMemoryError
  kNotImplemented,  // no rule for this op/feature -> NotImplementedError
  kRuntime,         // anything else -> RuntimeError
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <typename... Args>
[[noreturn]] void throw_error(ErrorKind kind, const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  throw Error(kind, out.str());
}
}  // namespace detail

}  // namespace emugpu

// The single way the core reports failure; checked in release builds too.
#define EMUGPU_CHECK(cond, kind, ...)                                        \
  do {                                                                       \
    if (!(cond)) {                                                           \
      ::emugpu::detail::throw_error(::emugpu::ErrorKind::kind, __VA_ARGS__); \
    }                                                                        \
  } while (0)
