"""The kernels of one Gemma 3 decode step, scheduled for any device without starting it (no GPU needed for CUDA).

The model is built with random weights and its decode step (`Gemma3._decode_step`) is traced twice, as TinyJit
captures it on a model's second call (what the first made stays realized), with lowering and running switched off:
every realize only schedules (and commits Buffers that are never allocated), so the count is exactly what the
captured step launches on that device, and nothing is compiled. Prints each kernel: its output and input buffers
(dtype[size]) and how many reduces it runs.
With --devices CUDA:0,CUDA:1 the model is tensor-parallel (Gemma3.shard): the kernels of every device, and the
copies between devices (what the all-reduces move) are counted too.
With --time N (on a machine with the device) each kernel is then lowered as realize lowers it (the same opts) and
launched alone N times on its Buffers (allocated, never filled: the weights' values don't change a kernel's time);
its least time is printed beside it, and the step's sum: which kernels a fusion must beat, and, with RIDERS=0 and
RIDERS=1 in two runs, what a rider costs its host.
With --packed the projections and the embedding are packed ggml blocks in the type mix of llama.cpp's Q4_K_M
gemma-3-270m file (PACKED_Q4_K_M; the blocks are zeros: only the schedule is looked at), as load_gemma3_gguf(...,
"packed") holds them.
Usage: python bench/decode_kernels.py [--preset 270m] [--device CUDA] [--dtype float16] [--position 600]
       [--devices CUDA:0,CUDA:1] [--time 20] [--packed]
"""
from __future__ import annotations
import argparse, contextlib, os, sys
from typing import Iterator
import numpy as np
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tgrad.realize as realize_module  # noqa: E402
from tgrad.realize import lower_schedule  # noqa: E402
from tgrad.bounds import drop_pending_checks, pending_checks  # noqa: E402
from tgrad.dtype import to_dtype  # noqa: E402
from tgrad.ops import Ops  # noqa: E402
from tgrad.schedule import ScheduleItem  # noqa: E402
from tgrad.models.gemma3 import Gemma3, Gemma3Config, Weight  # noqa: E402
from tgrad.models.gemma3_config import weight_shapes  # noqa: E402
from tgrad.nn.quant import GGMLType, QuantizedTensor, packed_nbytes  # noqa: E402
from tgrad.tensor import Tensor  # noqa: E402

KERNEL_OPS = (Ops.SINK, Ops.CUSTOM)   # the items that launch a kernel

@contextlib.contextmanager
def schedule_only() -> Iterator[list[ScheduleItem]]:
  """Inside: every realize schedules and commits but lowers and runs nothing (no compile, no device start); yields
  the list that receives every ScheduleItem. Index checks are skipped as under a TinyJit capture."""
  items: list[ScheduleItem] = []
  def record(scheduled):
    items.extend(scheduled)
    return []
  saved, checks_before = (realize_module.lower_schedule, realize_module.run), pending_checks()
  realize_module.lower_schedule, realize_module.run = record, lambda *args, **kwargs: None
  try:
    with realize_module.capturing(): yield items
  finally:
    realize_module.lower_schedule, realize_module.run = saved
    drop_pending_checks(keep=checks_before)   # index checks of values never computed: the next realize would run them

# the ggml types of llama.cpp's Q4_K_M gemma-3-270m (gemma-3-270m-q4_k_m.gguf): by projection, and in the layers that
# it gives more bits (its use_more_bits layers) v in Q8_0 and down in Q6_K
PACKED_Q4_K_M = {"q_proj": GGMLType.Q5_0, "k_proj": GGMLType.Q5_0, "v_proj": GGMLType.Q5_0, "o_proj": GGMLType.Q4_K,
                 "gate_proj": GGMLType.Q5_0, "up_proj": GGMLType.Q5_0, "down_proj": GGMLType.Q4_K,
                 "embed_tokens": GGMLType.Q8_0}
PACKED_Q4_K_M_MORE_BITS = {"v_proj": GGMLType.Q8_0, "down_proj": GGMLType.Q6_K}
Q4_K_M_MORE_BITS_LAYERS = (0, 1, 4, 7, 10, 13, 15, 16, 17)

def packed_weights(config: Gemma3Config, device: str) -> dict[str, Weight]:
  """Weights as a packed Q4_K_M GGUF model holds them (PACKED_Q4_K_M), the blocks all zero bytes, the norms zero."""
  weights: dict[str, Weight] = {}
  for name, shape in weight_shapes(config).items():
    parts = name.split(".")
    kind = parts[-2]
    if kind not in PACKED_Q4_K_M:
      weights[name] = Tensor.zeros(*shape, device=device).contiguous().realize()
      continue
    more_bits = len(parts) > 3 and parts[1] == "layers" and int(parts[2]) in Q4_K_M_MORE_BITS_LAYERS
    ggml_type = PACKED_Q4_K_M_MORE_BITS.get(kind, PACKED_Q4_K_M[kind]) if more_bits else PACKED_Q4_K_M[kind]
    weights[name] = QuantizedTensor.from_bytes(np.zeros(packed_nbytes(ggml_type, shape), np.uint8), ggml_type, shape,
                                               device).realize()
  return weights

def decode_step_items(preset: str = "270m", device: str = "CUDA", dtype: str = "float16", position: int = 600,
                      context: int = 1024, devices: tuple[str, ...] = (), packed: bool = False) -> list[ScheduleItem]:
  """Every ScheduleItem of one decode step of `preset` at `position`, scheduled for `device` (or tensor-parallel over
  `devices`) without starting it; `packed`: with packed weights (packed_weights)."""
  with schedule_only() as items:
    config, first_device = Gemma3Config.preset(preset), devices[0] if devices else device
    if packed: model = Gemma3(config, packed_weights(config, first_device), to_dtype(dtype))
    else: model = Gemma3.random(config, to_dtype(dtype), first_device, progress=False)
    if devices: model = model.shard(devices)
    model.reset_cache(1, context)
    model._decode_inputs(1)
    # the step as TinyJit captures it: the model's second call. The first runs eagerly, and what it made stays
    # realized and written (flash decoding's zeroed scratch: later graphs read it without a fill of their own)
    items.clear()
    model._decode_step(*model.cache.decode_variables(position))
    for item in items:
      for buffer in item.outputs: buffer.wrote()
    items.clear()
    model._decode_step(*model.cache.decode_variables(position))
  return items

def decode_step_kernels(preset: str = "270m", device: str = "CUDA", dtype: str = "float16", position: int = 600,
                        context: int = 1024, packed: bool = False) -> list[ScheduleItem]:
  """The kernels (ScheduleItems with a kernel AST, and custom kernels: flash decoding) of one decode step, as
  decode_step_items schedules it."""
  items = decode_step_items(preset, device, dtype, position, context, packed=packed)
  return [item for item in items if item.ast.op in KERNEL_OPS]

def kernel_seconds(items: list[ScheduleItem], repeats: int) -> list[float]:
  """Each kernel's least time over `repeats` launches alone (wait=True: device events on CUDA, the host clock on a
  CPU), lowered as realize lowers it (a CPU matmul's packing copies included). Its Buffers are allocated on first use
  and never filled."""
  def once(launches) -> float: return sum(launch.run(wait=True) or 0.0 for launch in launches)
  return [min(once(launches) for _ in range(repeats)) for launches in (lower_schedule([item]) for item in items)]

def describe(item: ScheduleItem) -> str:
  def buffers(bufs) -> str: return " ".join(f"{b.dtype.name}[{b.size}]" for b in bufs)
  reduces = sum(1 for u in item.ast.toposort() if u.op is Ops.REDUCE_AXIS)
  return f"out {buffers(item.outputs)} <- {buffers(item.inputs)}; {reduces} reduces"

if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="270m")
  parser.add_argument("--device", default="CUDA")
  parser.add_argument("--dtype", default="float16")
  parser.add_argument("--position", type=int, default=600)
  parser.add_argument("--devices", help="tensor-parallel over these devices, e.g. CUDA:0,CUDA:1")
  parser.add_argument("--packed", action="store_true", help="packed weights in the types of a Q4_K_M GGUF file")
  parser.add_argument("--time", type=int, default=0, metavar="N",
                      help="launch each kernel alone N times on the device and print its least time")
  args = parser.parse_args()
  if args.devices:
    devices = tuple(args.devices.split(","))
    items = decode_step_items(args.preset, args.device, args.dtype, args.position, devices=devices)
    kernels = [item for item in items if item.ast.op in KERNEL_OPS]
    copies = [item for item in items if item.ast.op is Ops.COPY and item.bufs[0].device != item.bufs[1].device]
    for device in {item.outputs[0].device: None for item in kernels}:
      print(f"{sum(item.outputs[0].device == device for item in kernels)} kernels on {device}")
    sizes = sorted({item.bufs[0].nbytes for item in copies})
    print(f"{len(copies)} copies between devices, of {sizes} bytes, in one tensor-parallel decode step of "
          f"{args.preset} over {', '.join(devices)}")
    sys.exit(0)
  kernels = decode_step_kernels(args.preset, args.device, args.dtype, args.position, packed=args.packed)
  seconds = kernel_seconds(kernels, args.time) if args.time else []
  for k, item in enumerate(kernels):
    print(f"{k:4d} {f'{seconds[k] * 1e6:9.2f} us ' if seconds else ''}{describe(item)}")
  if seconds: print(f"{sum(seconds) * 1e6:.1f} us: the kernels' least times summed (each launched alone)")
  layers = Gemma3Config.preset(args.preset).num_hidden_layers
  print(f"{len(kernels)} kernels in one decode step of {args.preset} ({layers} layers{', packed' * args.packed}) on "
        f"{args.device}")
