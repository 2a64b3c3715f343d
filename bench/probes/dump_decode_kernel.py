"""Write one kernel of Gemma 3's decode step as CUDA C, for timing it alone or editing it by hand (kernel_chain.py).

Schedules the step for CUDA without a GPU (bench/decode_kernels.py), optimizes kernel INDEX with the GPU heuristics,
renders it with Programmatic Dependent Launch, and writes NAME.cu and NAME.json (grid, block, the kernel's buffers as
(dtype, size), how many lifted scalars follow them, which buffer is the weight, the opts). The function is named `k`.
Usage: python bench/probes/dump_decode_kernel.py INDEX NAME [--packed] [--dtype float16] [--position 100]
(`python bench/decode_kernels.py` lists the step's kernels by index.)
"""
from __future__ import annotations
import argparse, json, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from decode_kernels import decode_step_kernels  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.codegen.kernel import Kernel  # noqa: E402
from tgrad.codegen.linearizer import linearize  # noqa: E402
from tgrad.helpers import Context  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.runtime.cuda.renderer import CUDARenderer  # noqa: E402

ARCH = "sm_90"
SCALAR_PARAMETER = "long long scalar"   # how the renderer declares a lifted scalar's parameter

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("index", type=int)
  parser.add_argument("name")
  parser.add_argument("--packed", action="store_true", help="packed weights in the types of a Q4_K_M file")
  parser.add_argument("--dtype", default="float16")
  parser.add_argument("--position", type=int, default=100)
  args = parser.parse_args()
  item = decode_step_kernels("270m", "CUDA", args.dtype, args.position, packed=args.packed)[args.index]
  if item.ast.op is not Ops.SINK: raise SystemExit(f"kernel {args.index} is a custom kernel (flash decoding): no AST")
  with Context(PDL=1):
    kernel = Kernel(item.ast, CUDARenderer(ARCH))
    hand_coded_optimizations(kernel)
    uops = linearize(kernel)
    source = kernel.renderer.render("k", uops)
  grid, block = [1, 1, 1], [1, 1, 1]
  for u in uops:
    if u.op is Ops.SPECIAL:
      name, size = u.arg
      (grid if name.startswith("gidx") else block)[int(name[-1])] = size
  buffers = [(b.dtype.name, b.size) for b in item.bufs]
  weight = max(range(len(buffers)), key=lambda i: buffers[i][1] * (1 if buffers[i][0] == "uint8" else 2))
  with open(args.name + ".cu", "w") as f: f.write(source)
  with open(args.name + ".json", "w") as f:
    json.dump({"grid": grid, "block": block, "bufs": buffers, "scalars": source.count(SCALAR_PARAMETER),
               "weight": weight, "opts": str(kernel.applied_opts)}, f)
  print(args.name, grid, block, buffers, "weight", weight, kernel.applied_opts)

if __name__ == "__main__":
  main()
