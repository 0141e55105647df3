"""`torch.backends` entry point of torch-emugpu, kept apart from the package so
that deciding whether to load costs nothing when the answer is no."""

import os


def autoload() -> None:
    """Runs at `import torch`: loads torch_emugpu unless the machine has a real
    CUDA GPU (then only with EMUGPU_AUTOLOAD=1); EMUGPU_AUTOLOAD=0 turns it off.
    Run mode (EMUGPU_AS_CUDA=1, `torch-emugpu run`) always loads it: that
    variable is how torchrun workers, spawned processes and DataLoader workers
    inherit the mode. An explicit `import torch_emugpu` always works, except
    beside another torch than the one it was built against: autoload then
    only warns (outside run mode), the explicit import raises."""
    flag = os.environ.get("EMUGPU_AUTOLOAD", "").strip()
    run_mode = os.environ.get("EMUGPU_AS_CUDA", "").strip().lower() in ("1", "true", "yes", "on")
    if flag == "0" and not run_mode:
        return
    if flag != "1" and not run_mode:
        import torch

        if torch.cuda.is_available():
            return
    try:
        import torch_emugpu  # noqa: F401
    except ImportError as e:
        # Built against another torch: say so, but leave `import torch` working, unless run mode asked
        # for the emulated GPUs (torch then stops, naming this backend, with the error as its cause).
        if type(e).__name__ != "TorchMismatchError" or run_mode:
            raise
        import warnings

        warnings.warn(f"{e} The emugpu device is not available.", RuntimeWarning, stacklevel=2)
