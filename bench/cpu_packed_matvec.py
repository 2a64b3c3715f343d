"""Packed quantized matrix–vector products on the CPU (LLVM): µs per projection, GB/s of packed bytes against the
machine's memory bandwidth.

The ceiling first: a float32 sum over CEILING_MB of memory by tgrad (one kernel, both threads) and by numpy, best of
--repeats. Then for each case (a ggml type and an (out, in) shape of gemma-3-270m's decode: the defaults are the file's
types at their shapes, the Q8_0 LM head included) a weight of random blocks (bench/packed_matvec.py's random_blocks) is
multiplied by one random row of x along each lowering of `packed_linear` ("default": float32 values; "int8": x
quantized per block of 32), and along `rms_normed_linear` (the norm fused into the product, as the model's
projections call it; `--normed`). Each result is checked against float64 numpy over the CPU's dequantization of the
same bytes (float32 paths at FLOAT32_RTOL of the largest output; int8 reports its error), then timed: one kernel,
`run(wait=True)`, median of --repeats. GB/s is the packed bytes over that time, and `%` its share of tgrad's
ceiling; `cpu us` is the process's CPU time per run (both threads together), steadier under load.
Usage: python bench/cpu_packed_matvec.py [--cases Q8_0:262144x640,...] [--repeats 20] [--normed]
"""
from __future__ import annotations
import argparse, os, statistics, sys, time
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor  # noqa: E402
from tgrad.nn.quant import GGMLType, INT8, PACKED_LINEAR, RMS_NORMED_LINEAR, QuantizedTensor, \
  rms_normed_linear  # noqa: E402
from tgrad.realize import lower_schedule  # noqa: E402
from tgrad.regions import DEFAULT, apply_lowering, lowerings_for, regions_above  # noqa: E402
from packed_matvec import random_blocks  # noqa: E402

DEVICE = "LLVM"
CEILING_MB = 128
# gemma-3-270m Q4_K_M's decode projections: the LM head (the tied embedding, Q8_0), v (Q8_0 in some layers), q and
# gate/up (Q5_0; k is Q5_0 256x640), o (Q4_K), down (Q6_K, Q4_K in some layers)
DEFAULT_CASES = "Q8_0:262144x640,Q8_0:256x640,Q5_0:2048x640,Q5_0:1024x640,Q4_K:640x1024,Q6_K:640x2048,Q4_K:640x2048"
FLOAT32_RTOL = 1e-4
EPS = 1e-6

def timed(item, repeats: int) -> float:
  """Median wall seconds of one run (both threads)."""
  item.run(wait=True)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    item.run(wait=True)
    times.append(time.perf_counter() - start)
  return statistics.median(times)

def cpu_seconds(item, repeats: int) -> float:
  """The process's CPU seconds per run (every thread's): steadier than wall time on a shared machine."""
  start = time.process_time()
  for _ in range(repeats): item.run(wait=True)
  return (time.process_time() - start) / repeats

def ceiling(repeats: int) -> dict:
  """GB/s of a float32 sum over CEILING_MB: tgrad's kernel and numpy's."""
  count = CEILING_MB * 2 ** 20 // 4
  host = np.random.default_rng(0).standard_normal(count).astype(np.float32)
  data = Tensor(host, device=DEVICE).realize()
  items = lower_schedule(data.sum().schedule())   # a long sum may be two kernels (blocks, then their sums)
  numpy_times = []
  for _ in range(repeats):
    start = time.perf_counter()
    host.sum()
    numpy_times.append(time.perf_counter() - start)
  return {"tgrad_GBps": host.nbytes / sum(timed(item, repeats) for item in items) / 1e9,
          "numpy_GBps": host.nbytes / min(numpy_times) / 1e9}

def lowered(out: Tensor, lowering: str):
  """The one kernel that computes `out` with every packed region lowered to `lowering` (the others default)."""
  for region in regions_above(out.lazydata):
    if region.name in (PACKED_LINEAR, RMS_NORMED_LINEAR) and lowering in lowerings_for(region):
      apply_lowering(region, lowering)
  return lower_schedule(out.schedule())

def measure(type_name: str, rows: int, columns: int, repeats: int, normed: bool, ceiling_GBps: float) -> list[dict]:
  raw = random_blocks(type_name, rows, columns, rows + columns)
  weight = QuantizedTensor.from_bytes(raw, GGMLType[type_name], (rows, columns), DEVICE).realize()
  values = weight.dequantize().numpy().astype(np.float64)
  rng = np.random.default_rng(1)
  x_host = rng.standard_normal((1, columns)).astype(np.float32)
  scale_host = rng.uniform(0.5, 1.5, columns).astype(np.float32)
  x, scale = Tensor(x_host, device=DEVICE).realize(), Tensor(scale_host, device=DEVICE).realize()
  reference = x_host.astype(np.float64) @ values.T
  inverse = 1 / np.sqrt(np.mean(x_host.astype(np.float64) ** 2) + EPS)
  normed_reference = (x_host.astype(np.float64) * scale_host) @ values.T * inverse
  rows_out = []
  products = [("linear", lambda: weight.linear(x), reference)]
  if normed: products.append(("normed", lambda: rms_normed_linear(x, scale, weight, EPS), normed_reference))
  for product, build, expected in products:
    for lowering in (DEFAULT, INT8):
      items = lowered(build(), lowering)
      for item in items: item.run(wait=True)
      got = items[-1].bufs[0].copyout().astype(np.float64).reshape(expected.shape)
      error = float(np.abs(got - expected).max() / np.abs(expected).max())
      if lowering == DEFAULT and error > FLOAT32_RTOL:
        raise AssertionError(f"{type_name} {rows}x{columns} {product}: error {error:.2e} over {FLOAT32_RTOL}")
      seconds = sum(timed(item, repeats) for item in items)
      cpu = sum(cpu_seconds(item, repeats) for item in items)
      rows_out.append({"case": f"{type_name} {rows}x{columns}", "product": product, "lowering": lowering,
                       "kernels": len(items), "us": seconds * 1e6, "cpu_us": cpu * 1e6,
                       "GBps": weight.nbytes / seconds / 1e9,
                       "ceiling_share": weight.nbytes / seconds / 1e9 / ceiling_GBps, "rel_error": error,
                       "names": " ".join(item.runner.name for item in items if hasattr(item.runner, "name"))})
  return rows_out

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--cases", default=DEFAULT_CASES)
  parser.add_argument("--repeats", type=int, default=20)
  parser.add_argument("--normed", action="store_true", help="also time rms_normed_linear")
  args = parser.parse_args()
  print(f"load average {os.getloadavg()}")
  bandwidth = ceiling(args.repeats)
  print(f"ceiling: float32 sum over {CEILING_MB} MB: tgrad {bandwidth['tgrad_GBps']:.1f} GB/s, "
        f"numpy {bandwidth['numpy_GBps']:.1f} GB/s")
  print(f"{'case':>18} {'product':>7} {'lowering':>8} {'k':>2} {'us':>9} {'cpu us':>9} {'GB/s':>6} {'%ceil':>6} "
        f"{'rel err':>8}  kernels")
  for case in args.cases.split(","):
    type_name, shape = case.split(":")
    rows, columns = (int(n) for n in shape.split("x"))
    for r in measure(type_name, rows, columns, args.repeats, args.normed, bandwidth["tgrad_GBps"]):
      print(f"{r['case']:>18} {r['product']:>7} {r['lowering']:>8} {r['kernels']:2d} {r['us']:9.1f} "
            f"{r['cpu_us']:9.1f} {r['GBps']:6.2f} "
            f"{100 * r['ceiling_share']:5.0f}% {r['rel_error']:8.1e}  {r['names']}")
  print(f"load average {os.getloadavg()}")

if __name__ == "__main__":
  main()
