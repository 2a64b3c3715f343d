"""Where the host time of one small eager op goes: `(a + b).realize()` on LLVM, phase by phase.

Walks the eager realize's steps itself (tgrad/realize.py `realize` and `_launch_eager`, on the eager key's hit) with a
host clock read between them, over CALLS calls, and prints each phase's 10th percentile and median in microseconds,
less the cost of reading the clock (measured by an empty phase). The phases: building the graph (the Tensor, its
autograd record, the LazyBuffer), the pre-realize passes (path selection's check), the eager key, its look-up, the
output Buffer (its memory from the allocator's pool, allocated as it is made), the commit to the graph, the handles,
the kernel's launch (the ctypes call), and dropping the result (its Buffer's memory back to the pool). On a shared
machine the 10th percentile is the steadier number; the load average is printed.
Usage: python bench/eager_phases.py [--size 16] [--calls 20000]
"""
from __future__ import annotations
import argparse, json, os, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad import realize as realize_module  # noqa: E402
from tgrad.realize import pre_realize_passes  # noqa: E402
from tgrad.schedule_cache import eager_key, eager_launches  # noqa: E402
from tgrad.device import Buffer, allocators  # noqa: E402
from tgrad.helpers import current_settings  # noqa: E402

PHASES = ("build", "pre-realize passes", "eager key", "look-up", "output Buffer", "commit", "handles", "launch",
          "drop", "clock")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--size", type=int, default=16)
  parser.add_argument("--calls", type=int, default=20000)
  args = parser.parse_args()
  data = np.random.default_rng(0).standard_normal((2, args.size), dtype=np.float32)
  a, b = Tensor(data[0], device="LLVM").realize(), Tensor(data[1], device="LLVM").realize()
  for _ in range(100): (a + b).realize()   # compiles, plans and keeps the eager launch
  clock = time.perf_counter_ns
  samples: dict[str, list[int]] = {phase: [] for phase in PHASES}
  riders = current_settings().RIDERS
  for _ in range(args.calls):
    t0 = clock()
    out = a + b
    t1 = clock()
    lb = out.lazydata
    for realize_pass in pre_realize_passes: realize_pass((lb,))
    t2 = clock()
    key, nodes, bufs = eager_key(lb, riders)
    t3 = clock()
    entry = eager_launches[key]
    t4 = clock()
    _, _, launch, indices, outputs, new_buffers, commits, _, _ = entry
    for device, size, dtype in new_buffers:
      bufs.append(Buffer(device, size, dtype, None, 0, None, allocators.get(device)))
    t5 = clock()
    for p, i, keeps_arg in commits: nodes[p].commit(bufs[i], keeps_arg)
    for node in nodes:
      if node.region is not None: node.set_region(None)
    t6 = clock()
    handles = [bufs[i].handle for i in indices]
    t7 = clock()
    launch(handles, ())
    for i in outputs: bufs[i].wrote()
    t8 = clock()
    del out, lb, nodes, bufs, handles
    t9 = clock()
    t10 = clock()
    for phase, start, end in zip(PHASES, (t0, t1, t2, t3, t4, t5, t6, t7, t8, t9), (t1, t2, t3, t4, t5, t6, t7, t8,
                                                                                    t9, t10)):
      samples[phase].append(end - start)
  np.testing.assert_allclose((a + b).numpy(), data[0] + data[1], rtol=1e-6)
  assert realize_module._launch_eager is not None
  overhead = sorted(samples["clock"])
  out = {"size": args.size, "calls": args.calls}
  for phase in PHASES[:-1]:
    values = sorted(samples[phase])
    p10 = (values[len(values) // 10] - overhead[len(overhead) // 10]) / 1e3
    median = (values[len(values) // 2] - overhead[len(overhead) // 2]) / 1e3
    out[phase] = {"p10_us": round(max(p10, 0.0), 2), "median_us": round(max(median, 0.0), 2)}
  out["sum_p10_us"] = round(sum(v["p10_us"] for k, v in out.items() if isinstance(v, dict)), 2)
  out["load_average"] = [round(v, 2) for v in os.getloadavg()]
  print(json.dumps(out))

if __name__ == "__main__":
  main()
