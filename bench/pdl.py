"""What Programmatic Dependent Launch buys: a chain of dependent tgrad kernels captured by TinyJit and replayed as a
CUDA graph, GPU time per replay (CUDA events over back-to-back replays) with PDL off, and on with the prologue in
each order the renderer could write it (wait then launch_dependents, the default; launch_dependents then wait), each
with and without the L2 prefetch of a kernel's largest read-only input before its wait (PDL_PREFETCH,
tgrad/runtime/cuda/prefetch.py).

Elementwise chains: each kernel reads the previous one's output (N elements) and writes its own, so every edge is a
real dependency; the sizes run from launch-bound (1 element per kernel, the floor probe's empty kernels) to a
bandwidth-bound 4 MiB. Matvec chains (what a decode step is made of): x ← x·Wᵢᵀ over float16 weights of D×D, each its
own, so each kernel streams a weight the predecessor doesn't touch (what the prefetch can fetch early). Also the count
of programmatic edges in the captured graphs (0 with PDL off). Prints a table and writes JSON to $OUT/pdl.json when
OUT is set. Usage: python bench/pdl.py [--kernels 150] [--matvec-sizes 640 1024 2048]
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
MATVEC_SIZES = (640, 1024, 2048)   # D of the D×D float16 weights: 0.8, 2 and 8 MB (gemma-3-270m's projections)
MATVEC_KERNELS = 100               # weights in a matvec chain, all distinct: 82 MB at D = 640, more than an H100's L2
# name → (PDL, prologue, PDL_PREFETCH)
VARIANTS = {"off": (0, (WAIT, LAUNCH), 0), "wait, launch": (1, (WAIT, LAUNCH), 0),
            "launch, wait": (1, (LAUNCH, WAIT), 0), "prefetch, wait, launch": (1, (WAIT, LAUNCH), 1)}

def chain(kernels: int):
  def step(x: Tensor) -> Tensor:
    for i in range(kernels): x = (x * 0.999 + (i % 7)).contiguous()
    return x
  return step

def matvec_chain(weights: list[Tensor]):
  def step(x: Tensor) -> Tensor:
    for w in weights: x = (x @ w.T).contiguous()
    return x
  return step

def measure(kernels: int, elements: int, pdl: int, prologue: tuple[str, str], prefetch: int,
            matvec: bool = False) -> dict:
  """One chain (elementwise of `elements`, or `kernels` matvecs of elements×elements) timed under one variant."""
  cuda_renderer.DEPENDENT_LAUNCH_PROLOGUE = prologue   # read by the renderer at each render
  from tgrad.runtime.cuda.graph import CUDAGraph
  rng = np.random.default_rng(0)
  with Context(PDL=pdl, PDL_PREFETCH=prefetch):
    if matvec:
      weights = [Tensor((rng.standard_normal((elements, elements)) / elements ** 0.5).astype(np.float16),
                        device="CUDA").realize() for _ in range(kernels)]
      jitted = TinyJit(matvec_chain(weights))
      x = Tensor(rng.standard_normal((1, elements)).astype(np.float16), device="CUDA").realize()
    else:
      jitted = TinyJit(chain(kernels))
      x = Tensor(rng.standard_normal(elements).astype(np.float32), device="CUDA")
    for _ in range(3): jitted(x)   # run, capture, replay
    seconds = event_seconds(lambda: jitted(x), REPLAYS)
    graphs = [s for r in jitted.captured.runners for s in getattr(r, "steps", ()) if isinstance(s, CUDAGraph)]
  return {"us_per_replay": seconds * 1e6, "us_per_kernel": seconds * 1e6 / kernels,
          "programmatic_edges": sum(sum(g.programmatic) for g in graphs), "graphs": len(graphs)}

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--kernels", type=int, default=KERNELS)
  parser.add_argument("--matvec-sizes", type=int, nargs="*", default=list(MATVEC_SIZES))
  parser.add_argument("--matvec-kernels", type=int, default=MATVEC_KERNELS)
  args = parser.parse_args()
  rows = []
  workloads = [("elementwise", args.kernels, elements, False) for elements in ELEMENTS] + \
              [("matvec", args.matvec_kernels, size, True) for size in args.matvec_sizes]
  for workload, kernels, elements, matvec in workloads:
    for name, (pdl, prologue, prefetch) in VARIANTS.items():
      result = {"workload": workload, "elements": elements, "variant": name,
                **measure(kernels, elements, pdl, prologue, prefetch, matvec)}
      rows.append(result)
      print(f"{workload:<11} {elements:>8}  PDL {name:<22} {result['us_per_replay']:9.1f} us per replay  "
            f"{result['us_per_kernel']:6.2f} us per kernel  {result['programmatic_edges']} programmatic edges")
  if os.environ.get("OUT"): Path(os.environ["OUT"], "pdl.json").write_text(json.dumps(rows, indent=1))

if __name__ == "__main__": main()
