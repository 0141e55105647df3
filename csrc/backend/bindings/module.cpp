// The module torch_emugpu._C (torch's bundled pybind11): process-wide
// set-up, then each area's bindings (bindings/*.cpp).
#include <sys/syscall.h>
#include <unistd.h>
#include "backend/bindings/common.h"
#include "backend/runtime.h"
#include "core/host_bound.h"

namespace emugpu {

void register_hooks();

namespace {

// Long host waits give Python a chance to run its signal handlers, so that
// Ctrl-C interrupts them as it does CUDA's; the KeyboardInterrupt propagates.
void check_python_signals() {
  // Python runs signal handlers on its main thread only (the process's first
  // thread, whose id is the pid): elsewhere taking the GIL would buy nothing.
  if (!Py_IsInitialized() || syscall(SYS_gettid) != getpid()) return;
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch-emugpu's compiled core: emulated GPU devices for PyTorch";
  register_hooks();  // before any use: pin_memory() may come before the first emugpu tensor
  set_wait_interrupt_check(&check_python_signals);
  // Once per process: a host-bound run's times are this machine's, not the GPU's.
  set_host_bound_handler([](int device, double idle_fraction) {
    if (const TimeNs pace = Runtime::get().device(device).host_pace(); pace > 0) {
      // Asked for: the emulated host is slower than the GPU, as such a machine would be.
      TORCH_WARN_ONCE("emugpu:", device, " is host-bound: the emulated GPU sat idle ",
                      static_cast<int>(idle_fraction * 100), "% of the time waiting for the emulated host ",
                      "(EMUGPU_HOST_OP_US=", static_cast<double>(pace) / 1e3,
                      " per op launched from Python), as it would on a machine with that host.");
      return;
    }
    TORCH_WARN_ONCE("emugpu:", device, " is host-bound: in the last ", HostBoundMonitor::kWindowNs / 1e9,
                    " s or more the emulated GPU sat idle ", static_cast<int>(idle_fraction * 100),
                    "% of the time waiting for this host to launch work, so iteration times now measure this "
                    "machine's host (and the ranks sharing its cores), not the GPU. Give each rank a core, use "
                    "fewer ranks or larger batches; torch_emugpu.host_bound_report() counts such windows.");
  });
  m.attr("DEFAULT_GPU") = kDefaultGpu;
  bind_device(m);
  bind_memory(m);
  bind_regions(m);
  bind_cost(m);
  bind_distributed(m);
  bind_daemon(m);
}

}  // namespace emugpu
