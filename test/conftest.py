"""Test-wide setup: a private kernel cache per test session, skipping of GPU tests on machines without one, and the
`compare_with_torch` fixture (values and gradients against torch).

Tests marked `gpu` run only when pycuda imports and a CUDA context opens on device 0. TGRAD_CACHE and
TGRAD_CACHE_SECRET point into pytest's temporary directory (one per xdist worker), so no test reads or writes
~/.cache/tgrad, the user's TGRAD_CACHE or the user's cache secret.
"""
import functools, os, shutil, sys, tempfile
import pytest

sys.path.insert(0, os.path.dirname(__file__))   # test helper modules (torch_compare) import by name

_saved_env: dict[str, str | None] = {}
_collection_cache_dir = ""

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

def pytest_configure(config):
  # code that runs while test modules are imported (before any fixture) gets a throwaway cache too
  global _collection_cache_dir
  _collection_cache_dir = tempfile.mkdtemp(prefix="tgrad-collect-")
  for name, file in (("TGRAD_CACHE", "cache.db"), ("TGRAD_CACHE_SECRET", "cache-secret")):
    _saved_env[name] = os.environ.get(name)
    os.environ[name] = os.path.join(_collection_cache_dir, file)

def pytest_unconfigure(config):
  for name in ("TGRAD_CACHE", "TGRAD_CACHE_SECRET"):
    if (saved := _saved_env.pop(name, None)) is None: os.environ.pop(name, None)
    else: os.environ[name] = saved
  if _collection_cache_dir: shutil.rmtree(_collection_cache_dir, ignore_errors=True)

def pytest_collection_modifyitems(config, items):
  gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
  if not gpu_items or cuda_usable(): return
  skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU with pycuda")
  for item in gpu_items: item.add_marker(skip_gpu)

@pytest.fixture(scope="session", autouse=True)
def private_kernel_cache(tmp_path_factory):
  with pytest.MonkeyPatch.context() as patch:
    folder = tmp_path_factory.mktemp("kernel_cache")
    patch.setenv("TGRAD_CACHE", str(folder / "cache.db"))
    patch.setenv("TGRAD_CACHE_SECRET", str(folder / "cache-secret"))   # the HMAC secret, never the user's own
    yield

# ---- opt-in (TGRAD_CUDA_CODEGEN_CHECK=1): every kernel the suite schedules is also compiled for CUDA, without a GPU

@pytest.fixture(scope="session", autouse=True)
def cuda_codegen_check():
  """Wrap tgrad.realize.get_runner so each new kernel AST is also optimized with the GPU heuristics, rendered by
  CUDARenderer and compiled by NVRTC for sm_90; a render or compile error fails the test that scheduled the kernel."""
  if os.environ.get("TGRAD_CUDA_CODEGEN_CHECK", "") != "1":
    yield
    return
  import tgrad.realize
  from cuda_codegen_check import checking_cuda
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(tgrad.realize, "get_runner", checking_cuda(tgrad.realize.get_runner, "cuda_codegen_check"))
    yield

# ---- comparing against torch (test/torch_compare.py, shared with test_ops.py)

@pytest.fixture
def host_library(monkeypatch) -> list:
  """The LLVM backend given a collectives library (collective_library.HostLibrary), as CUDA's has NCCL's: lowering
  picks LibraryCollective runners over it. The list receives each library made (one per device set and step)."""
  import dataclasses
  import tgrad.realize as realize_module
  from tgrad.backend import backend
  from collective_library import HostLibrary
  made: list = []
  def with_library(name):
    found = backend(name)
    return dataclasses.replace(found, collectives=lambda devices: made.append(HostLibrary(devices)) or made[-1]) \
      if found.name == "LLVM" else found
  monkeypatch.setattr(realize_module, "backend", with_library)
  return made

@pytest.fixture
def two_gpus() -> tuple[str, str]:
  """The names of two GPUs of this host ("CUDA", "CUDA:1"); the test is skipped where the driver sees fewer."""
  from tgrad.runtime.cuda.runtime import device_count
  if device_count() < 2: pytest.skip(f"needs 2 GPUs, the driver sees {device_count()}")
  return ("CUDA", "CUDA:1")

@pytest.fixture
def compare_with_torch():
  """`torch_compare.compare_with_torch`, for tests that check values and gradients against torch (CPU)."""
  from torch_compare import compare_with_torch as compare   # imported on use: most tests never need torch
  return compare

@pytest.fixture(autouse=True)
def _seeded_random_numbers():
  """Every test starts from the same tgrad random seed (the default seed is the clock): failures reproduce."""
  from tgrad import Tensor
  Tensor.manual_seed(0)
