"""Host wall-clock timing shared by the CPU benchmarks: the seconds of repeated calls of a function, their best or their
median. Each call is timed alone with time.perf_counter; a warm-up call (compiling, allocating) comes first unless
asked not to. GPU work is timed with CUDA events instead (bench/gpu.py)."""
import statistics, time

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
