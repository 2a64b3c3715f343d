"""Device runtimes, one package per device. Importing this imports every package here, and each registers its
Backend (tgrad/backend.py) without loading its runtime: `<device>/runtime.py` (allocator, program, `create_device()`)
and `<device>/renderer.py` load when the device starts.
"""
import importlib, pkgutil

for _package in pkgutil.iter_modules(__path__):
  if _package.ispkg: importlib.import_module(f"{__name__}.{_package.name}")
