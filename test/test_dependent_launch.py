"""Programmatic Dependent Launch (PDL): the CUDA renderer's prologue, the graph's programmatic edges, and replays of
randomized captured programs that are bit-identical with and without it.

Without a GPU: what the renderer writes for sm_90 and older GPUs under PDL=1 and PDL=0, that NVRTC compiles it for
sm_90, and which edges a graph would make programmatic. On a GPU (marked `gpu`): TinyJit programs drawn at random
(elementwise chains, reductions, matmuls, softmax), replayed with new inputs, give the same bits with PDL on and off,
and the PDL graph really has programmatic edges.
"""
import numpy as np
import pytest
from tgrad import Tensor, TinyJit
from tgrad.codegen.kernel import Kernel
from tgrad.codegen.linearizer import linearize
from tgrad.codegen.heuristics import hand_coded_optimizations
from tgrad.helpers import Context
from tgrad.runtime.cuda.graph import CUDAGraph, KernelLaunch, programmatic_edges
from tgrad.runtime.cuda.renderer import CUDARenderer, DEPENDENT_LAUNCH_PROLOGUE, DEPENDENT_LAUNCH_SUFFIX
from tgrad.schedule import create_schedule

gpu = pytest.mark.gpu
PROGRAMS = 12          # randomized captured programs on the GPU
REPLAYS = 4            # replays of each with new inputs
WAIT, LAUNCH = DEPENDENT_LAUNCH_PROLOGUE

def rendered(arch: str) -> str:
  """The CUDA source of a reduction kernel (x·2 summed over rows) for `arch` under the current PDL setting."""
  x = Tensor(np.ones((33, 65), np.float32), device="LLVM")
  item = [i for i in create_schedule([((x * 2).sum(axis=1)).lazydata]) if i.ast.op.name == "SINK"][-1]
  kernel = Kernel(item.ast, CUDARenderer(arch))
  hand_coded_optimizations(kernel)
  return kernel.renderer.render("pdl_probe", linearize(kernel))

def test_sm90_kernels_wait_for_prior_grids_before_any_memory_access():
  source = rendered("sm_90")
  body = source[source.index("pdl_probe("):]
  assert body.index(WAIT) < body.index(LAUNCH) < body.index("data1[") and body.count(WAIT) == 1
  assert f"pdl_probe{DEPENDENT_LAUNCH_SUFFIX}" in source   # the module tells the runtime it waits

@pytest.mark.parametrize("arch, pdl", [("sm_80", 1), ("sm_89", 1), ("sm_90", 0)])
def test_no_prologue_before_hopper_or_with_pdl_off(arch, pdl):
  with Context(PDL=pdl): source = rendered(arch)
  assert "griddepcontrol" not in source and DEPENDENT_LAUNCH_SUFFIX not in source

def test_nvrtc_compiles_the_prologue_for_sm90():
  from tgrad.runtime.cuda.nvrtc import compile_cuda
  try: binary = compile_cuda(rendered("sm_90"), "sm_90")
  except (ImportError, OSError) as error: pytest.skip(f"NVRTC is not available here: {error}")
  assert binary

def test_only_launches_that_wait_get_programmatic_edges():
  launches = [KernelLaunch(None, (1, 1, 1), (1, 1, 1), 0, [], "", waits) for waits in (True, True, False, True)]
  assert programmatic_edges(launches, enabled=True) == [True, False, True]   # no edge into the first launch
  assert programmatic_edges(launches, enabled=False) == [False, False, False]

def test_pdl_is_a_code_setting():
  from tgrad.helpers import settings_key
  with Context(PDL=0): off = settings_key()
  with Context(PDL=1): on = settings_key()
  assert off != on   # kernels rendered under one are not reused under the other

# ---- on a GPU

def random_program(rng: np.random.Generator):
  """(a function of two CUDA tensors, the input shapes): a chain of 3..7 steps drawn from elementwise maps,
  reductions broadcast back, a matmul and a softmax, each realized as its own kernel(s)."""
  rows, cols = int(rng.integers(1, 70)), int(rng.integers(1, 300))
  steps = [int(s) for s in rng.integers(0, 5, int(rng.integers(3, 8)))]
  def program(x: Tensor, w: Tensor) -> Tensor:
    for step in steps:
      if step == 0: x = (x * w + 0.5).relu()
      elif step == 1: x = x - x.max(axis=1, keepdim=True)
      elif step == 2: x = x.softmax(axis=1) * cols
      elif step == 3: x = (x @ w.reshape(cols, 1).expand(cols, cols)) / cols
      else: x = (x.sum(axis=0, keepdim=True) + x).tanh()
      x = x.contiguous()
    return x
  return program, (rows, cols), (cols,)

def replays(program, shapes, pdl: int, seed: int, **settings) -> tuple[list[np.ndarray], list[CUDAGraph]]:
  """A TinyJit of `program` run on seeded inputs (a run, the capture, REPLAYS replays) under PDL=pdl and `settings`:
  each call's output and the CUDA graphs it replayed."""
  rng = np.random.default_rng(seed)
  with Context(PDL=pdl, **settings):
    jitted = TinyJit(program)
    outputs = []
    for _ in range(2 + REPLAYS):   # run, capture, then replays
      args = [Tensor(rng.standard_normal(shape).astype(np.float32), device="CUDA") for shape in shapes]
      outputs.append(jitted(*args).numpy().copy())
    graphs = [step for runner in jitted.captured.runners for step in getattr(runner, "steps", ())
              if isinstance(step, CUDAGraph)]
  return outputs, graphs

@gpu
@pytest.mark.parametrize("seed", range(PROGRAMS))
def test_replays_are_bit_identical_with_and_without_pdl(seed):
  from tgrad.runtime.cuda.runtime import create_device
  if not create_device().renderer.dependent_launch: pytest.skip("PDL needs sm_90 or newer")
  program, *shapes = random_program(np.random.default_rng(seed))
  with_pdl, graphs_on = replays(program, shapes, 1, seed)
  without, graphs_off = replays(program, shapes, 0, seed)
  for on, off in zip(with_pdl, without): np.testing.assert_array_equal(on, off)
  kernels = sum(len(g) for g in graphs_on)
  if kernels > 1: assert any(edge for g in graphs_on for edge in g.programmatic)
  assert not any(edge for g in graphs_off for edge in g.programmatic)
