// Waiting without the GIL: a collective's deferred calls run Python (TCP
// exchanges, error reports) on the group's runner thread, so a thread that
// waits for them must not hold it.
#pragma once

#include <torch/csrc/utils/pybind.h>

namespace emugpu {

// Runs `fn` without the GIL where this thread holds it.
template <typename Fn>
auto without_gil(Fn&& fn) -> decltype(fn()) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release no_gil;
    return fn();
  }
  return fn();
}

}  // namespace emugpu
