"""`torch.backends` entry point of torch-emugpu, kept apart from the package so
that deciding whether to load costs nothing when the answer is no."""

import os


def autoload() -> None:
    """Runs at `import torch`: loads torch_emugpu unless the machine has a real
    CUDA GPU (then only with EMUGPU_AUTOLOAD=1); EMUGPU_AUTOLOAD=0 turns it off.
    An explicit `import torch_emugpu` always works."""
    flag = os.environ.get("EMUGPU_AUTOLOAD", "").strip()
    if flag == "0":
        return
    if flag != "1":
        import torch

        if torch.cuda.is_available():
            return
    import torch_emugpu  # noqa: F401
