"""CPU reductions: tgrad (LLVM) vs torch vs numpy, interleaved in one run, as GB/s and ratios to torch.

Cases: sums, means and maxes over a long row (16M float32, split across partials and threads; 16M+1, which no part
count divides) and over either axis of a 4096² matrix, the columns of a narrow 4M×4 one, softmax and log_softmax over
2048² rows and one 4M-long row, rms norm and layer norm over 2048² rows, and a 64 MB copy (numpy, torch) as the
bandwidth ceiling. GB/s counts the bytes a case must move at least (its input read once, its output written once).
Each round times every library once per case, one after the other in an order drawn anew each round (seeded), so a
change in the machine's load hits all of them alike and no library always runs after the same other one (on the 2-core
VM the same torch call took 0.8 or 2.2 ms depending on what ran before it: cache contents and the other core's
state). Reported: the best and the median of ROUNDS rounds, and tgrad/torch as the median of each round's own ratio
(the machine may be shared: compare the ratios of one run, and note the load average printed with them). Each
library reads an input of its own (tgrad its buffer, torch a copy, numpy the array): torch reading numpy's array
found it in L3 whenever numpy had just summed it (70 GB/s, twice the memory's), which tgrad's own buffer never is.
Usage: python bench/cpu_reduce.py [--rounds N] [--only TEXT]
"""
from __future__ import annotations
import argparse, os, random, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
import timing  # noqa: E402

ROUNDS = 15
ROUND_ORDER_SEED = 0
LONG = 16 << 20
MATRIX = (4096, 4096)
ROWS = (2048, 2048)
ROW = (1, 4 << 20)
NARROW = (4 << 20, 4)

try:
  import torch
  torch.set_grad_enabled(False)
except ImportError:
  torch = None

def np_softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)

def np_log_softmax(x: np.ndarray) -> np.ndarray:
  shifted = x - x.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))

def np_rms_norm(x: np.ndarray) -> np.ndarray: return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)

def np_layer_norm(x: np.ndarray) -> np.ndarray:
  centered = x - x.mean(-1, keepdims=True)
  return centered / np.sqrt((centered * centered).mean(-1, keepdims=True) + 1e-5)

def cases():
  """(name, bytes moved, input array, tgrad fn, torch fn, numpy fn); a fn may be None."""
  rng = np.random.default_rng(0)
  long = rng.random(LONG, dtype=np.float32)
  matrix = rng.standard_normal(MATRIX, dtype=np.float32)
  rows = rng.standard_normal(ROWS, dtype=np.float32)
  row = rng.standard_normal(ROW, dtype=np.float32)
  copy_out = np.empty_like(long)
  yield ("copy 64MB (ceiling)", 2 * long.nbytes, long, None, lambda t: t.clone(), lambda a: np.copyto(copy_out, a))
  yield "sum 16M", long.nbytes, long, lambda t: t.sum(), lambda t: t.sum(), lambda a: a.sum()
  odd = rng.random(LONG + 1, dtype=np.float32)
  yield "sum 16M+1", odd.nbytes, odd, lambda t: t.sum(), lambda t: t.sum(), lambda a: a.sum()
  yield "mean 16M", long.nbytes, long, lambda t: t.mean(), lambda t: t.mean(), lambda a: a.mean()
  yield "max 16M", long.nbytes, long, lambda t: t.max(), lambda t: t.max(), lambda a: a.max()
  yield "sum 4096² axis=-1", matrix.nbytes, matrix, lambda t: t.sum(-1), lambda t: t.sum(-1), lambda a: a.sum(-1)
  yield "sum 4096² axis=0", matrix.nbytes, matrix, lambda t: t.sum(0), lambda t: t.sum(0), lambda a: a.sum(0)
  narrow = rng.standard_normal(NARROW, dtype=np.float32)
  yield "sum 4M×4 axis=0", narrow.nbytes, narrow, lambda t: t.sum(0), lambda t: t.sum(0), lambda a: a.sum(0)
  yield "max 4096² axis=0", matrix.nbytes, matrix, lambda t: t.max(0), lambda t: t.amax(0), lambda a: a.max(0)
  yield ("softmax 2048²", 2 * rows.nbytes, rows, lambda t: t.softmax(-1), lambda t: torch.softmax(t, -1), np_softmax)
  yield ("log_softmax 2048²", 2 * rows.nbytes, rows, lambda t: t.log_softmax(-1), lambda t: torch.log_softmax(t, -1),
         np_log_softmax)
  yield ("softmax 1×4M", 2 * row.nbytes, row, lambda t: t.softmax(-1), lambda t: torch.softmax(t, -1), np_softmax)
  yield ("rms_norm 2048²", 2 * rows.nbytes, rows, lambda t: t.rms_norm(-1), lambda t: t * torch.rsqrt(
    (t * t).mean(-1, keepdim=True) + 1e-6), np_rms_norm)
  yield ("layer_norm 2048²", 2 * rows.nbytes, rows, lambda t: t.layernorm(-1),
         lambda t: torch.nn.functional.layer_norm(t, t.shape[-1:]), np_layer_norm)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--rounds", type=int, default=ROUNDS)
  parser.add_argument("--only", default="", help="only the cases whose name contains this text")
  args = parser.parse_args()
  print(f"load average {os.getloadavg()[0]:.2f}; torch {torch.__version__ if torch else '-'} "
        f"({torch.get_num_threads() if torch else 0} threads), numpy {np.__version__}")
  header = f"{'case':22s} {'tgrad GB/s':>17s} {'torch GB/s':>17s} {'numpy GB/s':>17s} {'tgrad/torch':>12s}" + \
    f" {'max err':>9s}"
  print(header + "\n" + "-" * len(header))
  print(f"{'':22s} {'best   median':>17s} {'best   median':>17s} {'best   median':>17s} {'best median':>12s}")
  rng = random.Random(ROUND_ORDER_SEED)
  for name, moved, x, tg_fn, torch_fn, np_fn in cases():
    if args.only not in name: continue
    tensor = Tensor(x).realize()
    fns = [(lambda: tg_fn(tensor).realize()) if tg_fn else None,
           (lambda t=torch.from_numpy(x.copy()): torch_fn(t)) if torch and torch_fn else None,
           (lambda: np_fn(x)) if np_fn else None]
    times = timing.interleaved_rounds(fns, args.rounds, order=rng)   # one call each a round; warm-up compiles first
    def rates(spent: list[float]) -> str:
      return f"{moved / min(spent) / 1e9:8.1f} {moved / np.median(spent) / 1e9:8.1f}" if spent else f"{'-':>17s}"
    ratio = f"{min(times[1]) / min(times[0]):5.2f} {np.median(np.array(times[1]) / np.array(times[0])):6.2f}" \
      if times[0] and times[1] else f"{'-':>12s}"
    err = float(np.max(np.abs(tg_fn(tensor).numpy() - np_fn(x)))) if tg_fn and np_fn else float("nan")
    print(f"{name:22s} {rates(times[0])} {rates(times[1])} {rates(times[2])} {ratio:>12s} {err:9.2e}")
  print(f"load average {os.getloadavg()[0]:.2f}")

if __name__ == "__main__":
  main()
