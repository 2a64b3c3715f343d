"""BEAM search cost of a whole training step: a 2-layer MLP (SGD) with BEAM=2, run twice in fresh processes.

The first process searches every kernel of the step (forward, backward, optimizer) and caches the winners; the
second finds them all in the cache and searches nothing. Each prints the step's wall time, how many kernels were
searched, and the median search time per kernel. Usage: python bench/search_mlp.py [--device LLVM|CUDA]
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time

BATCH, IN_FEATURES, HIDDEN, CLASSES = 128, 784, 256, 10

def one_step(device: str) -> dict:
  """Child process (DEVICE is set in its environment): one training step under BEAM, and what the search did."""
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  import numpy as np
  from tgrad import Tensor, nn
  from tgrad.nn.optim import SGD
  from tgrad.nn.state import get_parameters
  import tgrad.codegen.search as search
  searches: list[float] = []
  original = search.search_kernel
  def counted(kernel, beam_width):
    start = time.perf_counter()
    result = original(kernel, beam_width)
    if not result.stats.from_cache: searches.append(time.perf_counter() - start)
    return result
  search.search_kernel = counted
  Tensor.manual_seed(0)
  layers = [nn.Linear(IN_FEATURES, HIDDEN), nn.Linear(HIDDEN, CLASSES)]
  optimizer = SGD(get_parameters(layers), lr=0.01)
  rng = np.random.default_rng(0)
  x = Tensor(rng.standard_normal((BATCH, IN_FEATURES), dtype=np.float32), device=device)
  y = Tensor(rng.integers(0, CLASSES, BATCH).astype(np.int32), device=device)
  start = time.perf_counter()
  with Tensor.train():
    optimizer.zero_grad()
    loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize(loss, *optimizer.schedule_step())
  return {"step_s": time.perf_counter() - start, "kernels_searched": len(searches),
          "median_search_s": statistics.median(searches) if searches else 0.0, "loss": float(loss.item())}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--device", default="LLVM")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    print(json.dumps(one_step(args.device)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, BEAM="2", TGRAD_CACHE=os.path.join(tmp, "cache.db"), DEVICE=args.device)
    for run in ("first run (searches)", "second run (cached)"):
      out = subprocess.run([sys.executable, __file__, "--child", "--device", args.device], env=env, check=True,
                           capture_output=True, text=True).stdout.strip().splitlines()[-1]
      print(f"{run:22s} {out}", flush=True)

if __name__ == "__main__":
  main()
