"""Golden sources: every kernel of a representative set of programs, rendered by both renderers, hashed.

The programs cover elementwise chains, broadcasting, reductions (small, blocked, split), matmuls (heuristics, tensor
cores, shared-memory staging, the float32 matmul template of OptOps.SGEMM), gathers, row kernels (softmax, layernorm,
RMSNorm), GROUP reduces, symbolic shapes and float16/bfloat16. Each kernel is linearized and rendered for the CUDA
renderer (sm_75 and sm_90, and sm_90a for the matmuls: the warpgroup-MMA kernel of OptOps.WGMMA; no GPU needed) and
for the LLVM renderer, unoptimized, with the heuristics, with a few fixed opt lists and along seeded random walks
over a frozen copy of the search's actions. The sha256 of every source is compared with test/unit/codegen_golden.json,
so any change to the code that scheduling and codegen make is visible: a refactor must leave it unchanged; a deliberate
change (and bump of codegen.CODEGEN_VERSION where generated code changes) regenerates the file with

  PYTHONPATH=. python test/unit/test_codegen_golden.py --update

and says in its commit why the sources changed.
"""
from __future__ import annotations
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Callable, Iterator
import numpy as np
from tgrad import Tensor, Variable, dtypes
from tgrad.helpers import Context
from tgrad.nn.quant import BLOCK_LAYOUTS, GGMLType, QuantizedTensor
from tgrad.regions import LOWERINGS
from tgrad.ops import Ops
from tgrad.schedule import create_schedule
from tgrad.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tgrad.codegen.compile import render_source
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.runtime.cuda.renderer import CUDARenderer
from tgrad.runtime.llvm.renderer import LLVMRenderer

GOLDEN_PATH = Path(__file__).with_name("codegen_golden.json")
DEVICE = "LLVM"            # where the programs' inputs live; nothing is run beyond what building them needs
FIXED_THREADS = 8          # THREADS for the CPU heuristics, so the golden file doesn't depend on the machine's cores
FIXED_SIMD = (32, 16)      # AVX2's SIMD registers (bytes, count) for the CPU register tiles, for the same reason
RANDOM_WALKS = 3           # seeded random opt sequences per kernel and renderer
RANDOM_WALK_STEPS = 4      # opts tried per walk (illegal ones are skipped)
BIG_SHARED_MEMORY = 227 * 1024   # an H100's opt-in shared memory per block: tiles above 48 KiB go dynamic
RENDERERS: dict[str, Callable] = {
  "cuda_sm90": lambda: CUDARenderer("sm_90"), "cuda_sm75": lambda: CUDARenderer("sm_75"),
  "cuda_sm90_big_shared": lambda: CUDARenderer("sm_90", shared_memory_bytes=BIG_SHARED_MEMORY),
  "llvm": lambda: LLVMRenderer(FIXED_SIMD),
  "cuda_sm90a_big_shared": lambda: CUDARenderer("sm_90a", shared_memory_bytes=BIG_SHARED_MEMORY)}
# sm_90a (Hopper's wgmma, OptOps.WGMMA) only renders the matmul programs: elsewhere it renders what sm_90 does
SM90A_PROGRAMS = ("matmul_half_big", "matmul_half_2048", "matmul_bf16", "matmul_half_weight", "linear_relu",
                  "matmul_tf32_weight", "matmul_big", "matmul_float32_weight")

# The random walks' opts: search.py's action space as of this file's golden hashes, frozen here so that a change to the
# search space (not to code generation) leaves the walks as they are.
WALK_AXES = 6
WALK_ACTIONS: list[Opt] = [
  *[Opt(OptOps.UPCAST, axis, amount) for axis in range(WALK_AXES) for amount in (0, 2, 3, 4, 5, 7, 8, 16, 32)],
  *[Opt(OptOps.UNROLL, axis, amount) for axis in range(4) for amount in (0, 2, 3, 4, 5, 7, 8, 16, 32)],
  *[Opt(OptOps.LOCAL, axis, amount) for axis in range(WALK_AXES) for amount in (2, 3, 4, 8, 13, 16, 29, 32)],
  *[Opt(op, axis, amount) for op in (OptOps.GROUP, OptOps.GROUPTOP) for axis in range(3)
    for amount in (0, 4, 8, 16, 20, 32, 40, 64, 80, 128, 256)],
  *[Opt(OptOps.THREAD, axis, amount) for axis in range(3) for amount in (2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)],
  *[Opt(OptOps.PADTO, axis, amount) for axis in range(WALK_AXES) for amount in (2, 4, 8, 16, 32)],
  *[Opt(OptOps.SWAP, axis, other) for axis in range(WALK_AXES) for other in range(axis + 1, WALK_AXES)],
  *[Opt(OptOps.TC, axis, 0) for axis in range(2)],
  *[Opt(OptOps.SMEM, operand, padding) for operand in range(2) for padding in (0, 4, 8)],
  Opt(OptOps.NOLOCALS),
]

def data(*shape: int, dtype=np.float32, seed: int = 0) -> Tensor:
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype), device=DEVICE)

def ints(high: int, *shape: int, seed: int = 0) -> Tensor:
  return Tensor(np.random.default_rng(seed).integers(0, high, shape).astype(np.int32), device=DEVICE)

def packed_linear(ggml_type: GGMLType, rows: int, columns: int, dtype=np.float32) -> Tensor:
  """x·Wᵀ over a weight kept in ggml blocks (random bytes: only the code matters here)."""
  layout = BLOCK_LAYOUTS[ggml_type]
  raw = np.random.default_rng(rows).integers(0, 256, rows * columns // layout.block_size * layout.block_bytes,
                                             dtype=np.uint8)
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), DEVICE)
  return weight.linear(data(1, columns, dtype=dtype))

def programs() -> dict[str, Callable[[], Tensor]]:
  """Name → a function building the lazy output (built fresh per call: realized inputs only)."""
  rows = Variable("rows", 1, 64)
  return {
    "elementwise": lambda: (data(64, 64) * data(64, 64, seed=1) + 1.5).relu().exp(),
    "broadcast": lambda: data(32, 1, 16) + data(1, 24, 16, seed=1) * data(16, seed=2),
    "int_math": lambda: (ints(1000, 256) // 7 + ints(100, 256, seed=1) % 5) * 3,
    "where_cast": lambda: (data(128) > 0).where(data(128, seed=1), 0).cast(dtypes.int32),
    "sum_rows": lambda: data(64, 256).sum(axis=1),
    "sum_columns": lambda: data(256, 64).sum(axis=0),
    "max_all": lambda: data(100, 30).max(),
    "mean_var": lambda: data(16, 48).var(axis=1),
    "big_sum_blocked": lambda: data(200000).sum(),
    "big_sum_split": lambda: data(1 << 21).sum(),   # split into partials and their sum (lazy._split_reduce)
    "argmax": lambda: data(32, 100).argmax(axis=1),
    "matmul_small": lambda: data(16, 24) @ data(24, 8, seed=1),
    "matmul_square": lambda: data(128, 128) @ data(128, 128, seed=1),
    "matmul_big": lambda: data(512, 512) @ data(512, 512, seed=1),
    "matmul_float32_weight": lambda: data(520, 256) @ data(388, 256, seed=1).T,
    "matmul_float32_a_transposed": lambda: data(256, 384).T @ data(256, 260, seed=1),
    "matmul_half": lambda: (data(256, 256, dtype=np.float16) @ data(256, 256, dtype=np.float16, seed=1)),
    "matmul_half_big": lambda: (data(1024, 1024, dtype=np.float16) @ data(1024, 1024, dtype=np.float16, seed=1)),
    "matmul_half_2048": lambda: data(2048, 256, dtype=np.float16) @ data(256, 2048, dtype=np.float16, seed=1),
    "matmul_half_weight": lambda: data(512, 640, dtype=np.float16) @ data(2048, 640, dtype=np.float16, seed=1).T,
    "matmul_bf16": lambda: (data(128, 64).cast(dtypes.bfloat16).realize() @
                            data(64, 128, seed=1).cast(dtypes.bfloat16).realize()),
    "matvec": lambda: data(1, 1024) @ data(1024, 512, seed=1),
    "matvec_half": lambda: data(1, 2048, dtype=np.float16) @ data(2048, 1024, dtype=np.float16, seed=1),
    "linear_relu": lambda: (data(32, 64) @ data(64, 48, seed=1) + data(48, seed=2)).relu(),
    "gather_rows": lambda: data(100, 32)[ints(100, 16, seed=3)],
    "gather_dim": lambda: data(8, 50).gather(1, ints(50, 8, 12, seed=4)),
    "embedding_scaled": lambda: data(1000, 64, dtype=np.float16)[ints(1000, 4, 7, seed=5)] * 2,
    "softmax": lambda: data(32, 512).softmax(axis=-1),
    "softmax_half": lambda: data(8, 1000, dtype=np.float16).softmax(axis=-1),
    "log_softmax": lambda: data(16, 300).log_softmax(axis=-1),
    "layernorm": lambda: data(16, 768).layernorm(),
    "rmsnorm": lambda: data(4, 2048).rmsnorm(),
    "attention_scores": lambda: ((data(2, 16, 32) @ data(2, 32, 16, seed=1)) * 0.125).softmax(axis=-1),
    "cumsum": lambda: data(8, 64).cumsum(axis=1),
    "symbolic_elementwise": lambda: data(64, 32)[:rows.bind(5)] * 3 + 1,
    "symbolic_sum": lambda: data(64, 32)[:rows.bind(7)].sum(axis=0),
    "symbolic_softmax": lambda: data(64, 128)[:rows.bind(3)].softmax(axis=-1),
    "symbolic_matmul": lambda: data(64, 48)[:rows.bind(9)] @ data(48, 32, seed=1),
    "bfloat16_math": lambda: (data(64, 64).cast(dtypes.bfloat16) * 1.25 + 2).exp2().sum(axis=1),
    "half_transcendentals": lambda: data(256, dtype=np.float16).sin().log2().sqrt(),
    "conv2d": lambda: data(1, 3, 16, 16).conv2d(data(8, 3, 3, 3, seed=1)),
    "packed_q4_k": lambda: packed_linear(GGMLType.Q4_K, 24, 512),
    "packed_q8_0_half": lambda: packed_linear(GGMLType.Q8_0, 24, 160, np.float16),
    "packed_q6_k": lambda: packed_linear(GGMLType.Q6_K, 8, 512),
    "matmul_tf32_weight": lambda: LOWERINGS["matmul"]["tf32"].build(data(512, 640), data(2048, 640, seed=1).T),
  }

# explicit opt lists, tried on the last kernel of a program for a renderer family (illegal lists are recorded as such)
FIXED_OPTS: dict[str, list[tuple[str, tuple[Opt, ...]]]] = {
  "cuda": [
    ("group16", (Opt(OptOps.GROUP, 0, 16),)),
    ("grouptop8_unroll4", (Opt(OptOps.GROUPTOP, 0, 8), Opt(OptOps.UNROLL, 0, 4))),
    ("local_group_upcast", (Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 8), Opt(OptOps.UPCAST, 0, 2))),
    ("tc", (Opt(OptOps.TC, 0, 0),)),
    ("tc_tiles", (Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 4))),
    ("tc_unroll", (Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 2))),
    ("tc_staged", (Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 2),
                   Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.SMEM, 0, 0), Opt(OptOps.SMEM, 1, 8))),
    ("tc_staged_dynamic", (Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 8),
                           Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.UNROLL, 0, 4),
                           Opt(OptOps.SMEM, 0, 8), Opt(OptOps.SMEM, 1, 8))),
    ("smem_a", (Opt(OptOps.SMEM, 0, 0),)),
    ("smem_both", (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 8),
                   Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 1, 16), Opt(OptOps.SMEM, 0, 0), Opt(OptOps.SMEM, 1, 0))),
    ("smem_padded", (Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.SMEM, 1, 4), Opt(OptOps.UNROLL, 0, 4))),
    ("group_smem", (Opt(OptOps.GROUP, 0, 8), Opt(OptOps.SMEM, 0, 0))),
    ("wgmma_first_tile", (Opt(OptOps.WGMMA, 0, 0),)),
    ("wgmma_small_tile", (Opt(OptOps.WGMMA, 0, 9),)),
    ("wgmma_tma_first_tile", (Opt(OptOps.WGMMA, 0, 11),)),
    ("wgmma_tma_small_tile", (Opt(OptOps.WGMMA, 0, 19),)),
    ("sgemm_first_tile", (Opt(OptOps.SGEMM, 0, 0),)),
    ("sgemm_wide_tile", (Opt(OptOps.SGEMM, 0, 2),)),
    ("sgemm_small_tile", (Opt(OptOps.SGEMM, 0, 6),)),
    ("tf32x3_first_tile", (Opt(OptOps.TF32X3, 0, 0),)),
    ("tf32x3_small_tile", (Opt(OptOps.TF32X3, 0, 3),)),
  ],
  "llvm": [
    ("unroll4", (Opt(OptOps.UNROLL, 0, 4),)),
    ("upcast4_unroll4", (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4))),
    ("thread2_upcast2", (Opt(OptOps.THREAD, 0, 2), Opt(OptOps.UPCAST, 1, 2))),
    ("padto", (Opt(OptOps.PADTO, 0, 8),)),
  ],
}

def _apply_all(kernel: Kernel, opts: tuple[Opt, ...]) -> bool:
  try:
    for opt in opts: kernel.apply_opt(opt)
    return True
  except KernelOptError: return False

def _variants(kernel: Kernel, renderer_name: str, last: bool, seed: int) -> Iterator[tuple[str, Kernel]]:
  """(label, optimized copy) of one kernel: unoptimized, heuristics, fixed opt lists (last kernel) and random walks."""
  yield "none", kernel.copy()
  heuristic = kernel.copy()
  with Context(THREADS=FIXED_THREADS): hand_coded_optimizations(heuristic)
  yield "heuristics", heuristic
  if last:
    for label, opts in FIXED_OPTS["llvm" if renderer_name == "llvm" else "cuda"]:
      fixed = kernel.copy()
      if _apply_all(fixed, opts): yield label, fixed
  rng = random.Random(seed)
  for walk in range(RANDOM_WALKS):
    walked = kernel.copy()
    for _ in range(RANDOM_WALK_STEPS):
      try: walked.apply_opt(rng.choice(WALK_ACTIONS))
      except KernelOptError: pass
    yield f"walk{walk}", walked

def golden_sources() -> Iterator[tuple[str, str]]:
  """(label, rendered source) of every kernel variant, in a fixed order."""
  for program_name, build in programs().items():
    items = [item for item in create_schedule([build().lazydata]) if item.ast.op is Ops.SINK]
    for renderer_name, make_renderer in RENDERERS.items():
      if renderer_name.startswith("cuda_sm90a") and program_name not in SM90A_PROGRAMS: continue
      for index, item in enumerate(items):
        kernel = Kernel(item.ast, make_renderer())
        seed = int.from_bytes(hashlib.sha256(f"{program_name}/{renderer_name}/{index}".encode()).digest()[:4], "big")
        for variant, optimized in _variants(kernel, renderer_name, index == len(items) - 1, seed):
          label = f"{program_name}/{renderer_name}/k{index}/{variant}"
          opts = ",".join(f"{o.op.name}:{o.axis}:{o.amount}" for o in optimized.applied_opts)
          try: source = render_source(optimized)[0]
          except Exception as error:   # an error is part of the behaviour to keep   # noqa: BLE001
            source = f"ERROR {type(error).__name__}: {error}"
          yield f"{label} [{opts}]", source

def source_hashes() -> dict[str, str]:
  return {label: hashlib.sha256(source.encode()).hexdigest()[:24] for label, source in golden_sources()}

def test_rendered_sources_match_the_golden_hashes():
  golden = json.loads(GOLDEN_PATH.read_text())
  current = source_hashes()
  missing, extra = sorted(set(golden) - set(current)), sorted(set(current) - set(golden))
  changed = sorted(label for label in set(golden) & set(current) if golden[label] != current[label])
  assert not (missing or extra or changed), \
    f"{len(changed)} sources changed, {len(missing)} missing, {len(extra)} new (of {len(golden)}): " \
    f"{(changed + missing + extra)[:10]}; if intended, regenerate: PYTHONPATH=. python {__file__} --update"

if __name__ == "__main__":
  if "--dump" in sys.argv:   # every source into a folder, to diff two versions of the code generator
    folder = Path(sys.argv[sys.argv.index("--dump") + 1])
    folder.mkdir(parents=True, exist_ok=True)
    for n, (label, source) in enumerate(golden_sources()):
      (folder / f"{n:05d}.txt").write_text(label + "\n" + source)
  elif "--update" in sys.argv:
    hashes = source_hashes()
    GOLDEN_PATH.write_text(json.dumps(hashes, indent=0, sort_keys=True) + "\n")
    print(f"wrote {len(hashes)} hashes to {GOLDEN_PATH}")
  else: print(f"usage: PYTHONPATH=. python {sys.argv[0]} --update | --dump FOLDER")
