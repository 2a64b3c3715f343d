"""softmax and log_softmax over the rows of a 4096×4096 float32 matrix (normal × 5) on the GPU, in each lowering of
the execution-paths registry (default: one row kernel; online: the one-pass LOGADDEXP reduce; three_kernels), each
captured by TinyJit and replayed between CUDA events (REPEATS replays), errors against torch's float32 result.
Usage: python bench/softmax_lowerings.py [--size 4096] [--json FILE]
"""
from __future__ import annotations
import argparse, json, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gpu import event_seconds  # noqa: E402
from tgrad import Tensor, TinyJit  # noqa: E402
from tgrad.regions import apply_lowering, regions_above  # noqa: E402

REPEATS = 20
LOWERINGS = (None, "online", "three_kernels")   # None: the default

def replayed_microseconds(captured) -> float:
  return event_seconds(lambda: [runner() for runner in captured.runners], REPEATS) * 1e6

def main() -> None:
  import torch
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--size", type=int, default=4096)
  parser.add_argument("--json", default=None)
  args = parser.parse_args()
  x_np = (np.random.default_rng(0).standard_normal((args.size, args.size)) * 5).astype(np.float32)
  x = Tensor(x_np, device="CUDA").realize()
  report = {}
  for name in ("softmax", "log_softmax"):
    want = getattr(torch, name)(torch.tensor(x_np), -1).numpy()
    for lowering in LOWERINGS:
      def run(t: Tensor, lowering=lowering, name=name) -> Tensor:
        out = getattr(t, name)(-1)
        if lowering is not None:
          [region] = [r for r in regions_above(out.lazydata) if r.name == name]
          apply_lowering(region, lowering)
        return out.realize()
      jitted = TinyJit(run)
      for _ in range(3): out = jitted(x)   # runs, captures, replays
      got = out.numpy()
      row = {"us": round(replayed_microseconds(jitted.captured), 1), "kernels": len(jitted.captured.instructions),
             "max_abs": float(np.abs(got - want).max()),
             "max_rel": float((np.abs(got - want) / np.maximum(np.abs(want), 1e-30)).max())}
      report[f"{name}/{lowering or 'default'}"] = row
      print(f"{name:12s} {lowering or 'default':14s} {row['us']:8.1f} us  kernels {row['kernels']}  "
            f"abs {row['max_abs']:.1e}  rel {row['max_rel']:.1e}", flush=True)
  if args.json:
    with open(args.json, "w") as f: json.dump(report, f, indent=1)

if __name__ == "__main__":
  main()
