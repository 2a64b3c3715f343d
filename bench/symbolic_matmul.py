"""Gemma's prefill projections with a symbolic prompt length, y = x[:n] · Wᵀ in float32, on the GPU: the heuristics'
choice (staged 8×8 tiles, heuristics._staged_symbolic_matmul) next to the guarded register tile the symbolic rules
used before it (4×4 outputs per thread, 16×16 threads), kernel time against kernel time.

One compile per kernel serves every n: each is timed at several prompt lengths by CUDA events around REPEATS
launches (after one warm launch; bench/gpu.py's event_seconds), and checked against numpy in float64 (max error over
max |y|).
Usage: python bench/symbolic_matmul.py [--lengths 7 100 520 2048] [--json FILE]
"""
from __future__ import annotations
import argparse, json, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import event_seconds  # noqa: E402
from tgrad import Tensor, Variable  # noqa: E402
from tgrad.device import Buffer, Device  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402
from tgrad.codegen.kernel import Kernel, Opt, OptOps  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.codegen.compile import compile_kernel  # noqa: E402

SHAPES = {"qkv": (1536, 640), "o_proj": (640, 1024), "gate_up": (4096, 640), "down": (640, 2048)}   # (N, K)
BOUND = 4096        # the prompt length's maximum (the rows of x)
REPEATS = 20
# the symbolic rules' tile before the staged one: rows padded to 64, 4 columns × 4 rows per thread, K by 4, 16×16
REGISTER_TILE = [Opt(OptOps.PADTO, 0, 64), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4),
                 Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 1, 16)]

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--lengths", type=int, nargs="+", default=[7, 100, 520, 2048])
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  rows = Variable("n", 1, BOUND)
  report = {}
  for name, (N, K) in SHAPES.items():
    rng = np.random.default_rng(0)
    x_np, w_np = rng.standard_normal((BOUND, K), dtype=np.float32), rng.standard_normal((N, K), dtype=np.float32)
    x, w = Tensor(x_np, device="CUDA").realize(), Tensor(w_np, device="CUDA").realize()
    (item,) = [i for i in create_schedule([(x[:rows.bind(1)] @ w.T).lazydata]) if i.ast.op is Ops.SINK]
    for label in ("heuristics", "register_tile"):
      kernel = Kernel(item.ast, Device["CUDA"].renderer)
      if label == "heuristics": hand_coded_optimizations(kernel)
      else:
        for opt in REGISTER_TILE: kernel.apply_opt(opt)
      runner = compile_kernel("CUDA", kernel)
      out = Buffer("CUDA", item.bufs[0].size, item.bufs[0].dtype)
      for n in args.lengths:
        us = event_seconds(runner.prepare([out.handle, *[b.handle for b in item.inputs]], (n,)), REPEATS) * 1e6
        want = x_np[:n].astype(np.float64) @ w_np.T.astype(np.float64)
        error = float(np.abs(out.copyout()[:n * N].reshape(n, N) - want).max() / np.abs(want).max())
        row = {"us": round(us, 1), "TFLOP_s": round(2 * n * N * K / us / 1e6, 2), "rel_error": error,
               "staged": bool(kernel.staged)}
        report[f"{name} {N}x{K} {label} n={n}"] = row
        print(f"{name:8s} {N}x{K} {label:14s} n={n:5d} {row['us']:9.1f} us {row['TFLOP_s']:7.2f} TFLOP/s "
              f"err {error:.1e}", flush=True)
  if args.json:
    with open(args.json, "w") as f: json.dump(report, f, indent=1)

if __name__ == "__main__":
  main()
