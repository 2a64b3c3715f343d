"""Packed quantized matrix–vector products on the GPU: µs per projection, GB/s of packed bytes, and the floor.

For each ggml type (Q8_0, Q5_0, Q4_K, Q6_K) and each of gemma-3-270m's decode projection shapes (out × in), a weight
of random blocks built here (random quants, finite random float16 scales: no model file needed) is multiplied by a
random x with QuantizedTensor.linear (one kernel: the blocks dequantized inside the matvec), and the same weight
dequantized to a dense float32 and float16 copy is multiplied by x (x.linear(dense)), for comparison. Each is checked
against float64 numpy over the CPU's dequantization of the same bytes, then timed with CUDA events:
- `single`: one launch, the GPU kept busy by a spin before it so the events see the kernel and not the host (bench/
  matvec.py's Timer; without torch, an event pair around the launch alone), median of --repeats;
- `b2b`: BACK_TO_BACK launches queued between two events, per launch (as in a replayed decode step).
GB/s is the weight's bytes over the b2b time; `floor` is FLOOR_LAUNCH_S + weight bytes / the DRAM bandwidth (from the
device's memory clock and bus width): one kernel streaming just those bytes.
`--dump DIR` writes the rendered CUDA source of the packed kernel of each case (CUDARenderer sm_90, the default
heuristics, or the BEAM winner when BEAM is set) to DIR and needs no GPU.
`--cases Q8_0:262144x640,...` times the given types and shapes instead; `--packed-only` skips the dense copies;
`--row-threads 16,32,128` (with `--block-threads 128,256`) times the packed kernel once per value of the heuristics'
PACKED_MATVEC_ROW_THREADS (and PACKED_MATVEC_BLOCK_THREADS), set for the run: a sweep of the rule's two constants.
Usage: python bench/packed_matvec.py [--types Q4_K,Q8_0] [--all-shapes] [--dtype float32|float16] [--repeats N]
       [--dump DIR] [--dump-only] [--cases T:RxC,...] [--packed-only] [--row-threads N,...] [--block-threads N,...]
"""
from __future__ import annotations
import argparse, os, statistics, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from tgrad import Tensor, dtypes  # noqa: E402
from tgrad.codegen.heuristics import hand_coded_optimizations  # noqa: E402
from tgrad.codegen.kernel import Kernel  # noqa: E402
from tgrad.codegen.linearizer import linearize  # noqa: E402
from tgrad.nn.quant import BLOCK_LAYOUTS, GGMLType, QuantizedTensor  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.realize import lower_schedule  # noqa: E402
from tgrad.schedule import create_schedule  # noqa: E402

# gemma-3-270m's decode projections (out, in): q, k/v, o, gate/up, down. In its Q4_K_M file attn_v is Q8_0, ffn_up
# Q5_0, attn_output Q4_K and ffn_down Q6_K (bench/gguf_quant.py's MATVEC_WEIGHTS): those four are the default cases.
GEMMA_SHAPES = {"q": (1024, 640), "kv": (256, 640), "o": (640, 1024), "up": (2048, 640), "down": (640, 2048)}
FILE_CASES = [("Q8_0", "kv"), ("Q5_0", "up"), ("Q4_K", "o"), ("Q6_K", "down")]
TYPES = ("Q8_0", "Q5_0", "Q4_K", "Q6_K")
# byte offsets of the float16 scales in a block (d, and dmin where the type has one): set to finite random values
SCALE_POSITIONS = {"Q8_0": (0,), "Q5_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,), "Q4_0": (0,), "Q4_1": (0, 2),
                   "Q5_1": (0, 2), "Q5_K": (0, 2)}
REPEATS = 50
BACK_TO_BACK = 100
SPIN_CYCLES = 200_000        # torch.cuda._sleep before a single timed launch (~0.1 ms on an H100)
FLOOR_LAUNCH_S = 2e-6        # an event-timed kernel that does nothing measurable still takes ~2 µs on an H100
FLOAT32_RTOL, HALF_RTOL = 1e-4, 8 * 2.0 ** -11

def random_blocks(type_name: str, rows: int, columns: int, seed: int) -> np.ndarray:
  """Packed bytes (rows, blocks per row × block bytes): random quants and finite random float16 scales."""
  rng = np.random.default_rng(seed)
  layout = BLOCK_LAYOUTS[GGMLType[type_name]]
  raw = rng.integers(0, 256, (rows * columns // layout.block_size, layout.block_bytes), dtype=np.uint8)
  scales = rng.uniform(1e-3, 1e-1, (raw.shape[0], 1)).astype(np.float16).view(np.uint8)
  for position in SCALE_POSITIONS[type_name]: raw[:, position:position + 2] = scales
  return raw.reshape(rows, -1)

def packed_source(type_name: str, rows: int, columns: int, dtype) -> str:
  """The CUDA source of the packed matvec's kernel (sm_90), with the opts a realize would choose (heuristics, or the
  BEAM winner where BEAM is set and a GPU is present)."""
  from tgrad.runtime.cuda.renderer import CUDARenderer
  weight = QuantizedTensor.from_bytes(random_blocks(type_name, rows, columns, 0), GGMLType[type_name], (rows, columns),
                                      "LLVM")
  out = weight.linear(Tensor.empty(1, columns, dtype=dtype, device="LLVM"))
  (item,) = [i for i in create_schedule([out.lazydata]) if i.ast.op is Ops.SINK]
  kernel = Kernel(item.ast, CUDARenderer("sm_90"))
  hand_coded_optimizations(kernel)
  return f"// {type_name} {rows}x{columns} {dtype.name}: opts {kernel.applied_opts}\n" + \
    kernel.renderer.render(f"packed_{type_name.lower()}_{rows}x{columns}", linearize(kernel))

class Timer:
  """Single launches behind a GPU spin (torch, when installed), and back-to-back launches between two events."""
  def __init__(self):
    try:
      import torch
      self.torch = torch if torch.cuda.is_available() else None
    except ImportError: self.torch = None
  def single(self, item, repeats: int) -> float:
    item.run(wait=True)
    times = []
    for _ in range(repeats):
      if self.torch is not None: self.torch.cuda._sleep(SPIN_CYCLES)
      times.append(item.run(wait=True))
    return statistics.median(times)
  def back_to_back(self, item, repeats: int) -> float:
    import pycuda.driver as cuda
    from tgrad.device import Device
    item.run(wait=False)
    Device["CUDA"].synchronize()
    times = []
    for _ in range(max(3, repeats // 10)):
      start, end = cuda.Event(), cuda.Event()
      start.record()
      for _ in range(BACK_TO_BACK): item.run(wait=False)
      end.record()
      end.synchronize()
      times.append(start.time_till(end) / 1e3 / BACK_TO_BACK)
    return statistics.median(times)

def dram_bandwidth() -> tuple[str, float]:
  """(GPU name, theoretical DRAM bytes/s = 2 transfers per memory clock × bus width)."""
  from tgrad.device import Device
  context = Device["CUDA"].context
  clock_hz = context.attribute("MEMORY_CLOCK_RATE") * 1e3
  return context.device.name(), 2 * clock_hz * context.attribute("GLOBAL_MEMORY_BUS_WIDTH") / 8

def one_kernel(out: Tensor):
  items = lower_schedule(out.schedule())
  if len(items) != 1: raise RuntimeError(f"expected one kernel, got {len(items)}")
  return items[0]

def measure(type_name: str, rows: int, columns: int, dtype, timer: Timer, repeats: int, bandwidth: float,
            packed_only: bool = False) -> dict:
  raw = random_blocks(type_name, rows, columns, rows + columns)
  ggml_type = GGMLType[type_name]
  weight = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "CUDA").realize()
  values = QuantizedTensor.from_bytes(raw, ggml_type, (rows, columns), "LLVM").dequantize().numpy()
  x_host = np.random.default_rng(1).standard_normal((1, columns)).astype(np.float32)
  x = Tensor(x_host, device="CUDA").cast(dtype).realize()
  reference = x_host.astype(dtype.np).astype(np.float64) @ values.astype(np.float64).T
  rtol = HALF_RTOL if dtype == dtypes.float16 else FLOAT32_RTOL
  row = {"type": type_name, "shape": f"{rows}x{columns}", "packed_bytes": weight.nbytes,
         "floor_us": (FLOOR_LAUNCH_S + weight.nbytes / bandwidth) * 1e6}
  variants = {"packed": weight.linear(x)}
  if not packed_only:
    dense32 = Tensor(values, device="CUDA").realize()
    variants.update(f32=x.cast(dtypes.float32).linear(dense32.transpose()),
                    f16=x.cast(dtypes.float16).linear(dense32.cast(dtypes.float16).realize().transpose()))
  nbytes = {"packed": weight.nbytes, "f32": values.size * 4, "f16": values.size * 2}
  for name, out in variants.items():
    item = one_kernel(out)
    item.run(wait=True)
    got = item.bufs[0].copyout().astype(np.float64).reshape(reference.shape)
    np.testing.assert_allclose(got, reference, rtol=rtol if name != "f16" else HALF_RTOL,
                               atol=(rtol if name != "f16" else HALF_RTOL) * np.abs(reference).max())
    row[f"{name}_single_us"] = timer.single(item, repeats) * 1e6
    row[f"{name}_b2b_us"] = timer.back_to_back(item, repeats) * 1e6
    row[f"{name}_GBps"] = nbytes[name] / (row[f"{name}_b2b_us"] / 1e6) / 1e9
    row[f"{name}_opts"] = " ".join(f"{o.op.name}:{o.axis}:{o.amount}" for o in getattr(item.runner, "opts", []))
    row[f"{name}_launch"] = (getattr(item.runner, "global_size", None), getattr(item.runner, "local_size", None))
  return row

def cases(types: list[str], all_shapes: bool) -> list[tuple[str, int, int]]:
  if all_shapes:   # the shapes whose rows are whole blocks of the type (a K-quant's 256 values don't divide 640)
    return [(t, rows, columns) for t in types for rows, columns in GEMMA_SHAPES.values()
            if columns % BLOCK_LAYOUTS[GGMLType[t]].block_size == 0]
  return [(t, *GEMMA_SHAPES[s]) for t, s in FILE_CASES if t in types]

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--types", default=",".join(TYPES))
  parser.add_argument("--all-shapes", action="store_true", help="every gemma projection shape for every type")
  parser.add_argument("--dtype", default="float32", choices=("float32", "float16"))
  parser.add_argument("--repeats", type=int, default=REPEATS)
  parser.add_argument("--dump", help="write each case's packed kernel's CUDA source to this folder")
  parser.add_argument("--dump-only", action="store_true", help="with --dump: render only, time nothing (no GPU)")
  parser.add_argument("--cases", help="type:ROWSxCOLUMNS,... in place of the gemma shapes")
  parser.add_argument("--packed-only", action="store_true", help="time only the packed kernel")
  parser.add_argument("--row-threads", help="comma-separated values of matvec_rules.PACKED_MATVEC_ROW_THREADS to sweep")
  parser.add_argument("--block-threads", help="comma-separated values of matvec_rules.PACKED_MATVEC_BLOCK_THREADS")
  args = parser.parse_args()
  dtype = getattr(dtypes, args.dtype)
  selected = cases(args.types.split(","), args.all_shapes)
  if args.cases:
    selected = [(t, *map(int, shape.split("x"))) for t, shape in (case.split(":") for case in args.cases.split(","))]
  if args.row_threads: return sweep(selected, dtype, args)
  if args.dump:
    folder = Path(args.dump)
    folder.mkdir(parents=True, exist_ok=True)
    for type_name, rows, columns in selected:
      path = folder / f"{type_name}_{rows}x{columns}_{dtype.name}.cu"
      path.write_text(packed_source(type_name, rows, columns, dtype))
      print(f"wrote {path}")
    if args.dump_only: return
  name, bandwidth = dram_bandwidth()
  timer = Timer()
  print(f"{name}: DRAM {bandwidth / 1e12:.2f} TB/s; x {dtype.name}; single-launch timing "
        f"{'behind a torch spin' if timer.torch else 'without a spin (adds launch gaps)'}")
  print(f"{'type':5s} {'shape':10s} {'bytes':>8s} {'floor us':>8s} | {'packed single':>13s} {'b2b':>6s} {'GB/s':>6s} | "
        f"{'f32 b2b':>7s} {'GB/s':>6s} | {'f16 b2b':>7s} {'GB/s':>6s}")
  for type_name, rows, columns in selected:
    r = measure(type_name, rows, columns, dtype, timer, args.repeats, bandwidth)
    print(f"{r['type']:5s} {r['shape']:10s} {r['packed_bytes']:8d} {r['floor_us']:8.2f} | "
          f"{r['packed_single_us']:13.2f} {r['packed_b2b_us']:6.2f} {r['packed_GBps']:6.1f} | "
          f"{r['f32_b2b_us']:7.2f} {r['f32_GBps']:6.1f} | {r['f16_b2b_us']:7.2f} {r['f16_GBps']:6.1f}", flush=True)

def sweep(selected: list[tuple[str, int, int]], dtype, args) -> None:
  """The packed kernel of each case under each (row threads, block threads) pair of the matvec rules' constants."""
  from tgrad.codegen import matvec_rules
  import rule_settings
  name, bandwidth = dram_bandwidth()
  timer = Timer()
  print(f"{name}: DRAM {bandwidth / 1e12:.2f} TB/s; x {dtype.name}; sweep of the packed matvec rule's constants")
  block_values = [int(v) for v in (args.block_threads or str(matvec_rules.PACKED_MATVEC_BLOCK_THREADS)).split(",")]
  for type_name, rows, columns in selected:
    for row_threads in (int(v) for v in args.row_threads.split(",")):
      for block_threads in block_values:
        rule_settings.apply(rule_settings.parse([f"PACKED_MATVEC_ROW_THREADS={row_threads}",
                                                 f"PACKED_MATVEC_BLOCK_THREADS={block_threads}"]))
        r = measure(type_name, rows, columns, dtype, timer, args.repeats, bandwidth, packed_only=True)
        print(f"{type_name:5s} {rows}x{columns} row threads {row_threads:4d} block {block_threads:4d}: floor "
              f"{r['floor_us']:7.2f} us, b2b {r['packed_b2b_us']:7.2f} us, {r['packed_GBps']:7.1f} GB/s, single "
              f"{r['packed_single_us']:7.2f} us  {r['packed_launch']} {r['packed_opts']}", flush=True)

if __name__ == "__main__": main()
