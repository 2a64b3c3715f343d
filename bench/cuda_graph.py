"""GPU benchmark: launch cost per kernel for N tiny tgrad kernels, eager (one pycuda launch from Python each) against
one CUDA graph of the same N kernels (tgrad/runtime/cuda/graph.py).

The kernel is tgrad's own `x + 1` over TINY_ELEMENTS float32s, chained through two buffers (a → b → a ...), so each
kernel depends on the one before, as in a model's step. Times: GPU span of all N kernels between two CUDA events
(best of REPEATS) divided by N; host seconds per kernel to queue them (eager: the Python loop; graph: launch());
graph build (capture of the CUfunction, nodes, instantiate, upload) and update() of every node's pointers.
Usage: python bench/cuda_graph.py [N ...]
"""
from __future__ import annotations
import os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import pycuda.driver as cuda  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.lazy import LazyBuffer  # noqa: E402
from tgrad.device import Buffer  # noqa: E402
from tgrad.dtype import dtypes  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402
from tgrad.realize import get_runner, run_schedule  # noqa: E402
from tgrad.runtime.cuda.graph import CUDAGraph, KernelLaunch  # noqa: E402

REPEATS = 20
TINY_ELEMENTS = 256   # one block: the kernel's own time is far below its launch cost
COUNTS = (10, 100, 500, 2000, 5000)

def tiny_kernel():
  """tgrad's compiled `x + 1` kernel (its CompiledKernel), from the schedule of a small LazyBuffer graph."""
  x = LazyBuffer.from_host(np.zeros(TINY_ELEMENTS, np.float32), "CUDA")
  out = x.alu(Ops.ADD, x.const(1.0))
  items = create_schedule([out], commit=True)
  run_schedule(items)
  (kernel,) = [item for item in items if item.ast.op is Ops.SINK]
  return get_runner("CUDA", kernel.ast)

def gpu_seconds(queue) -> float:
  """Best GPU time (seconds) between events recorded before and after queue() on the default stream."""
  start, end = cuda.Event(), cuda.Event()
  best = float("inf")
  for _ in range(REPEATS):
    start.record()
    queue()
    end.record()
    end.synchronize()
    best = min(best, end.time_since(start) * 1e-3)
  return best

def host_seconds(queue) -> float:
  best = float("inf")
  for _ in range(REPEATS):
    cuda.Context.synchronize()
    begin = time.perf_counter()
    queue()
    best = min(best, time.perf_counter() - begin)
  cuda.Context.synchronize()
  return best

def main(counts: tuple[int, ...]) -> None:
  runner = tiny_kernel()
  a, b = (Buffer("CUDA", TINY_ELEMENTS, dtypes.float32).copyin(np.zeros(TINY_ELEMENTS, np.float32)) for _ in "ab")
  spare = Buffer("CUDA", TINY_ELEMENTS, dtypes.float32).copyin(np.zeros(TINY_ELEMENTS, np.float32))
  pairs = [(b, a), (a, b)]   # (out, in) for even and odd kernels
  print(f"{TINY_ELEMENTS}-element float32 x+1 kernels ({runner.name}, grid {runner.global_size}, "
        f"block {runner.local_size}); best of {REPEATS}; per kernel, µs")
  print(f"{'N':>6} | {'eager GPU':>9} {'eager host':>10} | {'graph GPU':>9} {'launch()':>9} | "
        f"{'build ms':>8} {'update/node':>11} {'same':>9}")
  for n in counts:
    def eager() -> None:
      for i in range(n): runner([*pairs[i % 2]])
    launches = [KernelLaunch.for_program(runner.program, [int(o.handle), int(i.handle)], runner.global_size,
                                         runner.local_size) for o, i in (pairs[k % 2] for k in range(n))]
    begin = time.perf_counter()
    graph = CUDAGraph(launches)
    build = time.perf_counter() - begin
    graph.launch()
    cuda.Context.synchronize()
    eager_gpu, eager_host = gpu_seconds(eager) / n, host_seconds(eager) / n
    graph_gpu, graph_host = gpu_seconds(graph.launch) / n, host_seconds(graph.launch)
    swapped = [[int(spare.handle)] + launch.args[1:] for launch in launches]
    begin = time.perf_counter()
    for index, args in enumerate(swapped): graph.update(index, args)
    update = (time.perf_counter() - begin) / n
    begin = time.perf_counter()
    for index, args in enumerate(swapped): graph.update(index, args)
    unchanged = (time.perf_counter() - begin) / n
    graph.close()
    print(f"{n:6d} | {eager_gpu*1e6:9.2f} {eager_host*1e6:10.2f} | {graph_gpu*1e6:9.2f} {graph_host*1e6:9.1f} | "
          f"{build*1e3:8.1f} {update*1e6:11.2f} {unchanged*1e6:9.2f}")
  print("launch(): µs per graph launch (all N kernels); update/node: one changed pointer per node (patched), "
        "same: the same arguments again (no driver call)")

if __name__ == "__main__":
  main(tuple(int(arg) for arg in sys.argv[1:]) or COUNTS)
