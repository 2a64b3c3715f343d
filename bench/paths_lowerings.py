"""Each lowering of tanh, gelu, softmax, log_softmax and matmul: its time and its max relative error against the
float64 reference.

For every (op, shape, dtype), builds the op on a random normal input, enumerates every path of realizing it
(tgrad.paths.iterate: each composite region's lowerings, nested ones included) and measures each (time: the sum of
its launches, device events on CUDA, the minimum over REPEATS runs; error: against tgrad's float64 reference on the
LLVM device with the most exact lowerings). Prints one table row per path and a JSON report.
Usage: python bench/paths_lowerings.py [--device CUDA|LLVM] [--repeats 10] [--json FILE]
"""
from __future__ import annotations
import argparse, json, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor, dtypes  # noqa: E402
from tgrad.paths.path import iterate, measure, reference_outputs  # noqa: E402

OPS = {"tanh": lambda x: x.tanh(), "gelu": lambda x: x.gelu(), "softmax": lambda x: x.softmax(-1),
       "log_softmax": lambda x: x.log_softmax(-1)}
MATMUL_SIZE = 1024   # x·x for a square x of this size (its float64 reference runs on the CPU: 1024³ stays quick)
SHAPES = ((4, 16), (4096, 4096), (MATMUL_SIZE, MATMUL_SIZE))
SEED = 0

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--device", default=None)
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  rng = np.random.default_rng(SEED)
  rows = []
  for shape in SHAPES:
    data = rng.standard_normal(shape).astype(np.float32) * (1 if shape == (MATMUL_SIZE, MATMUL_SIZE) else 3)
    for dtype in (dtypes.float32, dtypes.float16):
      x = Tensor(data, device=args.device).cast(dtype).realize()
      ops = dict(OPS)
      if shape == (MATMUL_SIZE, MATMUL_SIZE): ops = {"matmul": lambda x: x @ x}
      for name, op in ops.items():
        space = iterate(op(x))
        reference = reference_outputs(space)
        for path in space:
          run = measure(space, path, reference, args.repeats)
          row = {"op": name, "shape": list(shape), "dtype": str(dtype), "device": space.device,
                 "path": path.description,
                 "min_us": min(run.times) * 1e6 if run.times else None, "kernels": run.kernels,
                 "max_rel_error": run.max_rel_error, "max_abs_error": run.max_abs_error, "error": run.error}
          rows.append(row)
          time_text = f"{row['min_us']:10.1f} us" if run.times else "    failed   "
          print(f"{name:8s} {str(shape):13s} {str(dtype):8s} {time_text} rel {run.max_rel_error:9.2e} "
                f"abs {run.max_abs_error:9.2e} k{run.kernels}  {path.description} {run.error[:80]}", flush=True)
  if args.json:
    with open(args.json, "w") as f: json.dump(rows, f, indent=1)

if __name__ == "__main__":
  main()
