"""Time CUDA kernels as a decode step runs them: each file NAME.cu (with NAME.json, dump_decode_kernel.py) is launched
NODES times as one CUDA graph with programmatic (PDL) edges, every node reading its own copy of the kernel's weight
(COPIES copies: more than L2 holds, so each node's weight comes from memory, prefetched before its wait as in the step;
int32 buffers, indices such as a token id, are zeros).
Prints µs per kernel (CUDA events over REPS graph launches, the best and median of ROUNDS rounds, the files interleaved)
and, for consecutive pairs of files, the largest difference of their outputs (the same inputs: an edited kernel against
the one it was made from). Lifted scalars are passed as 1.0f. A file whose NAME.json is missing gets the gate/up
kernel's (grid 512, block 8×20). Needs a GPU and pycuda.
A chain ranks variants of one kernel; it does not size a change to the step: behind copies of itself a kernel's blocks
can't all be resident beside its predecessor's, and in the step its neighbours are other kernels. Moving the gate/up
kernel's second-pass loads before its barrier took it from 5.73 to 3.87 µs here and the packed step 1.5 %
(docs/design-notes.md, "A later pass's loads"): measure a kept change with bench/gemma_gguf_gpu.py, trees alternated.
For a small weight, 18 copies stay in L2 (60 MB on an H200): `--copies 150` makes every node read its own from memory
(the gate/up kernel of gemma-3-270m took the same 3.70 µs both ways: its time is not in its loads, docs/benchmarks.md,
"eighteenth session").
Usage: python bench/probes/kernel_chain.py [--nodes N] [--copies N] [--reps N] [--rounds N] A.cu B.cu ...
"""
from __future__ import annotations
import argparse, json, os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import pycuda.driver as cuda  # noqa: E402

NODES, COPIES, REPS, ROUNDS = 36, 18, 200, 7
ONE_F32_BITS = 0x3F800000
NUMPY = {"float16": np.float16, "float32": np.float32, "uint8": np.uint8, "int32": np.int32}

def main() -> None:
  global NODES, COPIES, REPS, ROUNDS
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("files", nargs="+", help="kernel sources NAME.cu, each with its NAME.json")
  parser.add_argument("--nodes", type=int, default=NODES, help="launches in the graph")
  parser.add_argument("--copies", type=int, default=COPIES, help="distinct copies of the weight the nodes cycle over")
  parser.add_argument("--reps", type=int, default=REPS, help="graph launches timed a round")
  parser.add_argument("--rounds", type=int, default=ROUNDS)
  args = parser.parse_args()
  NODES, COPIES, REPS, ROUNDS = args.nodes, args.copies, args.reps, args.rounds
  cuda.init()
  context = cuda.Device(0).make_context()
  try: run(args.files)
  finally: context.pop()

def run(names: list[str]) -> None:
  from tgrad.helpers import Context
  from tgrad.runtime.cuda.graph import CUDAGraph, KernelLaunch
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  arch = "sm_%d%d" % cuda.Device(0).compute_capability()
  rng = np.random.default_rng(0)
  def upload(dtype: str, size: int, weight: bool = False):
    if dtype == "int32": return cuda.to_device(np.zeros(size, np.int32))   # indices (a token id): the first row
    values = rng.integers(0, 255, size) if dtype == "uint8" else rng.standard_normal(size) * (0.02 if weight else 1)
    return cuda.to_device(values.astype(NUMPY[dtype]))
  made: dict[str, list] = {}
  graphs = {}
  for name in names:
    spec_path = name[:-3] + ".json"
    spec = json.load(open(spec_path)) if os.path.exists(spec_path) else \
      {"grid": [512, 1, 1], "block": [8, 20, 1], "bufs": [["float16", 4096], ["float32", 640], ["float16", 640],
       ["float16", 640], ["float16", 640], ["float16", 2621440]], "scalars": 4, "weight": 5}
    key = json.dumps(spec["bufs"])
    if key not in made:   # files over the same buffers share them, so their outputs compare
      made[key] = [[upload(*b, weight=True) for _ in range(COPIES)] if i == spec["weight"] else upload(*b)
                   for i, b in enumerate(spec["bufs"])]
    buffers = made[key]
    function = cuda.module_from_buffer(compile_cuda(open(name).read(), arch)).get_function("k")
    def arguments(node: int) -> list[int]:
      return [int(b[node % COPIES]) if isinstance(b, list) else int(b) for b in buffers] + \
        [ONE_F32_BITS] * spec["scalars"]
    kinds = "P" * len(buffers) + "q" * spec["scalars"]
    launches = [KernelLaunch(function, tuple(spec["grid"]), tuple(spec["block"]), 0, arguments(node), kinds, True)
                for node in range(NODES)]
    with Context(PDL=1): graphs[name] = (CUDAGraph(launches), buffers[0], spec)
    print(f"{name}: {function.num_regs} registers, grid {spec['grid']}, block {spec['block']}")
  start, end = cuda.Event(), cuda.Event()
  times: dict[str, list[float]] = {name: [] for name in graphs}
  outputs = {}
  for _ in range(ROUNDS):
    for name, (graph, output, spec) in graphs.items():
      for _ in range(10): graph.launch()
      start.record()
      for _ in range(REPS): graph.launch()
      end.record()
      end.synchronize()
      times[name].append(start.time_till(end) / REPS / NODES * 1000)
      dtype, size = spec["bufs"][0]
      host = np.empty(size, NUMPY[dtype])
      cuda.memcpy_dtoh(host, output)
      outputs[name] = host.astype(np.float64)
  for name, spent in times.items():
    print(f"{name:40s} µs per kernel in a PDL graph: best {min(spent):.3f} median {sorted(spent)[len(spent) // 2]:.3f}")
  ordered = list(outputs)
  for a, b in zip(ordered[::2], ordered[1::2]):
    if outputs[a].shape == outputs[b].shape:
      with np.errstate(invalid="ignore"):
        print(f"{a} vs {b}: max |difference| {float(np.nanmax(np.abs(outputs[a] - outputs[b]))):.3g}")

if __name__ == "__main__":
  main()
