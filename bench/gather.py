"""Embedding lookups on the CPU: `table[ids]` as a data-dependent load (GATHER) against the one-hot formulation it
replaced (a compare with ARANGE and a sum over the vocabulary, `Tensor._gather_one_hot`).

The table is gemma-3-270m's 262144×640 float32 embedding; ids are 1 and 16 random tokens, realized on the device
first (so their bounds check is a lazy flag, as for token ids computed on the device). Per case: the kernel time (the
median over --repeats of timed launches of the lookup's kernels, scheduled once), and the eager time of a whole
`table[ids].realize()` call (scheduling through the schedule cache, the bounds flag's kernel, launches). Every result
is checked against numpy first.
Usage: python bench/gather.py [--repeats N] [--vocab V] [--hidden H]
"""
from __future__ import annotations
import argparse, os, sys, time
from typing import Callable
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.realize import lower_schedule  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402
from tgrad.tensor_ops.indexing import _IndexPlan  # noqa: E402

VOCAB, HIDDEN = 262144, 640   # gemma-3-270m's embedding table
TOKEN_COUNTS = (1, 16)
REPEATS = 5
ONE_HOT_REPEATS = 2           # the one-hot lookup reads the whole table per token: seconds per call

def one_hot_lookup(table: Tensor, ids: Tensor) -> Tensor:
  return table._gather_one_hot(_IndexPlan(table.shape, ids, table.device))

def gather_lookup(table: Tensor, ids: Tensor) -> Tensor: return table[ids]

def kernel_seconds(out: Tensor, repeats: int) -> float:
  """Median over repeats of the summed kernel times of the schedule that computes `out` (scheduled once)."""
  items = [item for item in create_schedule([out.lazydata]) if item.ast.op is Ops.SINK]
  exec_items = lower_schedule(items)
  times = [sum(item.run(wait=True) or 0.0 for item in exec_items) for _ in range(repeats)]
  return float(np.median(times))

def eager_seconds(lookup: Callable, table: Tensor, ids: Tensor, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    lookup(table, ids).realize()
    times.append(time.perf_counter() - start)
  return float(np.median(times))

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--repeats", type=int, default=REPEATS)
  parser.add_argument("--vocab", type=int, default=VOCAB)
  parser.add_argument("--hidden", type=int, default=HIDDEN)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  weights = rng.standard_normal((args.vocab, args.hidden), dtype=np.float32)
  table = Tensor(weights, device="LLVM").realize()
  print(f"table {args.vocab}x{args.hidden} float32 ({weights.nbytes / 2**20:.0f} MiB), device LLVM (CPU)")
  print(f"{'ids':>4s} {'path':8s} {'kernel':>15s} {'eager call':>15s}")
  for count in TOKEN_COUNTS:
    token_ids = rng.integers(0, args.vocab, count).astype(np.int32)
    ids = Tensor(token_ids, device="LLVM").realize()
    for name, lookup, repeats in (("one-hot", one_hot_lookup, min(args.repeats, ONE_HOT_REPEATS)),
                                  ("gather", gather_lookup, args.repeats)):
      np.testing.assert_array_equal(lookup(table, ids).numpy(), weights[token_ids])   # also compiles its kernels
      kernel = kernel_seconds(lookup(table, ids), repeats)
      eager = eager_seconds(lookup, table, ids, repeats)
      print(f"{count:4d} {name:8s} {kernel * 1e6:12.1f} us {eager * 1e6:12.1f} us")

if __name__ == "__main__": main()
