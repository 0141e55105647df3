// What every binding file of torch_emugpu._C shares: errors become the
// matching Python exceptions; one bind_* function per area.
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

// One per area, each in its own file; module.cpp calls them.
void bind_device(py::module_& m);
void bind_memory(py::module_& m);
void bind_regions(py::module_& m);
void bind_cost(py::module_& m);
void bind_distributed(py::module_& m);
void bind_daemon(py::module_& m);

}  // namespace emugpu
