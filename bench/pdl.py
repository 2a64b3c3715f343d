"""What Programmatic Dependent Launch buys: a chain of dependent tgrad kernels captured by TinyJit and replayed as a
CUDA graph, GPU time per replay (CUDA events over back-to-back replays) with PDL off, and on with the prologue in
each order the renderer could write it (wait then launch_dependents, the default; launch_dependents then wait).

Each kernel reads the previous one's output (N elements) and writes its own, so every edge is a real dependency; the
sizes run from launch-bound (1 element per kernel, the floor probe's empty kernels) to a bandwidth-bound 4 MiB. Also
the count of programmatic edges in the captured graphs (0 with PDL off). Prints a table and writes JSON to
$OUT/pdl.json when OUT is set. Usage: python bench/pdl.py [--kernels 150]
"""
from __future__ import annotations
import argparse, json, os, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from tgrad import Tensor, TinyJit  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
import tgrad.runtime.cuda.renderer as cuda_renderer  # noqa: E402
from gpu import event_seconds  # noqa: E402

KERNELS = 150
ELEMENTS = (1, 4096, 1 << 20)   # float32 elements each kernel reads and writes
REPLAYS = 50
WAIT, LAUNCH = cuda_renderer.DEPENDENT_LAUNCH_PROLOGUE
VARIANTS = {"off": (0, (WAIT, LAUNCH)), "wait, launch": (1, (WAIT, LAUNCH)), "launch, wait": (1, (LAUNCH, WAIT))}

def chain(kernels: int):
  def step(x: Tensor) -> Tensor:
    for i in range(kernels): x = (x * 0.999 + (i % 7)).contiguous()
    return x
  return step

def measure(kernels: int, elements: int, pdl: int, prologue: tuple[str, str]) -> dict:
  cuda_renderer.DEPENDENT_LAUNCH_PROLOGUE = prologue   # read by the renderer at each render
  from tgrad.runtime.cuda.graph import CUDAGraph
  with Context(PDL=pdl):
    jitted = TinyJit(chain(kernels))
    x = Tensor(np.random.default_rng(0).standard_normal(elements).astype(np.float32), device="CUDA")
    for _ in range(3): jitted(x)   # run, capture, replay
    seconds = event_seconds(lambda: jitted(x), REPLAYS)
    graphs = [s for r in jitted.captured.runners for s in getattr(r, "steps", ()) if isinstance(s, CUDAGraph)]
  return {"us_per_replay": seconds * 1e6, "us_per_kernel": seconds * 1e6 / kernels,
          "programmatic_edges": sum(sum(g.programmatic) for g in graphs), "graphs": len(graphs)}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--kernels", type=int, default=KERNELS)
  args = parser.parse_args()
  rows = []
  for elements in ELEMENTS:
    for name, (pdl, prologue) in VARIANTS.items():
      result = {"elements": elements, "variant": name, **measure(args.kernels, elements, pdl, prologue)}
      rows.append(result)
      print(f"{elements:>8} elements  PDL {name:<13} {result['us_per_replay']:9.1f} us per replay  "
            f"{result['us_per_kernel']:6.2f} us per kernel  {result['programmatic_edges']} programmatic edges")
  if os.environ.get("OUT"): Path(os.environ["OUT"], "pdl.json").write_text(json.dumps(rows, indent=1))

if __name__ == "__main__": main()
