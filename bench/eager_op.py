"""One small op end to end, eagerly: the host cost of building, scheduling and launching a single kernel.

Times `(a + b).realize()` (or with `--op sum`, `a.sum().realize()`: a reduce whose result is a view of it) on small
tensors already on the device, then waits for the device, against the same op in torch (on the GPU: `a + b` and
`torch.cuda.synchronize()`). Every call is a fresh lazy graph, so this is what a user
pays per op without a JIT: graph building, the schedule cache, lowering and the launch. The median over CALLS calls
after WARMUP calls (which compile the kernel and fill the caches) is reported, in microseconds. A host clock is the
right clock here: the quantity measured is host time per op (the kernel itself takes a few microseconds of it), and
the same clock times both sides. On a shared machine a median moves with the load: the best call (time.perf_counter_ns,
min over every call) is the host cost with the least interference, and tgrad and torch are timed in alternating
rounds of the same process, so their ratio is meaningful even under load (the load average is printed). The Python
function calls per tgrad op (sys.setprofile, deterministic) are printed too (test/unit/test_eager_overhead.py
bounds them).
Usage: python bench/eager_op.py [--device CUDA|LLVM] [--size 16] [--op add|sum]
"""
from __future__ import annotations
import argparse, json, os, statistics, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.profiler import python_calls_per_call  # noqa: E402

WARMUP = 50
CALLS = 2000
ROUNDS = 4   # alternating rounds of CALLS // ROUNDS calls each
OPS = ("add", "sum")

def host_ns(call, synchronize, calls: int) -> list[int]:
  """Nanoseconds of each of `calls` calls of call() followed by synchronize()."""
  samples = []
  for _ in range(calls):
    start = time.perf_counter_ns()
    call()
    synchronize()
    samples.append(time.perf_counter_ns() - start)
  return samples

def python_calls_per_op(call, ops: int = 200) -> float: return python_calls_per_call(call, ops)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--device", default="CUDA")
  parser.add_argument("--size", type=int, default=16)
  parser.add_argument("--op", default="add", choices=OPS)
  args = parser.parse_args()
  data = np.random.default_rng(0).standard_normal((2, args.size), dtype=np.float32)
  a, b = Tensor(data[0], device=args.device).realize(), Tensor(data[1], device=args.device).realize()
  if args.device == "CUDA":
    import pycuda.driver as cuda
    sync_tgrad = cuda.Context.synchronize
  else:
    def sync_tgrad() -> None: pass
  out = {"device": args.device, "op": args.op, "size": args.size, "calls": CALLS}
  if args.op == "add": np.testing.assert_allclose((a + b).numpy(), data[0] + data[1], rtol=1e-6)
  else: np.testing.assert_allclose(a.sum().numpy(), data[0].sum(), rtol=1e-5)
  import torch
  torch_device = "cuda" if args.device == "CUDA" else "cpu"
  ta, tb = torch.tensor(data[0], device=torch_device), torch.tensor(data[1], device=torch_device)
  sync_torch = torch.cuda.synchronize if torch_device == "cuda" else (lambda: None)
  if args.op == "add":
    def tgrad_op() -> None: (a + b).realize()
    def torch_op() -> None: ta + tb
  else:
    def tgrad_op() -> None: a.sum().realize()
    def torch_op() -> None: ta.sum()
  for _ in range(WARMUP): tgrad_op(), torch_op()
  sync_tgrad(), sync_torch()
  tgrad_ns: list[int] = []
  torch_ns: list[int] = []
  for _ in range(ROUNDS):
    tgrad_ns += host_ns(tgrad_op, sync_tgrad, CALLS // ROUNDS)
    torch_ns += host_ns(torch_op, sync_torch, CALLS // ROUNDS)
  out["tgrad_us"], out["torch_us"] = statistics.median(tgrad_ns) / 1e3, statistics.median(torch_ns) / 1e3
  out["tgrad_min_us"], out["torch_min_us"] = min(tgrad_ns) / 1e3, min(torch_ns) / 1e3
  out["tgrad_over_torch"] = out["tgrad_us"] / out["torch_us"]
  out["tgrad_over_torch_min"] = out["tgrad_min_us"] / out["torch_min_us"]
  out["python_calls_per_op"] = python_calls_per_op(tgrad_op)
  out["load_average"] = [round(v, 2) for v in os.getloadavg()]
  print(json.dumps(out))

if __name__ == "__main__":
  main()
