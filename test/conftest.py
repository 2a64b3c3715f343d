"""Test-wide setup: a private kernel cache per test session, and skipping of GPU tests on machines without one.

Tests marked `gpu` run only when pycuda imports and a CUDA context opens on device 0. TGRAD_CACHE points into pytest's
temporary directory (one per xdist worker), so no test reads or writes ~/.cache/tgrad.
"""
import functools
import pytest

@functools.cache
def cuda_usable() -> bool:
  try:
    import pycuda.driver as cuda
    cuda.init()
    context = cuda.Device(0).make_context()
    context.pop()
    context.detach()
    return True
  except Exception:  # no pycuda, no driver, no device: every way of failing means the same thing here
    return False

def pytest_collection_modifyitems(config, items):
  gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
  if not gpu_items or cuda_usable(): return
  skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU with pycuda")
  for item in gpu_items: item.add_marker(skip_gpu)

@pytest.fixture(scope="session", autouse=True)
def private_kernel_cache(tmp_path_factory):
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("TGRAD_CACHE", str(tmp_path_factory.mktemp("kernel_cache") / "cache.db"))
    yield
