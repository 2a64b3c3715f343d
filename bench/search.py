"""BEAM search: float32 matmul GFLOP/s with the default heuristics, with BEAM, and numpy's (torch's on CUDA), plus
the search time of each kernel. Run it twice: the second run finds every winner in the cache and searches nothing.

Usage: python bench/search.py [--size 1024] [--beam 2] [--runs 10] [--ignore-cache] [--device LLVM|CUDA]
The other kernels searched (for the median search time) are a row sum and an elementwise a*b+a of size×size. Each
search's CPU seconds are this process's (its kernel threads included) plus, on Linux, its compile workers': on a
shared machine the wall time also holds the other jobs' share of the cores (load average above the core count).
"""
import argparse, multiprocessing, os, statistics, time
import numpy as np
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.search import search_kernel
from tgrad.device import Buffer, Device
from tgrad.helpers import Context
from tgrad.lazy import LazyBuffer
from tgrad.ops import Ops
from tgrad.realize import compile_kernel, realize
from tgrad.schedule import create_schedule

DEVICE = "LLVM"   # --device replaces it

def realized(array: np.ndarray) -> LazyBuffer:
  lb = LazyBuffer.from_host(array, DEVICE)
  realize(lb)
  return lb

def matmul(a: LazyBuffer, b: LazyBuffer) -> LazyBuffer:
  (n, k), (_, m) = a.shape, b.shape
  product = a.reshape((n, 1, k)).expand((n, m, k)).alu(Ops.MUL, b.permute((1, 0)).reshape((1, m, k)).expand((n, m, k)))
  return product.r(Ops.ADD, (2,)).reshape((n, m))

def kernel_of(out: LazyBuffer) -> tuple[Kernel, list[Buffer], Buffer]:
  item = create_schedule([out])[-1]
  output = Buffer(DEVICE, out.size, out.dtype)
  return Kernel(item.ast, Device[DEVICE].renderer), list(item.inputs), output

def best_seconds(kernel: Kernel, inputs: list[Buffer], output: Buffer, runs: int) -> float:
  runner = compile_kernel(DEVICE, kernel)
  runner([output, *inputs])   # warm-up
  return min(runner([output, *inputs], wait=True) for _ in range(runs))

def worker_cpu_seconds() -> float:
  """CPU seconds of this process's live child processes (the search's compile workers) from /proc; 0 elsewhere."""
  ticks, total = os.sysconf("SC_CLK_TCK"), 0
  for child in multiprocessing.active_children():
    try:
      with open(f"/proc/{child.pid}/stat") as stat: fields = stat.read().rsplit(")", 1)[1].split()
    except OSError: continue
    total += int(fields[11]) + int(fields[12])   # utime, stime (fields 14 and 15 of proc(5))
  return total / ticks

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=1024)
  parser.add_argument("--beam", type=int, default=2)
  parser.add_argument("--runs", type=int, default=10, help="timed runs per kernel; the minimum is reported")
  parser.add_argument("--ignore-cache", action="store_true", help="search even when a winner is cached")
  parser.add_argument("--device", default="LLVM")
  args = parser.parse_args()
  global DEVICE
  DEVICE = args.device
  n, rng = args.size, np.random.default_rng(0)
  a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
  la, lb = realized(a), realized(b)
  kernels = {"matmul": kernel_of(matmul(la, lb)), "row_sum": kernel_of(la.r(Ops.ADD, (1,))),
             "elementwise": kernel_of(la.alu(Ops.MUL, lb).alu(Ops.ADD, la))}
  flops = 2 * n ** 3
  search_seconds, from_cache = [], 0
  with Context(IGNORE_BEAM_CACHE=int(args.ignore_cache)):
    for name, (kernel, inputs, output) in kernels.items():
      start, cpu_start, workers_start = time.perf_counter(), time.process_time(), worker_cpu_seconds()
      result = search_kernel(kernel, args.beam)
      search_seconds.append(time.perf_counter() - start)
      cpu_seconds = time.process_time() - cpu_start
      workers_seconds = worker_cpu_seconds() - workers_start
      from_cache += result.stats.from_cache
      default = kernel.copy()
      hand_coded_optimizations(default)
      searched = kernel.copy()
      for opt in result.opts: searched.apply_opt(opt)
      default_time = best_seconds(default, inputs, output, args.runs)
      beam_time = best_seconds(searched, inputs, output, args.runs)
      stats = result.stats
      print(f"{name:12s} search {search_seconds[-1]:7.2f} s, {cpu_seconds:6.2f} + {workers_seconds:5.2f} s CPU "
            f"({'cached' if stats.from_cache else 'searched'}: {stats.candidates} candidates, {stats.rounds} "
            f"rounds, {stats.pruned} pruned, {stats.retimes_skipped} timed once, {stats.rejected} rejected)  "
            f"default {default_time * 1e3:8.3f} ms  BEAM={args.beam} {beam_time * 1e3:8.3f} ms  opts {result.opts}")
      if name == "matmul": matmul_times = (default_time, beam_time)
  # tgrad's times above are kernel times (one launch each); the reference's is its kernel time too on CUDA (torch on
  # the same GPU, TF32 off, from the torch profiler), and one `a @ b` call on the CPU (numpy)
  if DEVICE == "CUDA":
    import torch
    from gpu import torch_kernel_time
    torch.backends.cuda.matmul.allow_tf32 = False
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    reference, reference_time = "torch kernel", torch_kernel_time(lambda: ta @ tb, args.runs)
  else: reference, reference_time = "numpy call", min(_timed(lambda: a @ b) for _ in range(args.runs))
  print(f"matmul {n}x{n}x{n} float32 GFLOP/s: default {flops / matmul_times[0] / 1e9:.1f}, "
        f"BEAM={args.beam} {flops / matmul_times[1] / 1e9:.1f}, {reference} {flops / reference_time / 1e9:.1f}")
  print(f"search seconds per kernel: median {statistics.median(search_seconds):.2f}, total {sum(search_seconds):.2f}; "
        f"{from_cache} of {len(kernels)} from the cache; load average {os.getloadavg()[0]:.1f}")

def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start

if __name__ == "__main__":
  main()
