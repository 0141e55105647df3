"""The emulated GPUs as PyTorch sees them: `torch.emugpu` (device_module.py,
registered by the package's __init__ when the extension loads), its memory
statistics, and the hooks that make modules, tensors and processes behave on
emugpu as on CUDA."""
