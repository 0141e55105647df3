"""The package's version, the one place it is written.

A module of its own with a plain literal so that setuptools reads it statically
([tool.setuptools.dynamic] in pyproject.toml) without importing torch or _C.
"""

__version__ = "0.1.0"
