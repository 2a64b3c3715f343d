"""Eager ops with a new Python scalar every call: time and memory per call, and kernels compiled.

`python bench/scalar_constants.py [--count 1000] [--tensors 10000]` runs `(x * float(i)).numpy()` for `count` distinct
constants (then the same loop with one repeated constant), and realizes `tensors` small tensors `x * c_k + k` (a
distinct constant each) together. Prints ms per call, the process's resident memory before and after (MB) and the
number of kernels compiled (realize's compiled-kernel memo). Run it with a fresh TGRAD_CACHE for cold numbers.
"""
import argparse, resource, time
import numpy as np
from tgrad import Tensor
from tgrad import realize as realize_module

def rss_mb() -> float:
  with open("/proc/self/statm") as f: return int(f.read().split()[1]) * resource.getpagesize() / 2**20

def compiled() -> int: return len(realize_module._runner_cache)

def loop(x: Tensor, constants) -> float:
  start = time.perf_counter()
  for c in constants: (x * c).numpy()
  return (time.perf_counter() - start) / len(constants) * 1e3

def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--count", type=int, default=1000)
  parser.add_argument("--tensors", type=int, default=10000)
  args = parser.parse_args()
  x = Tensor(np.arange(1024, dtype=np.float32)).realize()
  (x * 0.25).numpy()   # warm: the device and the first compile
  before, kernels = rss_mb(), compiled()
  distinct = loop(x, [float(i) + 0.5 for i in range(args.count)])
  print(f"{args.count} distinct constants: {distinct:.3f} ms per call, RSS {before:.0f} -> {rss_mb():.0f} MB, "
        f"{compiled() - kernels} kernels compiled")
  repeated = loop(x, [0.25] * args.count)
  print(f"{args.count} calls with one constant: {repeated:.3f} ms per call")
  if args.tensors:
    before, kernels = rss_mb(), compiled()
    start = time.perf_counter()
    outs = [x * (float(k) + 0.5) + k for k in range(args.tensors)]
    Tensor.realize(*outs)
    seconds = time.perf_counter() - start
    ramp = np.arange(1024, dtype=np.float32)
    ok = all(np.allclose(outs[k].numpy(), ramp * (k + 0.5) + k) for k in (0, args.tensors - 1))
    print(f"{args.tensors} small tensors with distinct constants realized together: {seconds:.2f} s, RSS "
          f"{before:.0f} -> {rss_mb():.0f} MB, {compiled() - kernels} kernels compiled, values "
          f"{'match' if ok else 'WRONG'}")

if __name__ == "__main__": main()
