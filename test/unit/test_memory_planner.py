"""The static memory planner: seeded random lifetimes, checked by intervals (no two transients live at the same
time share a byte), alignment, and bounds on the arena size."""
import numpy as np
import pytest
from tgrad.memory_planner import ARENA_ALIGNMENT, Lifetime, _best_fit_in_time_order, _largest_first, liveness, \
  plan_arena
from tgrad.helpers import round_up

def random_lifetimes(seed: int, count: int, steps: int) -> list[Lifetime]:
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(count):
    first = int(rng.integers(0, steps))
    last = min(steps - 1, first + int(rng.geometric(0.3)) - 1)
    out.append(Lifetime(first, last, int(rng.choice([1, 17, 256, 1000, 4096, 65536, 300_000]))))
  return out

def check_plan(lifetimes: list[Lifetime], offsets, size: int) -> None:
  for i, a in enumerate(lifetimes):
    assert offsets[i] % ARENA_ALIGNMENT == 0
    assert offsets[i] + a.nbytes <= size
    for j in range(i):
      b = lifetimes[j]
      if a.overlaps(b):   # live at once: their byte ranges must be disjoint
        assert offsets[i] + a.nbytes <= offsets[j] or offsets[j] + b.nbytes <= offsets[i], (a, b)

def peak_live_bytes(lifetimes: list[Lifetime], steps: int) -> int:
  return max((sum(round_up(t.nbytes, ARENA_ALIGNMENT) for t in lifetimes if t.first <= s <= t.last)
              for s in range(steps)), default=0)

@pytest.mark.parametrize("seed", range(40))
def test_random_schedules_never_overlap_live_transients(seed: int):
  steps = 5 + seed * 3
  lifetimes = random_lifetimes(seed, count=4 + seed * 2, steps=steps)
  sizes = [round_up(t.nbytes, ARENA_ALIGNMENT) for t in lifetimes]
  for strategy in (_best_fit_in_time_order, _largest_first):
    offsets, size, _ = strategy(lifetimes, sizes)
    check_plan(lifetimes, offsets, size)
  plan = plan_arena(lifetimes)
  check_plan(lifetimes, plan.offsets, plan.size)
  assert peak_live_bytes(lifetimes, steps) <= plan.size <= sum(sizes)   # never below the peak, never above no reuse

def test_a_chain_reuses_memory():
  """a → b → c → d, each read only by the next: two buffers' worth of memory serve all four."""
  chain = [Lifetime(i, i + 1, 1024) for i in range(4)]
  plan = plan_arena(chain)
  assert plan.size == 2 * 1024
  check_plan(chain, plan.offsets, plan.size)

def test_inputs_and_outputs_of_one_instruction_never_share():
  plan = plan_arena([Lifetime(0, 1, 512), Lifetime(1, 2, 512)])   # 0 is read where 1 is written
  assert plan.offsets[0] != plan.offsets[1]

def test_liveness_is_first_and_last_use():
  assert liveness([[1, 2], [2], [3, 1], []]) == {1: (0, 2), 2: (0, 1), 3: (2, 2)}

def test_empty_and_invalid():
  assert plan_arena([]).size == 0
  with pytest.raises(ValueError, match="invalid lifetime"): plan_arena([Lifetime(3, 1, 8)])
