"""NVRTC through ctypes: CUDA C source (str) → a cubin (bytes) for one GPU architecture, in-process and without nvcc.

`find_nvrtc()` locates libnvrtc (CUDA_PATH/CUDA_HOME, /usr/local/cuda, the `nvidia-cuda-nvrtc` pip wheels, the
loader's search path); `compile_cuda(src, arch)` returns the cubin or raises CompileError with the numbered source and
NVRTC's log. Kernels need no headers: the CUDA renderer writes its own half/bfloat16 helpers (the pip wheel ships none).
`NVRTCCompiler` is the device contract's Compiler, its cache key naming NVRTC's version, the arch and the flags.
"""
from __future__ import annotations
import ctypes, ctypes.util, functools, glob, os
from typing import Optional
from tgrad.device import Compiler, CompileError

# libnvrtc sonames the CUDA 13 and 12 toolkits install; any other version is found by directory search
NVRTC_SONAMES = ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")
# where pip's NVIDIA wheels put the library under site-packages/nvidia: CUDA 12 wheels, then CUDA 13 wheels
PIP_WHEEL_LIB_DIRS = ("cuda_nvrtc/lib", "cu13/lib")
# -default-device: every function is __device__ unless marked; kernels use C++17 (constexpr if, inline variables)
BASE_FLAGS = ("-default-device", "--std=c++17")
NVRTC_SUCCESS = 0

class NVRTCNotFound(RuntimeError):
  """No libnvrtc could be loaded from any of the searched places."""

def _candidate_paths() -> list[str]:
  dirs: list[str] = []
  for var in ("CUDA_PATH", "CUDA_HOME"):
    if (root := os.environ.get(var)): dirs += [os.path.join(root, "lib64"), os.path.join(root, "lib")]
  dirs += ["/usr/local/cuda/lib64", "/usr/local/cuda/lib"]
  try:
    import nvidia   # the namespace package of pip's NVIDIA wheels
    for root in nvidia.__path__: dirs += [os.path.join(root, sub) for sub in PIP_WHEEL_LIB_DIRS]
  except ImportError: pass
  paths = []
  for d in dirs:
    # libnvrtc.so, libnvrtc.so.13, libnvrtc.so.12.4.127 — never libnvrtc-builtins, which NVRTC loads itself
    found = sorted(glob.glob(os.path.join(d, "libnvrtc.so*")), key=len)
    paths += found
  return paths + list(NVRTC_SONAMES) + [n for n in [ctypes.util.find_library("nvrtc")] if n]

@functools.cache
def find_nvrtc() -> ctypes.CDLL:
  """The first libnvrtc that loads, searched in the order the module docstring gives; raises NVRTCNotFound."""
  tried = []
  for path in _candidate_paths():
    try: lib = ctypes.CDLL(path)
    except OSError as e:
      tried.append(f"{path}: {e}")
      continue
    _declare(lib)
    return lib
  raise NVRTCNotFound("libnvrtc not found; install it with `pip install nvidia-cuda-nvrtc` or set CUDA_PATH. "
                      f"Tried: {'; '.join(tried) or 'nothing'}")

def nvrtc_available() -> bool:
  try:
    find_nvrtc()
    return True
  except NVRTCNotFound:
    return False

def _declare(lib: ctypes.CDLL) -> None:
  P, S, I = ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.c_int
  signatures = {
    "nvrtcVersion": [ctypes.POINTER(I), ctypes.POINTER(I)],
    "nvrtcCreateProgram": [ctypes.POINTER(P), ctypes.c_char_p, ctypes.c_char_p, I, P, P],
    "nvrtcCompileProgram": [P, I, ctypes.POINTER(ctypes.c_char_p)],
    "nvrtcGetProgramLogSize": [P, S], "nvrtcGetProgramLog": [P, ctypes.c_char_p],
    "nvrtcGetCUBINSize": [P, S], "nvrtcGetCUBIN": [P, ctypes.c_char_p],
    "nvrtcGetPTXSize": [P, S], "nvrtcGetPTX": [P, ctypes.c_char_p],
    "nvrtcDestroyProgram": [ctypes.POINTER(P)],
  }
  for name, argtypes in signatures.items():
    fn = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, I
  lib.nvrtcGetErrorString.argtypes, lib.nvrtcGetErrorString.restype = [I], ctypes.c_char_p

@functools.cache
def nvrtc_version() -> tuple[int, int]:
  lib = find_nvrtc()
  major, minor = ctypes.c_int(), ctypes.c_int()
  _check(lib, lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
  return major.value, minor.value

def _check(lib: ctypes.CDLL, status: int, what: str) -> None:
  if status != NVRTC_SUCCESS:
    raise RuntimeError(f"{what} failed: {lib.nvrtcGetErrorString(status).decode()} (status {status})")

def _read(lib: ctypes.CDLL, program: ctypes.c_void_p, size_fn: str, data_fn: str) -> bytes:
  size = ctypes.c_size_t()
  _check(lib, getattr(lib, size_fn)(program, ctypes.byref(size)), size_fn)
  out = ctypes.create_string_buffer(size.value)
  _check(lib, getattr(lib, data_fn)(program, out), data_fn)
  return out.raw[:size.value]

def numbered(src: str) -> str: return "\n".join(f"{i:4d} | {line}" for i, line in enumerate(src.splitlines(), 1))

def compile_cuda(src: str, arch: str = "sm_90", flags: tuple[str, ...] = (), ptx: bool = False) -> bytes:
  """CUDA C → a cubin for `arch` (or PTX text if ptx=True). Raises CompileError with the numbered source and log."""
  lib = find_nvrtc()
  program = ctypes.c_void_p()
  _check(lib, lib.nvrtcCreateProgram(ctypes.byref(program), src.encode(), b"kernel.cu", 0, None, None),
         "nvrtcCreateProgram")
  try:
    options = [f"--gpu-architecture={arch}", *BASE_FLAGS, *flags]
    encoded = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    status = lib.nvrtcCompileProgram(program, len(options), encoded)
    if status != NVRTC_SUCCESS:
      log = _read(lib, program, "nvrtcGetProgramLogSize", "nvrtcGetProgramLog").decode(errors="replace").rstrip("\0")
      raise CompileError(f"NVRTC failed for {arch} with {lib.nvrtcGetErrorString(status).decode()} "
                         f"(options {options}):\n{numbered(src)}\n--- log ---\n{log}")
    if ptx: return _read(lib, program, "nvrtcGetPTXSize", "nvrtcGetPTX").rstrip(b"\0")
    return _read(lib, program, "nvrtcGetCUBINSize", "nvrtcGetCUBIN")
  finally:
    lib.nvrtcDestroyProgram(ctypes.byref(program))

class NVRTCCompiler(Compiler):
  """CUDA C → cubin for one architecture; binaries are cached on disk under `cache_key` (see Compiler)."""
  def __init__(self, arch: str = "sm_90", flags: tuple[str, ...] = ()):
    self.arch, self.flags = arch, tuple(flags)
    major, minor = nvrtc_version()
    self.cache_key = f"nvrtc-{major}.{minor}-{arch}-{' '.join(BASE_FLAGS + self.flags)}"
  def compile(self, src: str) -> bytes: return compile_cuda(src, self.arch, self.flags)

def arch_of(compute_capability: tuple[int, int]) -> str: return f"sm_{compute_capability[0]}{compute_capability[1]}"

def supported_archs() -> Optional[list[str]]:
  """The sm_XX targets this NVRTC can compile for, or None if it cannot say (older than CUDA 11.2)."""
  lib = find_nvrtc()
  if not hasattr(lib, "nvrtcGetNumSupportedArchs"): return None
  count = ctypes.c_int()
  _check(lib, lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
  archs = (ctypes.c_int * count.value)()
  _check(lib, lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
  return [f"sm_{a}" for a in archs]
