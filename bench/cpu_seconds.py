"""CPU seconds per call of tgrad's CPU matmuls (1024², 2048², the MLP of bench/cpu.py): a comparison of two trees that
holds on a loaded machine, where wall-clock rates (and numpy's, whose threads spin) move 2-10× between runs.

The process's CPU time counts every thread's work and none of the time it waited for a core, so a change in the work
done (a copy skipped, a faster kernel) shows even at a load average far above the core count; cache contention with
other jobs still adds some. Median of REPEATS calls after a warm-up; run it alternately on each tree:
  PYTHONPATH=<tree> python bench/cpu_seconds.py
"""
import os, statistics, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402

REPEATS = 7
MLP_SHAPE = (256, 1024, 4096)   # as bench/cpu.py

def cpu_median(fn, repeats: int = REPEATS) -> float:
  """Median CPU seconds of `repeats` calls after a warm-up call (two: the second makes a weight's kept copy)."""
  fn()
  fn()
  times = []
  for _ in range(repeats):
    start = time.process_time()
    fn()
    times.append(time.process_time() - start)
  return statistics.median(times)

def main() -> None:
  rng = np.random.default_rng(0)
  for n in (1024, 2048):
    a, b = (Tensor(rng.random((n, n), dtype=np.float32)).realize() for _ in range(2))
    seconds = cpu_median(lambda: (a @ b).realize())
    print(f"matmul {n}: {seconds * 1e3:7.1f} ms CPU per call ({2 * n ** 3 / seconds / 1e9:6.1f} GFLOP per CPU s)")
  batch, features, hidden = MLP_SHAPE
  x = Tensor(rng.standard_normal((batch, features), dtype=np.float32)).realize()
  w1 = Tensor(rng.standard_normal((features, hidden), dtype=np.float32) / np.sqrt(features)).realize()
  w2 = Tensor(rng.standard_normal((hidden, features), dtype=np.float32) / np.sqrt(hidden)).realize()
  seconds = cpu_median(lambda: ((x @ w1).relu() @ w2).realize())
  print(f"MLP {batch}x{features}>{hidden}>{features}: {seconds * 1e3:7.1f} ms CPU per call "
        f"({4 * batch * features * hidden / seconds / 1e9:6.1f} GFLOP per CPU s)")

if __name__ == "__main__":
  main()
