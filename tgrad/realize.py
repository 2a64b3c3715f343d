"""Running a schedule: each ScheduleItem becomes an allocation, a copy, or a compiled kernel launch.

`realize(*lazybuffers)` = create_schedule + run_schedule. A kernel AST is turned into a runner once per process
(Kernel → opts from cache/BEAM/heuristics → linearize → render → compile, binaries cached on disk) and reused for
every later AST with the same key. DEBUG prints what ran (see docs/env.md).
"""
from __future__ import annotations
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional
import numpy as np
from tgrad.ops import UOp, Ops
from tgrad.lazy import LazyBuffer
from tgrad.schedule import ScheduleItem, create_schedule
from tgrad.device import Buffer, Device
from tgrad.codegen.kernel import Kernel, Opt
from tgrad.codegen.linearizer import linearize
from tgrad.helpers import Context, gc_paused, settings_key

@dataclass
class CompiledKernel:
  """A kernel ready to launch: its program, launch sizes, source and cost estimate."""
  name: str
  program: Callable
  global_size: tuple[int, ...]
  local_size: tuple[int, ...]
  src: str
  opts: list[Opt]
  flops: int
  nbytes: int
  def __call__(self, buffers: list[Buffer], wait: bool = False) -> Optional[float]:
    return self.program(*[b.handle for b in buffers], global_size=self.global_size, local_size=self.local_size,
                        wait=wait)

_runner_cache: dict[tuple, CompiledKernel] = {}
_kernel_counter = 0

def choose_opts(kernel: Kernel) -> None:
  """Opts for a kernel: a searched winner if BEAM is on, else the hand-written heuristics (unless NOOPT)."""
  if Context.BEAM:
    from tgrad.codegen.search import beam_search_opts
    for opt in beam_search_opts(kernel, Context.BEAM): kernel.apply_opt(opt)
  elif not Context.NOOPT:
    from tgrad.codegen.heuristics import hand_coded_optimizations
    hand_coded_optimizations(kernel)

def compile_kernel(device: str, kernel: Kernel, name: Optional[str] = None) -> CompiledKernel:
  """Linearize, render, compile (disk-cached) and load one kernel whose opts are already applied. The function is
  always called `kernel.function_name`, so the same kernel has the same source wherever it is compiled (BEAM's
  winner hits the binary cache); `name` only labels the runner in DEBUG output."""
  dev = Device[device]
  name = name or kernel.name
  uops = linearize(kernel)
  src = dev.renderer.render(kernel.function_name, uops)
  if Context.DEBUG >= 5:
    for i, u in enumerate(uops): print(f"{i:4d} {u.op.name:14s} {str(u.dtype):18s} {u.arg!r}")
  if Context.DEBUG >= 4: print(src)
  start = time.perf_counter()
  binary = dev.compiler.compile_cached(src)
  compile_ms = (time.perf_counter() - start) * 1e3
  if Context.DEBUG >= 3: print(f"{name}: opts {kernel.applied_opts}, compiled in {compile_ms:.1f} ms")
  global_size, local_size = kernel.launch_dims()
  flops, nbytes = kernel.estimate()
  return CompiledKernel(name, dev.program(kernel.function_name, binary), global_size, local_size, src,
                        list(kernel.applied_opts), flops, nbytes)

def get_runner(device: str, ast: UOp) -> CompiledKernel:
  global _kernel_counter
  key = (device, ast.key, Context.BEAM, settings_key())
  if (runner := _runner_cache.get(key)) is None:
    kernel = Kernel(ast, Device[device].renderer)
    choose_opts(kernel)
    _kernel_counter += 1
    runner = _runner_cache[key] = compile_kernel(device, kernel, f"{kernel.name}_n{_kernel_counter}")
  return runner

class _Totals:
  """Process-wide kernel counts for DEBUG output (seconds are measured only at DEBUG >= 2)."""
  kernels = 0
  seconds = 0.0

def _buffer_for(lb: LazyBuffer) -> Buffer:
  if lb.buffer is None:
    if lb.op is Ops.ASSIGN: lb.buffer = lb.srcs[0].base.buffer
    else: lb.buffer = Buffer(lb.device, lb.size, lb.dtype)
  return lb.buffer

def run_schedule(items: list[ScheduleItem]) -> None:
  for item in items:
    out = item.outputs[0]
    if item.ast.op is Ops.EMPTY: _buffer_for(out)
    elif item.ast.op is Ops.COPY: _run_copy(out)
    else: _run_kernel(item)
    for lb in item.outputs:   # the graph above a realized value is no longer needed
      lb.srcs, lb.arg = (), (lb.arg if lb.op is Ops.REDUCE_AXIS else None)
  if Context.DEBUG >= 1 and items:
    timed = f", {_Totals.seconds*1e3:.2f} ms in kernels" if Context.DEBUG >= 2 else ""
    print(f"realized {len(items)} schedule items; {_Totals.kernels} kernels run so far{timed}")

def _run_copy(out: LazyBuffer) -> None:
  buffer = _buffer_for(out)
  data: Any = out.arg if isinstance(out.arg, np.ndarray) else out.srcs[0].base.buffer.copyout()
  buffer.copyin(np.ascontiguousarray(data).reshape(-1).view(np.uint8))

def _run_kernel(item: ScheduleItem) -> None:
  out = item.outputs[0]
  runner = get_runner(out.device, item.ast)
  buffers = [_buffer_for(out)] + [lb.buffer for lb in item.inputs]
  timing = Context.DEBUG >= 2
  elapsed = runner(buffers, wait=timing)
  _Totals.kernels += 1
  if timing and elapsed is not None:
    _Totals.seconds += elapsed
    gflops = runner.flops / elapsed / 1e9 if elapsed > 0 else 0.0
    gbs = runner.nbytes / elapsed / 1e9 if elapsed > 0 else 0.0
    print(f"*** {out.device:5s} {runner.name:40s} out {str(out.shape):20s} {elapsed*1e6:9.1f} us "
          f"{gflops:8.2f} GFLOP/s {gbs:8.2f} GB/s  opts {len(runner.opts)}")

@gc_paused()
def realize(*lbs: LazyBuffer) -> None:
  """Compute the given lazy values into device buffers (afterwards `lb.base.buffer` holds each)."""
  run_schedule(create_schedule(list(lbs)))
