"""One small op end to end, eagerly: the host cost of building, scheduling and launching a single kernel.

Times `(a + b).realize()` on small tensors already on the device, then waits for the device, against the same op in
torch (on the GPU: `a + b` and `torch.cuda.synchronize()`). Every call is a fresh lazy graph, so this is what a user
pays per op without a JIT: graph building, the schedule cache, lowering and the launch. The median over CALLS calls
after WARMUP calls (which compile the kernel and fill the caches) is reported, in microseconds. A host clock is the
right clock here: the quantity measured is host time per op (the kernel itself takes a few microseconds of it), and
the same clock times both sides.
Usage: python bench/eager_op.py [--device CUDA|LLVM] [--size 16]
"""
from __future__ import annotations
import argparse, json, os, statistics, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402

WARMUP = 50
CALLS = 2000

def median_us(call, synchronize) -> float:
  for _ in range(WARMUP): call()
  synchronize()
  samples = []
  for _ in range(CALLS):
    start = time.perf_counter()
    call()
    synchronize()
    samples.append(time.perf_counter() - start)
  return statistics.median(samples) * 1e6

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--device", default="CUDA")
  parser.add_argument("--size", type=int, default=16)
  args = parser.parse_args()
  data = np.random.default_rng(0).standard_normal((2, args.size), dtype=np.float32)
  a, b = Tensor(data[0], device=args.device).realize(), Tensor(data[1], device=args.device).realize()
  if args.device == "CUDA":
    import pycuda.driver as cuda
    sync_tgrad = cuda.Context.synchronize
  else:
    def sync_tgrad() -> None: pass
  out = {"device": args.device, "size": args.size, "calls": CALLS}
  got = (a + b).numpy()
  np.testing.assert_allclose(got, data[0] + data[1], rtol=1e-6)
  out["tgrad_us"] = median_us(lambda: (a + b).realize(), sync_tgrad)
  import torch
  torch_device = "cuda" if args.device == "CUDA" else "cpu"
  ta, tb = torch.tensor(data[0], device=torch_device), torch.tensor(data[1], device=torch_device)
  sync_torch = torch.cuda.synchronize if torch_device == "cuda" else (lambda: None)
  out["torch_us"] = median_us(lambda: ta + tb, sync_torch)
  out["tgrad_over_torch"] = out["tgrad_us"] / out["torch_us"]
  print(json.dumps(out))

if __name__ == "__main__":
  main()
