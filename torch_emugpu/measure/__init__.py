"""Measuring tools: profiles, the preprocessing table and the calibration sweep
measured on a real GPU, and importers of other profile databases.

They run on a CUDA machine with plain PyTorch and torchvision, without the
compiled extension (benchmarks/measure_on_gpu.sh), so they import nothing from
the package outside this folder (test/python/test_package_layout.py checks).
"""
