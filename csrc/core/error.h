// One exception type for the whole core; the torch layer maps `kind` onto
// PyTorch's exception classes.
#pragma once

#include <cstddef>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

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

// `text` as valid UTF-8: each byte that does not belong to a well-formed
// sequence becomes the four characters \xNN. Messages reach Python, which
// refuses invalid UTF-8 (and would then raise an error naming nothing).
inline std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
    if (n > 1) {
      bool ok = i + n <= text.size() && b != 0xC0 && b != 0xC1 && b <= 0xF4;
      for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xC0) == 0x80;
      if (ok && n >= 3) {  // no overlong forms, surrogates or code points past U+10FFFF
        const auto b1 = static_cast<unsigned char>(text[i + 1]);
        ok = !(b == 0xE0 && b1 < 0xA0) && !(b == 0xED && b1 >= 0xA0) && !(b == 0xF0 && b1 < 0x90) &&
             !(b == 0xF4 && b1 >= 0x90);
      }
      if (!ok) n = 0;
    }
    if (n == 0) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 0xF];
      i += 1;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

// What an error message echoes of a string the user gave (a name, a value, a
// path): at most kEchoLimit bytes of it, cut at a character boundary, then
// "... (N bytes)" when it is longer; valid UTF-8 either way. A 100 kB GPU
// name must not come back whole in the message.
constexpr size_t kEchoLimit = 80;
inline std::string echo_input(std::string_view text) {
  if (text.size() <= kEchoLimit) return valid_utf8(text);
  size_t n = kEchoLimit;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return valid_utf8(text.substr(0, n)) + "... (" + std::to_string(text.size()) + " bytes)";
}

namespace detail {
template <typename... Args>
[[noreturn]] void throw_error(ErrorKind kind, const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  throw Error(kind, valid_utf8(out.str()));  // echoed file content or paths may hold any bytes
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
