"""A THREAD launch on the CPU in more pieces than cores: the partial-sum kernel of a 16M-float sum (256 partials of
65,536 values, as lazy._split_reduce makes it) and the softmax kernel of 2048² rows, each threaded in 2, 8, 16, 32 and
64 pieces and launched through runtime.run_on_cores (the cores claim pieces as they finish one), interleaved round by
round with torch's sum (softmax) of the same array; and the cost of launching an empty kernel in 1, 2, 16, 64 and 256
pieces. Kernel launches only: no graph building or scheduling (bench/cpu_reduce.py times those end to end). GB/s is
the bytes moved (read, and written for softmax) over the time; the best, 25th percentile and median of ROUNDS rounds
are printed with the load average (the machine may be shared: on a busy one the median shows how much a piece held up
by another process costs).
Usage: python bench/cpu_pieces.py [--rounds N]
"""
from __future__ import annotations
import argparse, ctypes, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.codegen.kernel import Kernel, Opt, OptOps  # noqa: E402
from tgrad.codegen.linearizer import linearize  # noqa: E402
from tgrad.device import Device  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.runtime.llvm.runtime import HostMemory, LLVMProgram, run_on_cores  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402

ROUNDS = 40
SIZE = 16 << 20
SOFTMAX_SHAPE = (2048, 2048)
PIECES = (2, 8, 16, 32, 64)
EMPTY_PIECES = (1, 2, 16, 64, 256)
EMPTY_KERNEL = 'define void @"empty"(ptr noalias %".1", i32 %".2")\n{\nentry:\n  ret void\n}\n'

try:
  import torch
  torch.set_grad_enabled(False)
except ImportError:
  torch = None

def threaded(out: Tensor, pieces: int, tag: str) -> LLVMProgram:
  """The first kernel of out's schedule, its outermost axis threaded in `pieces`."""
  renderer = Device["LLVM"].renderer
  first = next(i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK)
  kernel = Kernel(first.ast, renderer)
  kernel.apply_opt(Opt(OptOps.THREAD, 0, pieces))
  name = f"{tag}_{pieces}"
  return LLVMProgram(name, Device["LLVM"].compiler.compile(renderer.render(name, linearize(kernel))))

def handle(array: np.ndarray) -> HostMemory: return HostMemory(array.view(np.uint8), array.ctypes.data)

def summary(times: list[float], nbytes: int = 0) -> str:
  points = (min(times), np.percentile(times, 25), np.median(times))
  if nbytes: return "  ".join(f"{nbytes / t / 1e9:6.1f}" for t in points)
  return "  ".join(f"{t * 1e6:6.1f}" for t in points)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--rounds", type=int, default=ROUNDS)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  x, rows = rng.random(SIZE, dtype=np.float32), rng.standard_normal(SOFTMAX_SHAPE, dtype=np.float32)
  partials, probabilities = np.zeros(256, np.float32), np.zeros_like(rows)
  sum_arguments = [handle(partials).pointer, handle(x).pointer]
  softmax_arguments = [handle(probabilities).pointer, handle(rows).pointer]
  for case, arguments, out, nbytes in (("sum 16M", sum_arguments, Tensor.empty(SIZE).sum(), x.nbytes),
                                       ("softmax 2048²", softmax_arguments, Tensor.empty(*SOFTMAX_SHAPE).softmax(-1),
                                        2 * rows.nbytes)):
    launches = {f"{p} pieces": (lambda fn=threaded(out, p, case[:3]).fn, p=p, a=arguments: run_on_cores(fn, a, p))
                for p in PIECES}
    if torch:
      launches[f"torch ({torch.get_num_threads()} threads)"] = (lambda t=torch.from_numpy(x): t.sum()) \
        if case.startswith("sum") else (lambda t=torch.from_numpy(rows): torch.softmax(t, -1))
    for name, launch in launches.items():
      partials[:] = 0
      probabilities[:] = 0
      launch()
      if "pieces" in name and case.startswith("sum"):
        assert abs(partials.astype(np.float64).sum() / x.astype(np.float64).sum() - 1) < 1e-6, name
      if "pieces" in name and case.startswith("softmax"):
        assert abs(probabilities.astype(np.float64).sum(-1) - 1).max() < 1e-4, name
    times: dict[str, list[float]] = {name: [] for name in launches}
    print(f"load average {os.getloadavg()[0]:.2f}; {case}, GB/s: best, 25th percentile, median")
    for _ in range(args.rounds):
      for name, launch in launches.items():
        start = time.perf_counter()
        launch()
        times[name].append(time.perf_counter() - start)
    for name, spent in times.items(): print(f"  {name:22s} {summary(spent, nbytes)}")
  empty = LLVMProgram("empty", Device["LLVM"].compiler.compile(EMPTY_KERNEL))
  print("empty kernel, µs a launch: best, 25th percentile, median")
  for pieces in EMPTY_PIECES:
    spent = []
    for _ in range(args.rounds * 5):
      start = time.perf_counter()
      if pieces == 1: empty.fn(ctypes.c_void_p(0), 0)
      else: run_on_cores(empty.fn, [ctypes.c_void_p(0)], pieces)
      spent.append(time.perf_counter() - start)
    print(f"  {pieces:3d} pieces {summary(spent)}")
  print(f"load average {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
  main()
