"""A prompt times a packed (GGUF-quantized) weight on the CPU: the dequantizing copy into float32 panels and the blocked
matmul (CPU_PACK=1, the default) against the packed product (CPU_PACK=0), for each projection of gemma-3-270m's layers
as its Q4_K_M file packs them, at several prompt lengths: where the two cross.

Each projection multiplies a float32 prompt (a symbolic length bound to `--rows`, at most `--max-rows`, as the model's
jitted prefill runs) both ways, each a TinyJit captured under its setting. The panels of a weight are kept between
calls (kept_copies.py), so the default's per-call cost is the matmul plus a copy of x. Times are CPU seconds of the
process per call (median of REPEATS: every thread's work, robust on a shared machine) and the best wall time.
Prints one JSON line per projection and length, then per length the sums over one layer's projections.
Usage: python bench/cpu_packed_prefill.py [--rows 1 4 16 64 128] [--max-rows 136]
"""
from __future__ import annotations
import argparse, json, statistics, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tgrad import Tensor, TinyJit, Variable  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from packed_prefill import PROJECTIONS, random_packed  # noqa: E402

DEVICE = "LLVM"
ROWS = (1, 4, 16, 64, 128)
MAX_ROWS = 136      # the bound of the prompt's length (the jitted prefill's cache length)
REPEATS = 7

def per_call(call) -> tuple[float, float]:
  """(median CPU seconds, best wall seconds) of one call."""
  cpu, wall = [], []
  for _ in range(REPEATS):
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    call()
    cpu.append(time.process_time() - start_cpu)
    wall.append(time.perf_counter() - start_wall)
  return statistics.median(cpu), min(wall)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
  parser.add_argument("--max-rows", type=int, default=MAX_ROWS)
  args = parser.parse_args()
  totals: dict = {}
  for name, ggml_type, out_features, in_features in PROJECTIONS:
    weight = random_packed(ggml_type, out_features, in_features, DEVICE, seed=out_features + in_features)
    data = Tensor(np.random.default_rng(0).standard_normal((args.max_rows, in_features)).astype(np.float32)).realize()
    steps = {}
    for pack in (1, 0):
      with Context(CPU_PACK=pack): steps[pack] = TinyJit(lambda v: weight.linear(v).realize())
    for rows in args.rows:
      x = data[:Variable("prompt_len", 1, args.max_rows).bind(rows)]
      row: dict = {"name": name, "type": ggml_type.name, "shape": [out_features, in_features], "rows": rows}
      results = {}
      for pack, step in steps.items():
        with Context(CPU_PACK=pack):
          for _ in range(2): results[pack] = step(x).numpy()   # run, capture (or replay)
          cpu, wall = per_call(lambda: step(x).numpy())
        row[f"pack{pack}_cpu_ms"], row[f"pack{pack}_wall_ms"] = round(cpu * 1e3, 3), round(wall * 1e3, 3)
        totals.setdefault(rows, {}).setdefault(pack, 0.0)
        totals[rows][pack] += cpu * 1e3
      row["max_rel_diff"] = float(np.abs(results[1] - results[0]).max() / np.abs(results[0]).max())
      print(json.dumps(row), flush=True)
  for rows, by_pack in totals.items():
    print(json.dumps({"rows": rows, "layer_pack1_cpu_ms": round(by_pack[1], 3),
                      "layer_pack0_cpu_ms": round(by_pack[0], 3),
                      "pack0_over_pack1": round(by_pack[0] / by_pack[1], 2)}))

if __name__ == "__main__":
  main()
