"""CPU benchmark: tgrad (LLVM) vs numpy vs torch (if installed), in one run, as ratios to numpy.

Each case is timed end to end on already-realized inputs: tgrad's time includes building the lazy graph, scheduling
and launching (the Python overhead a user pays), after one warm-up run that compiles. The libraries are timed in
interleaved rounds (timing.interleaved_rounds: ROUNDS rounds, each library BLOCK calls a round, in an order drawn anew
each round, after a pause that lets the other libraries' spinning threads sleep and untimed calls that wake the
machine up again): rates are the median over rounds, ratios the median of each round's own ratio. This machine's memory
bandwidth moves between ~35 and ~60 GB/s from minute to minute; timed one library after the other, a ratio was
decided by which library drew the fast minutes. Compare the ratios of one run, not rates across runs.
Usage: python bench/cpu.py [--quick] [--only TEXT] [--rounds N]   (BEAM=2 python bench/cpu.py searches kernels first;
--only: the cases whose name contains TEXT, e.g. --only matmul)
"""
from __future__ import annotations
import argparse, os, random, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
import timing  # noqa: E402
from tgrad.helpers import Context  # noqa: E402

ROUNDS = 7
BLOCK = 3             # calls of each library a round, back to back: the median of them is the round's time
ROUND_ORDER_SEED = 0
# Before each block: numpy's OpenBLAS threads spin for about 2^28 cycles (~0.1 s) after a call, and torch's OpenMP
# threads for a while too; a block started meanwhile has only one core for its second thread (tgrad's matmul 1024 timed
# right after numpy's: 0.57-0.66x numpy, against 1.0x alone).
OTHER_THREADS_IDLE_SECONDS = 0.15
SETTLE_SECONDS = 0.05   # then untimed calls (timing.interleaved_rounds says why)
ELEMENTWISE_SIZE = 16 * 1024 * 1024
SOFTMAX_SHAPE = (2048, 2048)
MLP_SHAPE = (256, 1024, 4096)   # batch × features → hidden → features: the forward of a transformer's MLP block

try:
  import torch
  torch.set_grad_enabled(False)
except ImportError:
  torch = None

def tgrad_softmax(x: Tensor) -> Tensor: return x.softmax(axis=-1)

def np_softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)

def cases(quick: bool):
  rng = np.random.default_rng(0)
  for n in ((512, 1024) if quick else (512, 1024, 2048)):
    a, b = rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)
    yield f"matmul {n} fp32", 2 * n**3, "GFLOP/s", (a, b), lambda x, y: x @ y, lambda x, y: x @ y
  batch, features, hidden = MLP_SHAPE
  x = rng.standard_normal((batch, features), dtype=np.float32)
  w1, w2 = ((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32) for shape in
            ((features, hidden), (hidden, features)))
  yield (f"MLP {batch}x{features}>{hidden}>{features}", 4 * batch * features * hidden, "GFLOP/s", (x, w1, w2),
         lambda x, a, b: (x @ a).relu() @ b, lambda x, a, b: np.maximum(x @ a, 0) @ b)
  size = ELEMENTWISE_SIZE // (4 if quick else 1)
  a, b, c = (rng.random(size, dtype=np.float32) for _ in range(3))
  yield (f"(a*b+c).relu() {size >> 20}M", 4 * size * 4, "GB/s", (a, b, c), lambda x, y, z: (x * y + z).relu(),
         lambda x, y, z: np.maximum(x * y + z, 0))
  yield f"sum {size >> 20}M", size * 4, "GB/s", (a,), lambda x: x.sum(), lambda x: x.sum()
  s = rng.standard_normal(SOFTMAX_SHAPE, dtype=np.float32)
  yield f"softmax {SOFTMAX_SHAPE[0]}x{SOFTMAX_SHAPE[1]}", 2 * s.size * 4, "GB/s", (s,), tgrad_softmax, np_softmax

def torch_fn(name: str):
  if name.startswith("matmul"): return lambda x, y: x @ y
  if name.startswith("MLP"): return lambda x, a, b: torch.relu(x @ a) @ b
  if name.startswith("(a*b+c)"): return lambda x, y, z: torch.relu(x * y + z)
  if name.startswith("sum"): return lambda x: x.sum()
  return lambda x: torch.softmax(x, dim=-1)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--quick", action="store_true", help="smaller sizes, for a fast check")
  parser.add_argument("--only", default="", help="only the cases whose name contains this text")
  parser.add_argument("--rounds", type=int, default=ROUNDS)
  args = parser.parse_args()
  print(f"tgrad LLVM vs numpy {np.__version__}" + (f" vs torch {torch.__version__} ({torch.get_num_threads()} threads)"
                                                   if torch else "") + f", BEAM={Context.BEAM}, "
        f"load average {os.getloadavg()[0]:.2f}")
  header = f"{'case':28s} {'unit':8s} {'tgrad':>9s} {'numpy':>9s} {'torch':>9s} {'tgrad/numpy':>12s} " \
           f"{'tgrad/torch':>12s} {'max err':>9s}"
  print(header)
  print("-" * len(header))
  order = random.Random(ROUND_ORDER_SEED)
  for name, work, unit, inputs, tg_fn, np_fn in cases(args.quick):
    if args.only not in name: continue
    tensors = [Tensor(x).realize() for x in inputs]
    # torch reads memory of its own, as tgrad does (cpu_reduce.py says why)
    torch_inputs = [torch.from_numpy(x.copy()) for x in inputs] if torch else []
    fns = [lambda: tg_fn(*tensors).realize(), lambda: np_fn(*inputs),
           (lambda: torch_fn(name)(*torch_inputs)) if torch else None]
    t_tg, t_np, t_torch = timing.interleaved_rounds(fns, args.rounds, BLOCK, order, OTHER_THREADS_IDLE_SECONDS,
                                                    SETTLE_SECONDS)
    err = float(np.max(np.abs(tg_fn(*tensors).numpy() - np_fn(*inputs))))
    rate = lambda times: f"{work / np.median(times) / 1e9:9.1f}" if times else f"{'-':>9s}"
    vs_torch = f"{timing.round_ratio(t_torch, t_tg):11.2f}x" if t_torch else f"{'-':>12s}"
    print(f"{name:28s} {unit:8s} {rate(t_tg)} {rate(t_np)} {rate(t_torch)} {timing.round_ratio(t_np, t_tg):11.2f}x "
          f"{vs_torch} {err:9.2e}")

if __name__ == "__main__":
  main()
