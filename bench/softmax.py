"""Row-kernel benchmark: softmax and rms_norm over the last axis, tgrad (LLVM, CPU; DEVICE=CUDA for the GPU) vs torch
(CPU), with kernel counts.

For each case: the kernels tgrad schedules for it (count), their time alone (the lowered schedule run on realized
inputs, best of REPEATS), tgrad end to end (build, schedule, launch: what a user pays per call) and torch's time,
and the largest difference from torch. Schedule.py's rule 2b makes each of these one kernel; compare with the numbers
of an older checkout (docs/benchmarks.md lists both).
Usage: python bench/softmax.py [--repeats N]
"""
from __future__ import annotations
import argparse, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402
from tgrad.realize import lower_schedule, run  # noqa: E402
from tgrad.device import Device  # noqa: E402
import torch  # noqa: E402
from cpu import best_time  # noqa: E402

REPEATS = 20
SHAPES = ((4096, 4096), (1, 640))
RMS_EPS = 1e-6

CASES = {
  "softmax": (lambda x: x.softmax(-1), lambda x: torch.softmax(x, dim=-1)),
  "rms_norm": (lambda x: x.rmsnorm(-1, RMS_EPS),
               lambda x: torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=RMS_EPS)),
}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--repeats", type=int, default=REPEATS)
  args = parser.parse_args()
  torch.set_grad_enabled(False)
  print(f"tgrad LLVM vs torch {torch.__version__} CPU ({torch.get_num_threads()} threads), best of {args.repeats}")
  header = f"{'case':24s} {'kernels':>7s} {'tgrad kernels':>14s} {'tgrad e2e':>10s} {'torch':>10s} {'max err':>9s}"
  print(header)
  print("-" * len(header))
  rng = np.random.default_rng(0)
  for shape in SHAPES:
    data = rng.standard_normal(shape, dtype=np.float32)
    x, xt = Tensor(data).realize(), torch.from_numpy(data)
    for name, (tg_fn, torch_fn) in CASES.items():
      items = create_schedule([tg_fn(x).lazydata])
      kernels = sum(1 for item in items if item.ast.op is Ops.SINK)
      exec_items = lower_schedule(items)
      def kernels_only() -> None:
        run(exec_items)
        Device[x.device].synchronize()
      t_kernels = best_time(kernels_only, args.repeats)
      def end_to_end() -> None:
        tg_fn(x).realize()
        Device[x.device].synchronize()
      t_e2e = best_time(end_to_end, args.repeats)
      t_torch = best_time(lambda: torch_fn(xt), args.repeats)
      err = float(np.max(np.abs(tg_fn(x).numpy() - torch_fn(xt).numpy())))
      label = f"{name} {shape[0]}x{shape[1]}"
      print(f"{label:24s} {kernels:7d} {t_kernels * 1e6:11.1f} us {t_e2e * 1e6:7.1f} us {t_torch * 1e6:7.1f} us "
            f"{err:9.2e}")

if __name__ == "__main__":
  main()
