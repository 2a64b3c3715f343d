"""Run a rendered CUDA kernel on the CPU, without a GPU: a test helper for what only a GPU could otherwise check (the
values of kernels with thread blocks, shared memory and barriers: GROUP combines, guarded LOCAL and GROUP splits).

The CUDA C source is compiled as C++20 by g++ with a small header that stands in for the CUDA built-ins: each thread
of a block is an OS thread (threadIdx is thread-local), `__shared__` arrays are static (one copy, and the blocks run
one after another), `__syncthreads()` is a std::barrier of the block's threads, float2/float4 are plain structs. Only
float32 kernels without inline PTX qualify: render them for sm_75 (no max.NaN asm, no tensor cores, no cp.async).
`run_on_cpu(source, name, global_size, local_size, buffers, variables)` launches it once; the buffers are numpy
arrays, written in place.
"""
from __future__ import annotations
import ctypes, hashlib, os, re, shutil, subprocess, tempfile
import numpy as np

CPU_ARCH = "sm_75"   # the arch to render for: its kernels use no inline PTX for float32
COMPILER = shutil.which("g++")

HEADER = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
using std::sqrt; using std::exp2; using std::log2; using std::sin;
struct Dim3 { unsigned int x = 0, y = 0, z = 0; };
static thread_local Dim3 threadIdx, blockIdx;
static std::barrier<>* block_barrier = nullptr;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __syncthreads() block_barrier->arrive_and_wait()
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long u) { double f; std::memcpy(&f, &u, 8); return f; }
"""

LAUNCHER = r"""
extern "C" void launch(void** buffers, long long* variables, const unsigned int* grid, const unsigned int* block) {
  unsigned int threads = block[0] * block[1] * block[2];
  std::barrier<> barrier(threads);
  block_barrier = &barrier;
  std::vector<std::thread> pool;
  for (unsigned int t = 0; t < threads; t++) pool.emplace_back([=, &barrier] {
    threadIdx = {t % block[0], (t / block[0]) % block[1], t / (block[0] * block[1])};
    for (unsigned int z = 0; z < grid[2]; z++) for (unsigned int y = 0; y < grid[1]; y++)
      for (unsigned int x = 0; x < grid[0]; x++) {
        blockIdx = {x, y, z};
        CALL;
        barrier.arrive_and_wait();   // the next block reuses the static shared arrays
      }
  });
  for (auto& thread : pool) thread.join();
}
"""

def cpu_available() -> bool: return COMPILER is not None

def _parameters(source: str, name: str) -> list[str]:
  """The C types of the kernel's parameters, in order."""
  match = re.search(rf"\b{re.escape(name)}\((.*?)\)\s*{{", source)
  assert match is not None, f"kernel {name} not found in the source"
  return [" ".join(p.split()[:-1]) for p in match.group(1).split(",")]

_loaded: dict[str, ctypes.CDLL] = {}

def _compile(source: str, name: str) -> ctypes.CDLL:
  call_args = []
  buffer_count = variable_count = 0
  for ctype in _parameters(source, name):
    if "*" in ctype:
      call_args.append(f"({ctype.replace('__restrict__', '').strip()})buffers[{buffer_count}]")
      buffer_count += 1
    else:
      call_args.append(f"variables[{variable_count}]")
      variable_count += 1
  program = HEADER + source + LAUNCHER.replace("CALL", f"{name}({', '.join(call_args)})")
  key = hashlib.sha256(program.encode()).hexdigest()[:24]
  if key in _loaded: return _loaded[key]
  folder = tempfile.mkdtemp(prefix="tgrad-cuda-on-cpu-")
  source_path, library = os.path.join(folder, "kernel.cpp"), os.path.join(folder, "kernel.so")
  with open(source_path, "w") as f: f.write(program)
  subprocess.run([COMPILER, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", source_path, "-o", library],
                 check=True, capture_output=True, text=True)
  _loaded[key] = ctypes.CDLL(library)
  return _loaded[key]

def run_on_cpu(source: str, name: str, global_size: tuple[int, ...], local_size: tuple[int, ...],
               buffers: list[np.ndarray], variables: list[int]) -> None:
  """Launch the kernel `name` of `source` once over a grid of `global_size` blocks of `local_size` threads (x first),
  on numpy buffers (parameter order; outputs are written in place) and the variables' values (name order)."""
  library = _compile(source, name)
  grid = (ctypes.c_uint * 3)(*(tuple(global_size) + (1,) * (3 - len(global_size))))
  block = (ctypes.c_uint * 3)(*(tuple(local_size) + (1,) * (3 - len(local_size))))
  pointers = (ctypes.c_void_p * max(1, len(buffers)))(*[b.ctypes.data for b in buffers])
  values = (ctypes.c_longlong * max(1, len(variables)))(*variables)
  library.launch(pointers, values, grid, block)
