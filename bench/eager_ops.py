"""Several small eager ops on LLVM, each end to end: host time per op, best and median of many calls.

bench/eager_op.py times `(a + b).realize()` against torch; this times the neighbours an eager change must not slow
down: `a + b`, `a + 1` (a Python scalar: a kernel parameter), `a * b + a` (two ops, one kernel), `a.exp()` (a
composite), and `a + b` on a 0-d and on a size-1 tensor, on 16 float32 already realized (the 0-d and size-1 cases on
their own shapes). Each op is warmed up (its kernel compiled, its schedule and eager launch cached), then timed in
ROUNDS alternating rounds of CALLS // ROUNDS calls (time.perf_counter_ns per call), so a burst of load from other work
touches every op alike; best (min) and median per op, in microseconds, with the load average. Run it alternately on two
trees to compare them (PYTHONPATH=/other/tree python bench/eager_ops.py times that tree's tgrad).
Usage: python bench/eager_ops.py [--calls 4000]
"""
from __future__ import annotations
import argparse, json, os, statistics, sys, time
import numpy as np
sys.path.append(os.path.join(os.path.dirname(__file__), ".."))   # after PYTHONPATH: another tree can be timed
import tgrad  # noqa: E402
from tgrad import Tensor  # noqa: E402

WARMUP = 300
ROUNDS = 4

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--calls", type=int, default=4000)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  def realized(shape) -> Tensor: return Tensor(rng.standard_normal(shape).astype(np.float32), device="LLVM").realize()
  a, b = realized((16,)), realized((16,))
  s0, t0 = realized(()), realized(())
  s1, t1 = realized((1,)), realized((1,))
  ops = {"a + b": lambda: (a + b).realize(), "a + 1": lambda: (a + 1).realize(),
         "a * b + a": lambda: (a * b + a).realize(), "a.exp()": lambda: a.exp().realize(),
         "0-d a + b": lambda: (s0 + t0).realize(), "size-1 a + b": lambda: (s1 + t1).realize()}
  np.testing.assert_allclose((a * b + a).numpy(), a.numpy() * b.numpy() + a.numpy(), rtol=1e-6, atol=1e-6)
  samples: dict[str, list[int]] = {name: [] for name in ops}
  for op in ops.values():
    for _ in range(WARMUP): op()
  clock = time.perf_counter_ns
  for _ in range(ROUNDS):
    for name, op in ops.items():
      times = samples[name]
      for _ in range(args.calls // ROUNDS):
        start = clock()
        op()
        times.append(clock() - start)
  out: dict = {name: {"best_us": round(min(v) / 1e3, 2), "median_us": round(statistics.median(v) / 1e3, 2)}
               for name, v in samples.items()}
  out["tgrad"] = os.path.dirname(os.path.dirname(tgrad.__file__))   # the tree timed
  out["load_average"] = [round(v, 2) for v in os.getloadavg()]
  print(json.dumps(out))

if __name__ == "__main__":
  main()
