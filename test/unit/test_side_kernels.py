"""Side kernels (tgrad/side_kernels.py): a kernel that reads only weights moves to start beside the least busy kernel
before its first user. Checked without a GPU: the placement of a transformer layer's dequantizing kernels, the limits
(a step the graph runner can't branch around, memory still in use, no quiet anchor, the window), seeded random programs
run in both orders by a reference interpreter (every instruction reads the same values), the JIT's plan (a moved
kernel's output is live from its anchor on) on the LLVM device with a stand-in busyness estimate, and the CUDA graph
runner's dependencies for a moved kernel (its anchor's as well as its own)."""
import numpy as np
import pytest
from tgrad import Tensor, TinyJit
from tgrad.helpers import Context
from tgrad.jit import PlainGraphRunner
from tgrad.runtime.cuda.graph import starting_with_previous
from tgrad.side_kernels import SIDE_MAX_BUSY, SIDE_WINDOW, Step, place_side_kernels

RANDOM_PROGRAMS = 60
QUIET, BUSY = 0.25, 1.0

def kernel(outputs, inputs, busy=BUSY, side=False, device="CUDA") -> Step:
  return Step(tuple(outputs) + tuple(inputs), len(outputs), device, side, busy)

def layer() -> list[Step]:
  """One layer's shape (slots: 100+ weights, the rest activations): norm, dequantize qkv, qkv matmul, attention (few
  blocks), dequantize o, o matmul, dequantize gate/up, gate/up matmul."""
  return [kernel([1], [0]), kernel([2], [100], side=True), kernel([3], [1, 2], busy=0.6),
          kernel([4], [3], busy=QUIET), kernel([5], [101], side=True), kernel([6], [4, 5], busy=0.6),
          kernel([7], [102], side=True), kernel([8], [6, 7], busy=0.6)]

def test_a_layers_dequantizations_start_beside_its_attention():
  placement = place_side_kernels(layer())
  # the first has no quiet kernel before its user; the others follow the attention (3), in their order
  assert placement.order == (0, 1, 2, 3, 4, 6, 5, 7)
  assert placement.starts_with_previous == {4, 6}

def test_nothing_moves_past_a_copy_or_where_its_memory_is_in_use():
  steps = layer()
  steps[5] = kernel([6], [4], busy=None)   # a copy between the attention and the side kernels
  assert place_side_kernels(steps).order == tuple(range(len(steps)))
  steps = layer()
  steps[3] = kernel([4], [3, 7], busy=QUIET)   # the attention touches the gate/up temporary's slot
  assert place_side_kernels(steps).starts_with_previous == {4}

def test_nothing_moves_without_a_quiet_anchor_near_its_user():
  steps = [step if step.side else Step(step.args, step.output_count, step.device, False, max(step.busy, SIDE_MAX_BUSY))
           for step in layer()]
  assert place_side_kernels(steps).order == tuple(range(len(steps)))
  far = [kernel([1], [0], busy=QUIET), kernel([2], [100], side=True)] + \
    [kernel([3 + i], [2 + i]) for i in range(SIDE_WINDOW)] + [kernel([99], [2, 3 + SIDE_WINDOW - 1])]
  assert place_side_kernels(far).order == tuple(range(len(far)))   # the quiet kernel is out of the window
  other_device = layer()
  other_device[3] = kernel([4], [3], busy=QUIET, device="CUDA:1")
  assert not place_side_kernels(other_device).starts_with_previous

def random_program(rng: np.random.Generator) -> list[Step]:
  """Up to 40 steps over 12 activation slots (written and read again, some written twice) and 6 weights (100+): a
  side kernel writes one activation from weights; now and then a step of unknown busyness (a copy)."""
  steps = []
  for _ in range(int(rng.integers(2, 41))):
    busy = None if rng.random() < 0.08 else float(rng.choice([0.1, 0.3, 0.6, 1.0]))
    if busy is not None and rng.random() < 0.3:
      steps.append(kernel([int(rng.integers(0, 12))], list(100 + rng.choice(6, 2, replace=False)), busy, side=True))
    else:
      slots = rng.choice(12, int(rng.integers(2, 5)), replace=False)
      steps.append(kernel(slots[:1].tolist(), slots[1:].tolist(), busy, device="CUDA"))
  return steps

def interpret(steps: list[Step], order) -> tuple[list[tuple], dict]:
  """Run the steps in `order`: each writes its outputs as (its index, what it read); returns what each step read (by
  index) and the final values."""
  values: dict = {}
  reads: list = [None] * len(steps)
  for i in order:
    step = steps[i]
    reads[i] = tuple(values.get(s) for s in step.args[step.output_count:])
    for s in step.args[:step.output_count]: values[s] = (i, reads[i])
  return reads, values

@pytest.mark.parametrize("seed", range(RANDOM_PROGRAMS))
def test_random_programs_read_the_same_values_in_the_placed_order(seed):
  steps = random_program(np.random.default_rng(seed))
  placement = place_side_kernels(steps)
  assert sorted(placement.order) == list(range(len(steps)))
  assert interpret(steps, placement.order) == interpret(steps, range(len(steps)))
  for position, i in enumerate(placement.order):
    if i not in placement.starts_with_previous: continue
    anchor_position = position
    while placement.order[anchor_position] in placement.starts_with_previous: anchor_position -= 1
    anchor = placement.order[anchor_position]
    assert steps[i].side and steps[anchor].busy < SIDE_MAX_BUSY and steps[anchor].device == steps[i].device
    lo, hi = sorted((i, anchor))
    assert all(steps[j].busy is not None for j in range(lo, hi + 1))   # moved past no copy

def test_a_jitted_program_moves_its_weight_only_kernel_and_plans_it_beside_the_anchor(monkeypatch):
  """On the LLVM device with a stand-in estimate (reduce kernels quiet): the weight-only kernel runs right after the
  matmul before its user, its output shares no memory with that matmul's buffers, and the results don't change."""
  rng = np.random.default_rng(0)
  w1, w2 = (Tensor(rng.standard_normal((24, 24)).astype(np.float32), device="LLVM").realize() for _ in range(2))
  def program(x: Tensor) -> Tensor:
    h = (x @ w1).relu().contiguous()
    scaled = (w2 * 2 + 1).contiguous()   # reads only a weight
    return ((h @ scaled).contiguous() * 0.5).contiguous()   # (the products are activations, not returned)
  xs = [rng.standard_normal((8, 24)).astype(np.float32) for _ in range(4)]
  want = [np.maximum(x @ w1.numpy(), 0) @ (w2.numpy() * 2 + 1) * 0.5 for x in xs]
  monkeypatch.setattr(PlainGraphRunner, "busy_fraction",
                      staticmethod(lambda ins: QUIET if ins.runner.name.startswith("r_") else BUSY), raising=False)
  for enabled in (0, 1):
    with Context(SIDE_KERNELS=enabled):
      jitted = TinyJit(program)
      for x, expected in zip(xs, want):
        np.testing.assert_allclose(jitted(Tensor(x, device="LLVM")).numpy(), expected, rtol=1e-5, atol=1e-4)
    instructions = jitted.captured.instructions
    moved = [p for p, ins in enumerate(instructions) if ins.starts_with_previous]
    assert len(moved) == enabled
    if not enabled: continue
    side, anchor = instructions[moved[0]], instructions[moved[0] - 1]
    assert anchor.runner.name.startswith("r_") and not side.runner.name.startswith("r_")
    slots = jitted.captured.slots
    def extent(s): return slots[s].offset, slots[s].offset + slots[s].nbytes
    out = extent(side.args[0])
    for s in anchor.args:
      if slots[s].offset is not None: assert out[1] <= extent(s)[0] or extent(s)[1] <= out[0]

class Placed:
  def __init__(self, starts_with_previous: bool): self.starts_with_previous = starts_with_previous

def test_a_moved_kernel_also_waits_for_what_its_anchor_waits_for():
  instructions = [Placed(False), Placed(False), Placed(False), Placed(True), Placed(True), Placed(False)]
  dependencies = [(), (0,), (1,), (0,), (), (2, 3)]
  assert starting_with_previous(instructions, dependencies) == [(), (0,), (1,), (0, 1), (1,), (2, 3)]
