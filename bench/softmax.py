"""Row kernels and long reductions: tgrad (LLVM, CPU; DEVICE=CUDA for the GPU) vs torch vs numpy (CPU), in one run.

The cases: sum, mean and max of one long vector (a single row of 16M float32: split into partials and combined),
and softmax, log_softmax, rms_norm and layer_norm over the rows of a square matrix. For each case: the kernels tgrad
schedules for it (count), their time alone (the lowered schedule run on realized inputs), tgrad end to end (build,
schedule, launch: what a user pays per call), numpy's and torch's times, the ratios torch / tgrad and numpy / tgrad
of the end-to-end times (above 1: tgrad is faster), and the largest difference from torch. Times are medians of
REPEATS calls after a warm-up; the machine may be shared, so compare the ratios of one run, not times across runs.
Usage: python bench/softmax.py [--repeats N] [--only TEXT] [--small]   (--small adds rows of 1×640: launch-bound)
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
from timing import median_time  # noqa: E402

REPEATS = 15
LONG_ROW = 16 * 1024 * 1024          # one row of float32 (64 MiB: past the last-level cache)
ROWS_SHAPE = (2048, 2048)            # row kernels: 2048 rows of 2048 float32 (16 MiB)
SMALL_SHAPE = (1, 640)
EPS = 1e-6

def np_softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)

def np_log_softmax(x: np.ndarray) -> np.ndarray:
  shifted = x - x.max(axis=-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))

def np_rms_norm(x: np.ndarray) -> np.ndarray: return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)

def np_layer_norm(x: np.ndarray) -> np.ndarray:
  centered = x - x.mean(axis=-1, keepdims=True)
  return centered / np.sqrt((centered * centered).mean(axis=-1, keepdims=True) + EPS)

def torch_norm(x, kind: str):
  if kind == "rms": return torch.nn.functional.rms_norm(x, (x.shape[-1],), eps=EPS)
  return torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=EPS)

# name → (tgrad, torch, numpy)
REDUCES = {
  "sum": (lambda x: x.sum(), lambda x: x.sum(), lambda x: x.sum()),
  "mean": (lambda x: x.mean(), lambda x: x.mean(), lambda x: x.mean()),
  "max": (lambda x: x.max(), lambda x: x.max(), lambda x: x.max()),
}
ROW_KERNELS = {
  "softmax": (lambda x: x.softmax(-1), lambda x: torch.softmax(x, dim=-1), np_softmax),
  "log_softmax": (lambda x: x.log_softmax(-1), lambda x: torch.log_softmax(x, dim=-1), np_log_softmax),
  "rms_norm": (lambda x: x.rmsnorm(-1, EPS), lambda x: torch_norm(x, "rms"), np_rms_norm),
  "layer_norm": (lambda x: x.layernorm(-1, EPS), lambda x: torch_norm(x, "layer"), np_layer_norm),
}

def cases(small: bool):
  yield from ((name, (LONG_ROW,), fns) for name, fns in REDUCES.items())
  yield from ((name, ROWS_SHAPE, fns) for name, fns in ROW_KERNELS.items())
  if small: yield from ((name, SMALL_SHAPE, fns) for name, fns in ROW_KERNELS.items())

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--repeats", type=int, default=REPEATS)
  parser.add_argument("--only", default="", help="only the cases whose name contains this text")
  parser.add_argument("--small", action="store_true", help="also rows of 1×640 (launch-bound)")
  args = parser.parse_args()
  torch.set_grad_enabled(False)
  print(f"tgrad vs torch {torch.__version__} CPU ({torch.get_num_threads()} threads) vs numpy {np.__version__}, "
        f"median of {args.repeats}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
  header = (f"{'case':24s} {'kernels':>7s} {'tgrad kernels':>14s} {'tgrad e2e':>11s} {'numpy':>10s} {'torch':>10s} "
            f"{'torch/tgrad':>11s} {'numpy/tgrad':>11s} {'max err':>9s}")
  print(header)
  print("-" * len(header))
  rng = np.random.default_rng(0)
  for name, shape, (tg_fn, torch_fn, np_fn) in cases(args.small):
    label = f"{name} {'x'.join(str(s) for s in shape)}"
    if args.only not in label: continue
    data = rng.standard_normal(shape, dtype=np.float32)
    x, xt = Tensor(data).realize(), torch.from_numpy(data)
    items = create_schedule([tg_fn(x).lazydata])
    kernels = sum(1 for item in items if item.ast.op is Ops.SINK)
    exec_items = lower_schedule(items)
    def kernels_only() -> None:
      run(exec_items)
      Device[x.device].synchronize()
    def end_to_end() -> None:
      tg_fn(x).realize()
      Device[x.device].synchronize()
    t_kernels = median_time(kernels_only, args.repeats)
    t_e2e = median_time(end_to_end, args.repeats)
    t_numpy = median_time(lambda: np_fn(data), args.repeats)
    t_torch = median_time(lambda: torch_fn(xt), args.repeats)
    err = float(np.max(np.abs(tg_fn(x).numpy() - torch_fn(xt).numpy())))
    print(f"{label:24s} {kernels:7d} {t_kernels * 1e6:11.1f} us {t_e2e * 1e6:8.1f} us {t_numpy * 1e6:7.1f} us "
          f"{t_torch * 1e6:7.1f} us {t_torch / t_e2e:10.2f}x {t_numpy / t_e2e:10.2f}x {err:9.2e}")

if __name__ == "__main__":
  main()
