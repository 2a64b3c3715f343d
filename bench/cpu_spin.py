"""How long the CPU core pool's idle workers should spin: eager calls in bursts after a pause, per spin length.

A worker spins for runtime/llvm/cores.SPIN_MICROSECONDS after its last piece, then sleeps; the next launch wakes it.
This times `x.sum().realize()` of a 16M float32 buffer (a 64 MB stream: the next call's Python runs with cold caches,
so the gaps between launches are long) in bursts of BURST calls, each after a PAUSE_SECONDS pause and two untimed
calls, for each spin length in turn (the order drawn anew each round, seeded), beside torch's sum of its own copy.
Per spin: the median over rounds of each burst's median µs, and how many launches of each burst found the worker
asleep. Also each spin with the pool's worker and the calling thread pinned to different cores (Linux only), which
shows what a wake costs when it can't put the worker on the caller's core.
Usage: python bench/cpu_spin.py [--spins 300,1000,2000] [--rounds 12] [--pinned]
"""
from __future__ import annotations
import argparse, os, random, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
import tgrad.runtime.llvm.cores as cores  # noqa: E402

SIZE = 16 << 20
BURST = 9
PAUSE_SECONDS = 0.15
ROUND_ORDER_SEED = 0

try:
  import torch
  torch.set_grad_enabled(False)
except ImportError:
  torch = None

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--spins", default="300,1000,2000", help="spin lengths in µs")
  parser.add_argument("--rounds", type=int, default=12)
  parser.add_argument("--pinned", action="store_true", help="also each spin with worker and caller pinned apart")
  args = parser.parse_args()
  data = np.random.default_rng(0).random(SIZE, dtype=np.float32)
  x = Tensor(data).realize()
  for _ in range(3): x.sum().realize()
  pool = cores.core_pool()
  if pool.workers < 1: raise SystemExit("one core: no worker to wake")
  wakes = [0]
  plain_run = cores.CorePool.run
  def counting_run(self, *a, **kw):
    if self.sleepers: wakes[0] += 1
    return plain_run(self, *a, **kw)
  cores.CorePool.run = counting_run
  cases: dict[str, tuple] = {f"spin {s} us": (int(s), False) for s in args.spins.split(",")}
  if args.pinned and hasattr(os, "sched_setaffinity"):
    cases.update({f"spin {s} us, pinned apart": (int(s), True) for s in args.spins.split(",")})
  if torch is not None: cases["torch"] = (None, False)
  copy = torch.from_numpy(data.copy()) if torch is not None else None
  every_core = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
  worker = pool.threads[0].native_id
  results: dict[str, list[tuple[float, int]]] = {name: [] for name in cases}
  order = random.Random(ROUND_ORDER_SEED)
  for _ in range(args.rounds):
    names = list(cases)
    order.shuffle(names)
    for name in names:
      spin, pinned = cases[name]
      if spin is not None: pool.spin_ns = spin * 1000
      if every_core:
        first = min(every_core)
        os.sched_setaffinity(0, {first} if pinned else every_core)
        os.sched_setaffinity(worker, (every_core - {first}) if pinned else every_core)
      call = (lambda: copy.sum()) if spin is None else (lambda: x.sum().realize())
      time.sleep(PAUSE_SECONDS)
      call(), call()
      wakes[0] = 0
      spent = []
      for _ in range(BURST):
        start = time.perf_counter()
        call()
        spent.append(time.perf_counter() - start)
      results[name].append((float(np.median(spent)), wakes[0]))
  if every_core:
    os.sched_setaffinity(0, every_core)
    os.sched_setaffinity(worker, every_core)
  cores.CorePool.run = plain_run
  print(f"load average {os.getloadavg()[0]:.2f}; x.sum().realize() of {SIZE >> 20}M float32, bursts of {BURST} after "
        f"{PAUSE_SECONDS} s")
  for name, rows in results.items():
    print(f"  {name:28s} {np.median([r[0] for r in rows]) * 1e6:8.0f} µs a call; workers woken per burst: "
          f"{[r[1] for r in rows]}")

if __name__ == "__main__":
  main()
