// What every binding file of torch_emugpu._C shares: errors become the
// matching Python exceptions, and Python callables that C++ threads hold.
#pragma once

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops/common.h"

namespace emugpu {

namespace py = pybind11;

// Runs `fn`, turning core and c10 errors into the matching Python exceptions.
template <typename Fn>
inline auto guarded(Fn&& fn) -> decltype(fn()) {
  torch::PyWarningHandler warnings;  // TORCH_WARN inside becomes a Python warning, as in torch's own bindings
  try {
    return translate_errors(std::forward<Fn>(fn));
  } catch (const py::error_already_set&) {
    warnings.set_in_exception();
    throw;
  } catch (...) {
    warnings.set_in_exception();
    torch::translate_exception_to_python(std::current_exception());
    throw py::error_already_set();
  }
}

// Seconds from Python (a timeout) as nanoseconds, capped so that "forever" fits.
inline std::chrono::nanoseconds seconds_ns(double seconds) {
  return std::chrono::nanoseconds(static_cast<int64_t>(std::min(seconds, 1e9) * 1e9));
}

// A Python callable that C++ threads (the group's runner) hold and drop:
// freed under the GIL, or leaked once the interpreter is finalizing.
inline std::shared_ptr<py::function> shared_py_function(py::function fn) {
  return std::shared_ptr<py::function>(new py::function(std::move(fn)), [](py::function* f) {
    if (Py_IsInitialized() && !_Py_IsFinalizing()) {
      py::gil_scoped_acquire gil;
      delete f;
    }
  });
}

// Calls a Python function from a group's runner thread. Its error becomes
// a c10 error of the matching kind: the runner keeps a call's error and
// rethrows it at every wait, and pybind11's error_already_set can be handed
// back to Python only once.
template <typename... Args>
py::object call_from_runner(const py::function& fn, Args&&... args) {
  py::gil_scoped_acquire gil;
  try {
    return fn(std::forward<Args>(args)...);
  } catch (py::error_already_set& e) {
    const std::string message = py::str(e.value());
    const std::string kind = py::str(py::type::handle_of(e.value()).attr("__name__"));
    if (e.matches(PyExc_ValueError)) C10_THROW_ERROR(ValueError, message);
    if (e.matches(PyExc_TypeError)) C10_THROW_ERROR(TypeError, message);
    if (e.matches(PyExc_NotImplementedError)) C10_THROW_ERROR(NotImplementedError, message);
    if (e.matches(py::module_::import("torch.distributed").attr("DistBackendError").ptr())) {
      C10_THROW_ERROR(DistBackendError, message);
    }
    TORCH_CHECK(false, kind, ": ", message);
  }
}

// The pending_writes() keys of the tensors a runner call touches, and their
// storages, which the call keeps alive while the keys are pending.
inline std::pair<std::vector<c10::Storage>, std::vector<const void*>> storage_keys(const std::vector<at::Tensor>& touches) {
  std::pair<std::vector<c10::Storage>, std::vector<const void*>> out;
  for (const auto& t : touches) {
    if (!t.has_storage()) continue;
    out.first.push_back(t.storage());
    out.second.push_back(t.storage().unsafeGetStorageImpl());
  }
  return out;
}

void bind_distributed(py::module_& m);

}  // namespace emugpu
