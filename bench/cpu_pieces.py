"""A threaded reduce's pieces on the CPU: the partial-sum kernel of a 16M-float sum threaded one piece a core (a static
split) against CPU_CHUNKS_PER_CORE pieces a core that the runtime hands out as each core finishes one
(runtime.run_on_cores), kernel launches alone, interleaved round by round with torch's sum (its threads) in one
process, so a change in the machine's load hits all three alike. Prints the best and median GB/s of ROUNDS rounds and
the load average (on a shared machine the median is where the pieces matter: a core slowed by another process takes
fewer of them).
Usage: python bench/cpu_pieces.py [--rounds N]
"""
from __future__ import annotations
import argparse, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.codegen.compile import compile_kernel  # noqa: E402
from tgrad.codegen.heuristics import CPU_CHUNKS_PER_CORE  # noqa: E402
from tgrad.codegen.kernel import Kernel, Opt, OptOps  # noqa: E402
from tgrad.device import Device  # noqa: E402
from tgrad.helpers import cpu_count  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.realize import copy_to_host  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402

ROUNDS = 60
SIZE = 16 << 20

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--rounds", type=int, default=ROUNDS)
  args = parser.parse_args()
  x = np.random.default_rng(0).random(SIZE, dtype=np.float32)
  tensor = Tensor(x).realize()
  item = next(item for item in create_schedule([tensor.sum().lazydata]) if item.ast.op is Ops.SINK)
  cores = cpu_count()
  launches = {}
  for name, pieces in (("one piece a core", cores), (f"{CPU_CHUNKS_PER_CORE} pieces a core",
                                                     cores * CPU_CHUNKS_PER_CORE)):
    kernel = Kernel(item.ast, Device["LLVM"].renderer)
    kernel.apply_opt(Opt(OptOps.THREAD, 0, pieces))
    runner = compile_kernel("LLVM", kernel, f"partials_{pieces}")
    launches[name] = (lambda runner=runner: runner(item.bufs))
  fns = dict(launches)
  try:
    import torch
    t = torch.from_numpy(x)
    fns[f"torch ({torch.get_num_threads()} threads)"] = lambda: t.sum()
  except ImportError: pass
  for name, fn in launches.items():   # each variant's partials add up to the sum
    fn()
    total = float(copy_to_host(item.bufs[0]).view(np.float32).astype(np.float64).sum())
    assert abs(total - x.astype(np.float64).sum()) < 1e-5 * x.size, (name, total)
  for fn in fns.values(): fn()
  times: dict[str, list[float]] = {name: [] for name in fns}
  for _ in range(args.rounds):
    for name, fn in fns.items():
      start = time.perf_counter()
      fn()
      times[name].append(time.perf_counter() - start)
  print(f"load average {os.getloadavg()[0]:.2f}; {cores} cores; the partial sums of {SIZE >> 20}M float32")
  for name, spent in times.items():
    rate = lambda seconds: x.nbytes / seconds / 1e9
    print(f"{name:24s} best {rate(min(spent)):6.1f} GB/s   median {rate(np.median(spent)):6.1f} GB/s")
  print(f"load average {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
  main()
