"""CUDA graphs with branches (GRAPH_BRANCHES=1, runtime/cuda/graph.py `data_dependencies`): each kernel node waits only
for the earlier nodes whose memory it shares (read after write, write after read, write after write), with the edges
that others imply left out. Without a GPU: the dependencies of seeded random access patterns against a brute-force
reference (every conflicting pair stays ordered, through some path of edges; no edge is implied by the others; a
chain stays a chain). On a GPU: seeded random programs of independent branches and joins replay bit-identically with
branches and as a chain, with and without PDL. (Whether the graphs then branch depends on the memory planner: its
reuse of freed activation bytes orders most kernels after the one before.)"""
import itertools
import numpy as np
import pytest
from tgrad import Tensor, TinyJit
from tgrad.helpers import Context
from tgrad.runtime.cuda.graph import ANY_ADDRESS, data_dependencies
from test_dependent_launch import replays  # seeded TinyJit runs and their graphs

PATTERNS = 40
PROGRAMS = 6

def random_accesses(rng: np.random.Generator):
  """3..40 nodes over a few buffers (some overlapping: views of one arena), each reading and writing a few; now and
  then a node of unknown accesses (a collective) or an input read as every address."""
  buffers = [(int(s), int(s) + int(n)) for s, n in zip(rng.integers(0, 400, 8), rng.integers(1, 120, 8))]
  nodes = []
  for _ in range(int(rng.integers(3, 41))):
    if rng.random() < 0.05:
      nodes.append(None)
      continue
    touched = rng.choice(len(buffers), int(rng.integers(1, 4)), replace=False)
    ranges = [(*buffers[b], bool(i == 0 or rng.random() < 0.2)) for i, b in enumerate(touched)]
    if rng.random() < 0.1: ranges.append((0, ANY_ADDRESS, False))
    nodes.append(ranges)
  return nodes

def conflicts(a, b) -> bool:
  if a is None or b is None: return True
  return any(s1 < e2 and s2 < e1 and (w1 or w2) for s1, e1, w1 in a for s2, e2, w2 in b)

def closure(dependencies) -> list[set[int]]:
  reach: list[set[int]] = []
  for direct in dependencies: reach.append(set(direct).union(*(reach[d] for d in direct)))
  return reach

@pytest.mark.parametrize("seed", range(PATTERNS))
def test_dependencies_keep_every_conflict_ordered_with_no_implied_edge(seed):
  nodes = random_accesses(np.random.default_rng(seed))
  dependencies = data_dependencies(nodes)
  reach = closure(dependencies)
  for i, j in itertools.combinations(range(len(nodes)), 2):   # i before j
    if conflicts(nodes[i], nodes[j]): assert i in reach[j], (i, j, dependencies)
  for j, direct in enumerate(dependencies):
    assert all(d < j for d in direct)
    for d in direct:   # no edge another edge of the node implies
      assert not any(d in reach[e] for e in direct if e != d), (j, direct)
    # and no ordering beyond what conflicts need: every node j waits for is reached through conflicting pairs
    needed = set()
    for i in range(j):
      if conflicts(nodes[i], nodes[j]): needed |= {i} | reach[i]
    assert reach[j] == needed, (j, reach[j], needed)

def test_a_chain_stays_a_chain_and_independent_nodes_are_roots():
  chain = [[(0, 64, True), (0, 64, False)] for _ in range(6)]
  assert data_dependencies(chain) == [()] + [(i,) for i in range(5)]
  independent = [[(64 * i, 64 * i + 64, True)] for i in range(5)]
  assert data_dependencies(independent) == [()] * 5
  joined = independent + [[(0, 320, False), (400, 464, True)]]
  assert data_dependencies(joined)[-1] == (0, 1, 2, 3, 4)
  assert data_dependencies([[(0, 8, True)], None, [(100, 108, True)]]) == [(), (0,), (1,)]

def test_reads_of_one_buffer_run_at_once_and_the_next_write_waits_for_all():
  nodes = [[(0, 8, True)], [(0, 8, False), (16, 24, True)], [(0, 8, False), (32, 40, True)], [(0, 8, True)]]
  assert data_dependencies(nodes) == [(), (0,), (0,), (1, 2)]

# ---- on a GPU

def gpu_available() -> bool:
  try:
    from tgrad.runtime.cuda.runtime import create_device
    create_device()
    return True
  except Exception:   # no pycuda, no driver, no GPU
    return False

gpu = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")

def random_program(rng: np.random.Generator):
  """(a function of two CUDA tensors, their shapes): two independent chains of 2..5 kernels each (elementwise maps,
  reductions broadcast back, a softmax), joined now and then and at the end."""
  rows, cols = int(rng.integers(1, 70)), int(rng.integers(1, 300))
  steps = [[int(s) for s in rng.integers(0, 4, int(rng.integers(2, 6)))] for _ in range(2)]
  joins = {int(j) for j in rng.integers(0, 5, 2)}
  def step(x: Tensor, kind: int) -> Tensor:
    if kind == 0: x = (x * 1.5 + 0.5).relu()
    elif kind == 1: x = x - x.max(axis=1, keepdim=True)
    elif kind == 2: x = x.softmax(axis=1) * cols
    else: x = (x.sum(axis=0, keepdim=True) + x).tanh()
    return x.contiguous()
  def program(a: Tensor, b: Tensor) -> Tensor:
    for i in range(max(len(s) for s in steps)):
      if i < len(steps[0]): a = step(a, steps[0][i])
      if i < len(steps[1]): b = step(b, steps[1][i])
      if i in joins: a, b = (a + b * 0.25).contiguous(), b
    return (a - b).contiguous()
  return program, (rows, cols), (rows, cols)

@gpu
@pytest.mark.parametrize("seed", range(PROGRAMS))
def test_branched_replays_are_bit_identical_to_the_chain(seed):
  program, *shapes = random_program(np.random.default_rng(seed))
  chain, _ = replays(program, shapes, 1, seed, GRAPH_BRANCHES=0)
  for pdl in (0, 1):
    branched, graphs = replays(program, shapes, pdl, seed, GRAPH_BRANCHES=1)
    for got, want in zip(branched, chain): np.testing.assert_array_equal(got, want)
    for graph in graphs:   # the graph's edges are the analysis of its launches
      assert len(graph.dependencies) == len(graph) and all(d < i for i, ds in enumerate(graph.dependencies) for d in ds)

@gpu
@pytest.mark.parametrize("seed", range(2))
def test_side_kernels_replay_bit_identically_beside_their_anchor(seed):
  """A prompt through two packed weights (each dequantized into a half temporary by a kernel that reads only the
  weight: a side kernel, tgrad/side_kernels.py), with a per-row norm of few blocks before each product: the side
  kernels move to start beside a quiet kernel, and every replay matches the program in its own order bit for bit."""
  import os, sys
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "unit"))
  from test_packed_matvec import random_weight
  from tgrad.nn.quant import GGMLType, QuantizedTensor
  rng = np.random.default_rng(seed)
  rows, width = 48, 256
  weights = [QuantizedTensor.from_bytes(random_weight(kind, width, width, seed + i), kind, (width, width), "CUDA")
             .realize() for i, kind in enumerate((GGMLType.Q4_K, GGMLType.Q8_0))]
  def program(x: Tensor) -> Tensor:
    for weight in weights:
      scale = (x.float().square().mean(axis=1, keepdim=True) + 1).rsqrt()   # few blocks: a quiet anchor
      x = weight.linear((x.float() * scale).cast(x.dtype).contiguous()).contiguous()
    return (x.float() * 1).contiguous()
  inputs = [rng.standard_normal((rows, width)).astype(np.float16) for _ in range(4)]
  results, placed = {}, {}
  for enabled in (0, 1):
    with Context(SIDE_KERNELS=enabled):
      jitted = TinyJit(program)
      results[enabled] = [jitted(Tensor(x, device="CUDA")).numpy().copy() for x in inputs]
      placed[enabled] = sum(ins.starts_with_previous for ins in jitted.captured.instructions)
  assert placed[0] == 0 and placed[1] >= 1
  for got, want in zip(results[1], results[0]): np.testing.assert_array_equal(got, want)
