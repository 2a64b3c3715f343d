"""BEAM search cost of a whole training step: a 2-layer MLP (SGD) with BEAM=2, run twice in fresh processes.

The first process searches every kernel of the step (forward, backward, optimizer) and caches the winners; the
second finds them all in the cache and searches nothing. Each prints the step's wall time, how many kernels were
searched, and the median search time per kernel. Usage: python bench/search_mlp.py [--device LLVM|CUDA]

`--jit` instead times the same step (heuristic kernels) without and with TinyJit in one process: the median step
time of each, whether both end with the same weights, and the JIT's memory plan (planned activation arena vs the
sum of all transient buffer sizes, estimate_memory(), and the device memory the capture call allocated).
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time

BATCH, IN_FEATURES, HIDDEN, CLASSES = 128, 784, 256, 10
JIT_STEPS = 20   # timed steps per path with --jit (after two warm-up steps: compile, then the JIT's capture)

def one_step(device: str) -> dict:
  """Child process (DEVICE is set in its environment): one training step under BEAM, and what the search did."""
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  import numpy as np
  from tgrad import Tensor, nn
  from tgrad.nn.optim import SGD
  from tgrad.nn.state import get_parameters
  import tgrad.codegen.search as search
  searches: list[float] = []
  original = search.search_kernel
  def counted(kernel, beam_width):
    start = time.perf_counter()
    result = original(kernel, beam_width)
    if not result.stats.from_cache: searches.append(time.perf_counter() - start)
    return result
  search.search_kernel = counted
  Tensor.manual_seed(0)
  layers = [nn.Linear(IN_FEATURES, HIDDEN), nn.Linear(HIDDEN, CLASSES)]
  optimizer = SGD(get_parameters(layers), lr=0.01)
  rng = np.random.default_rng(0)
  x = Tensor(rng.standard_normal((BATCH, IN_FEATURES), dtype=np.float32), device=device)
  y = Tensor(rng.integers(0, CLASSES, BATCH).astype(np.int32), device=device)
  start = time.perf_counter()
  with Tensor.train():
    optimizer.zero_grad()
    loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
    loss.backward()
    Tensor.realize(loss, *optimizer.schedule_step())
  return {"step_s": time.perf_counter() - start, "kernels_searched": len(searches),
          "median_search_s": statistics.median(searches) if searches else 0.0, "loss": float(loss.item())}

def device_bytes_in_use(device: str) -> int:
  """Memory the device has handed out: GPU memory in use (total - free), or this process's resident host memory."""
  if device == "CUDA":
    import pycuda.driver as cuda
    free, total = cuda.mem_get_info()
    return total - free
  with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def jit_compare(device: str, steps: int = JIT_STEPS) -> dict:
  """The MLP step without and with TinyJit: median seconds per step, equal weights, and the JIT's memory plan."""
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
  import numpy as np
  from tgrad import Tensor, TinyJit, nn
  from tgrad.device import Device
  from tgrad.helpers import Context
  from tgrad.nn.optim import SGD
  from tgrad.nn.state import get_parameters
  rng = np.random.default_rng(0)
  batches = [(rng.standard_normal((BATCH, IN_FEATURES), dtype=np.float32),
              rng.integers(0, CLASSES, BATCH).astype(np.int32)) for _ in range(steps + 2)]
  report: dict = {"device": device, "steps": steps}
  weights = {}
  for use_jit in (False, True):
    Tensor.manual_seed(0)
    with Context(DEVICE=device): layers = [nn.Linear(IN_FEATURES, HIDDEN), nn.Linear(HIDDEN, CLASSES)]
    optimizer = SGD(get_parameters(layers), lr=0.01, momentum=0.9)
    def step(x: Tensor, y: Tensor) -> Tensor:
      with Tensor.train():
        optimizer.zero_grad()
        loss = layers[1](layers[0](x).relu()).sparse_categorical_crossentropy(y)
        loss.backward()
        Tensor.realize(loss, *optimizer.schedule_step())
      return loss
    run = TinyJit(step) if use_jit else step
    times, in_use = [], 0
    for i, (x, y) in enumerate(batches):
      xt, yt = Tensor(x, device=device).realize(), Tensor(y, device=device).realize()
      Device[device].synchronize()
      if i == 1: in_use = device_bytes_in_use(device)
      start = time.perf_counter()
      run(xt, yt)
      Device[device].synchronize()
      if i == 1 and use_jit: report["capture_call_allocated_bytes"] = device_bytes_in_use(device) - in_use
      if i >= 2: times.append(time.perf_counter() - start)
    name = "jit" if use_jit else "no_jit"
    report[f"{name}_step_ms"] = statistics.median(times) * 1e3
    weights[name] = [p.numpy() for p in get_parameters(layers)]
    if use_jit:
      graph = run.captured
      parts = graph.memory_breakdown()[device]
      report.update(kernels=len(graph.instructions), planned_arena_bytes=parts["activation"],
                    transient_bytes_sum=parts["activations unplanned"], memory_breakdown=parts,
                    estimate_memory=graph.estimate_memory()[device])
  report["same_weights"] = all(np.array_equal(a, b) for a, b in zip(weights["no_jit"], weights["jit"]))
  return report

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--device", default="LLVM")
  parser.add_argument("--jit", action="store_true", help="time the step without and with TinyJit (no search)")
  parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.jit:
    print(json.dumps(jit_compare(args.device), indent=1))
    return
  if args.child:
    print(json.dumps(one_step(args.device)))
    return
  with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, BEAM="2", TGRAD_CACHE=os.path.join(tmp, "cache.db"), DEVICE=args.device)
    for run in ("first run (searches)", "second run (cached)"):
      out = subprocess.run([sys.executable, __file__, "--child", "--device", args.device], env=env, check=True,
                           capture_output=True, text=True).stdout.strip().splitlines()[-1]
      print(f"{run:22s} {out}", flush=True)

if __name__ == "__main__":
  main()
