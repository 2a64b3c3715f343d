"""Graph-building speed: seconds to build a chain of N elementwise Tensor ops (nothing realized) and to walk it.

    python bench/graph_build.py [N]     (default 10000)

Building is the front end's and lazy.py's cost per op (no device is touched); the walk is lazy.walk's cost over the
graph. Best of REPEATS runs.
"""
import os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.lazy import unrealized_bases  # noqa: E402
from timing import best_time  # noqa: E402

REPEATS = 5

def build(n: int) -> Tensor:
  x = Tensor.ones(16)
  for i in range(n): x = x * 1.0001 + i if i % 2 else x - 0.5
  return x


if __name__ == "__main__":
  n = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
  with Tensor.no_grad(): chain = build(n)
  with Tensor.no_grad(): build_s = best_time(lambda: build(n), REPEATS, warmup=False)
  walk_s = best_time(lambda: unrealized_bases([chain.lazydata]), REPEATS, warmup=False)
  print(f"build {n} ops: {build_s * 1e3:.1f} ms ({build_s / n * 1e6:.2f} us/op); "
        f"walk {len(unrealized_bases([chain.lazydata]))} bases: {walk_s * 1e3:.1f} ms")
