"""How fast opts are applied: the hand-coded heuristics per kernel, one BEAM round's expansion (every action applied to
a kernel: what search.children does before rendering), and optionally a whole BEAM search of a small matmul.

No kernel runs for the first two (the CUDA renderer needs no GPU); they measure the Python that applies opts.
Usage: python bench/opts_speed.py [--repeats 20] [--beam-size 64] [--no-beam]
The BEAM search runs on LLVM with IGNORE_BEAM_CACHE=1 and a throwaway cache (TGRAD_CACHE), so nothing is reused.
"""
import argparse, os, tempfile, time
import numpy as np
from tgrad import Tensor, Variable, dtypes
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.codegen.kernel import Kernel
from tgrad.runtime.llvm.renderer import LLVMRenderer
from tgrad.helpers import Context
from tgrad.ops import Ops
from tgrad.schedule import create_schedule
from timing import median_time

DEVICE = "LLVM"        # where the inputs live; the kernels are only optimized here
THREADS = 8            # CPU heuristics' thread count, fixed so that runs on different machines do the same work

def data(*shape: int, dtype=np.float32, seed: int = 0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype), device=DEVICE)

def programs() -> dict:
  rows = Variable("rows", 1, 64)
  return {
    "elementwise": lambda: (data(256, 256) * data(256, 256, seed=1) + 1.5).relu(),
    "sum_rows": lambda: data(512, 1024).sum(axis=1),
    "matmul_512": lambda: data(512, 512) @ data(512, 512, seed=1),
    "matmul_half_1024": lambda: data(1024, 1024, dtype=np.float16) @ data(1024, 1024, dtype=np.float16, seed=1),
    "matvec": lambda: data(1, 2048) @ data(2048, 1024, seed=1),
    "softmax": lambda: data(64, 1000).softmax(axis=-1),
    "layernorm": lambda: data(16, 768).layernorm(),
    "symbolic_matmul": lambda: data(64, 48)[:rows.bind(9)] @ data(48, 32, seed=1),
    "conv2d": lambda: data(1, 8, 32, 32).conv2d(data(16, 8, 3, 3, seed=1)),
    "bf16_sum": lambda: (data(64, 64).cast(dtypes.bfloat16) * 1.25).sum(axis=1),
  }

RENDERERS = {"cuda_sm90": lambda: CUDARenderer("sm_90"), "llvm": LLVMRenderer}

def kernels() -> list[tuple[str, Kernel]]:
  out = []
  for name, build in programs().items():
    items = [item for item in create_schedule([build().lazydata]) if item.ast.op is Ops.SINK]
    for renderer_name, renderer in RENDERERS.items():
      out.append((f"{name}/{renderer_name}", Kernel(items[-1].ast, renderer())))
  return out


def heuristics_time(kernel: Kernel) -> None:
  with Context(THREADS=THREADS): hand_coded_optimizations(kernel.copy())

def expansion(kernel: Kernel, actions: list) -> int:
  """search.children's opt work on one parent: every action applied to a copy (the legal ones counted)."""
  from tgrad.codegen import search
  beam = [search._Candidate(getattr(kernel, "state", kernel), "")]
  made = []
  original = search._Search.candidate_for
  def record(self, child):
    made.append(child)
    return None, False
  search._Search.candidate_for = record
  try:
    fake = object.__new__(search._Search)
    fake.started, fake.stats = time.perf_counter(), search.SearchStats()
    fake.deadline = fake.started + Context.BEAM_BUDGET
    search._Search.children(fake, beam)
  finally: search._Search.candidate_for = original
  return len(made) + fake.stats.pruned   # a pruned child was made too (then found to spill its accumulators)

def beam_search_seconds(size: int) -> float:
  from tgrad.codegen.search import search_kernel
  from tgrad.device import Device
  item = create_schedule([(data(size, size) @ data(size, size, seed=1)).lazydata])[-1]
  kernel = Kernel(item.ast, Device[DEVICE].renderer)
  start = time.perf_counter()
  with Context(IGNORE_BEAM_CACHE=1): result = search_kernel(kernel, 2)
  seconds = time.perf_counter() - start
  print(f"BEAM=2 matmul {size}x{size}: {seconds:.2f} s, {result.stats.candidates} candidates, "
        f"{result.stats.rounds} rounds, opts {result.opts}")
  return seconds

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--beam-size", type=int, default=64)
  parser.add_argument("--no-beam", action="store_true")
  args = parser.parse_args()
  from tgrad.codegen.search import ACTIONS
  heuristic_total = expansion_total = 0.0
  for label, kernel in kernels():
    heuristic = median_time(lambda: heuristics_time(kernel), args.repeats, warmup=False)
    optimized = kernel.copy()
    with Context(THREADS=THREADS): hand_coded_optimizations(optimized)
    legal = expansion(optimized, ACTIONS)
    expand = median_time(lambda: expansion(optimized, ACTIONS), max(3, args.repeats // 4), warmup=False)
    heuristic_total, expansion_total = heuristic_total + heuristic, expansion_total + expand
    print(f"{label:28s} heuristics {heuristic * 1e3:7.2f} ms   expansion {expand * 1e3:7.2f} ms "
          f"({legal} legal of {len(ACTIONS)} actions)")
  print(f"total: heuristics {heuristic_total * 1e3:.1f} ms, expansion {expansion_total * 1e3:.1f} ms")
  if not args.no_beam:
    os.environ["TGRAD_CACHE"] = os.path.join(tempfile.mkdtemp(), "cache.db")
    beam_search_seconds(args.beam_size)

if __name__ == "__main__":
  main()
