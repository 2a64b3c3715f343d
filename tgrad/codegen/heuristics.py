"""Hand-coded default optimizations: readable rules, each constant named with where it comes from.

`hand_coded_optimizations(kernel)` applies Opts in place; every rule tries its Opt and moves on if the kernel
refuses it (KernelOptError), so a rule never makes a kernel illegal. CPU (LLVM) rules: a register tile for
reductions that reuse loads across two output axes (matmul-like), then THREAD across cores for big kernels.
GPU rules live in `_gpu_rules`.
"""
from __future__ import annotations
import os
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.ops import Ops
from tgrad.helpers import Context, prod

# CPU: an AVX-512 register holds 16 float32; an 8×16 tile of accumulators uses 8 of the 32 vector registers and
# reuses each loaded B vector 8 times (measured on Zen 5, 1024² matmul: 4×16 → 64, 8×16 → 126 GFLOP/s per core).
CPU_TILE_COLUMNS = 16
CPU_TILE_ROWS = 8
# Waking the thread pool costs ~20-50 µs; below this many loop iterations one core is faster.
CPU_THREAD_MIN_WORK = 1 << 17

def cpu_core_count() -> int: return Context.THREADS or os.cpu_count() or 1

def try_opt(kernel: Kernel, opt: Opt) -> bool:
  try:
    kernel.apply_opt(opt)
    return True
  except KernelOptError:
    return False

def _load_strides(kernel: Kernel, axis: int) -> list:
  """Each LOAD's memory stride along `axis` (None where it is not one constant)."""
  return [st.real_strides()[axis] for u, st in zip(kernel.memops, kernel.sts) if u.op is Ops.LOAD]

def _register_tile(kernel: Kernel) -> None:
  """Upcast two output axes along which some input is reused (stride 0): the vector axis is contiguous in one
  input; the rows axis replicates the other input's loads."""
  if not kernel.reduceops: return
  candidates = [a for a in range(kernel.global_dims) if 0 in _load_strides(kernel, a)]
  vector_axis = next((a for a in candidates if 1 in _load_strides(kernel, a)
                      and kernel.full_shape[a] % CPU_TILE_COLUMNS == 0), None)
  if vector_axis is None: return
  if not try_opt(kernel, Opt(OptOps.UPCAST, vector_axis, CPU_TILE_COLUMNS)): return
  rows_axis = next((a for a in candidates if a != vector_axis and kernel.full_shape[a] % CPU_TILE_ROWS == 0), None)
  if rows_axis is not None: try_opt(kernel, Opt(OptOps.UPCAST, rows_axis, CPU_TILE_ROWS))

def _threads(kernel: Kernel) -> None:
  """Split the outermost output axis across the cores when there is enough work."""
  cores = cpu_core_count()
  if cores <= 1 or kernel.global_dims == 0 or prod(kernel.full_shape) < CPU_THREAD_MIN_WORK: return
  size = kernel.full_shape[0]
  for threads in range(cores, 1, -1):
    if size % threads == 0 and try_opt(kernel, Opt(OptOps.THREAD, 0, threads)): return

def _cpu_rules(kernel: Kernel) -> None:
  _register_tile(kernel)
  _threads(kernel)

def _gpu_rules(kernel: Kernel) -> None:
  """GPU defaults (filled in by the CUDA backend work)."""

def hand_coded_optimizations(kernel: Kernel) -> None:
  if kernel.renderer.has_local: _gpu_rules(kernel)
  elif kernel.renderer.has_threads: _cpu_rules(kernel)
