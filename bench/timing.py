"""Host wall-clock timing shared by the CPU benchmarks: the seconds of repeated calls of a function, their best or their
median, and libraries timed side by side in interleaved rounds. Each call is timed alone with time.perf_counter; a
warm-up call (compiling, allocating) comes first unless asked not to. GPU work is timed with CUDA events instead
(bench/gpu.py)."""
import random, statistics, time
from typing import Callable, Optional, Sequence

def host_times(fn, repeats: int, warmup: bool = True) -> list[float]:
  """Seconds of each of `repeats` calls of fn(), after one untimed call when `warmup`."""
  if warmup: fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times

def best_time(fn, repeats: int, warmup: bool = True) -> float: return min(host_times(fn, repeats, warmup))
def median_time(fn, repeats: int, warmup: bool = True) -> float:
  return statistics.median(host_times(fn, repeats, warmup))

def interleaved_rounds(fns: Sequence[Optional[Callable]], rounds: int, block: int = 1,
                       order: Optional[random.Random] = None, pause: float = 0.0,
                       settle: float = 0.0) -> list[list[float]]:
  """Seconds of each function in each round: every round calls each function (None: skipped, its list stays empty)
  `block` times back to back and keeps the median of that block, the functions in an order drawn anew each round from
  `order` (a seeded random.Random). One warm-up call of each comes first. A change in a shared machine's state (its
  memory bandwidth here moves between ~35 and ~60 GB/s from minute to minute) then hits every function alike, and none
  always runs after the same other one; compare the functions by the median of each round's own ratio (`round_ratio`).
  Before each block: `pause` seconds of sleep, which let another library's threads that spin after its calls go to
  sleep (they would take a core from the block), then untimed calls for `settle` seconds (one at least), since the
  machine is slow for a while after idling (a 2048² softmax here: ~2 ms for its first ~8 calls after 0.15 s of sleep,
  1.25 ms after)."""
  order = order if order is not None else random.Random(0)
  for fn in fns:
    if fn is not None: fn()
  times: list[list[float]] = [[] for _ in fns]
  sequence = list(range(len(fns)))
  for _ in range(rounds):
    order.shuffle(sequence)
    for index in sequence:
      if fns[index] is None: continue
      if pause: time.sleep(pause)
      if settle:
        start = time.perf_counter()
        while True:
          fns[index]()
          if time.perf_counter() - start >= settle: break
      times[index].append(statistics.median(host_times(fns[index], block, warmup=False)))
  return times

def round_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
  """The median over rounds of numerator[r] / denominator[r] (two lists from one `interleaved_rounds`)."""
  return statistics.median(n / d for n, d in zip(numerator, denominator))
