"""Tensor parallelism for Gemma 3 (Megatron style) over a tuple of devices: how each weight is placed, and the
per-device views the model (tgrad/models/gemma3.py) reads its stacked projections through.

Input: a single-device model's weights (HF names) and devices ("CUDA:0", "CUDA:1"); output: the same names holding
sharded Tensors (tgrad/multi/), from which `Gemma3` builds the same layers. With P devices:
  q_proj                 split by rows, i.e. by query heads: device p computes heads [p·nq/P, (p+1)·nq/P)
  k_proj, v_proj         replicated: every device computes the KV heads (gemma-3-270m has one, which can't be split)
  o_proj                 split along its input (the heads): a partial product per device, then one all-reduce
  gate_proj, up_proj     split by rows (the intermediate axis): gelu(gate) · up stays on its device
  down_proj              split along its input: a partial product per device, then one all-reduce
  norms, embedding       replicated (the lookup is a per-device gather, the residual stream is the same on each)
  head                   split by vocabulary rows (tied: a view of the replicated embedding; untied lm_head: split),
                         so the logits come out split by vocabulary and the greedy argmax (Tensor.argmax over the
                         split axis) costs two all-reduces of one value per row
  KV cache               replicated, written on each device from its own copy of k and v (no traffic)
Packed (GGUF-quantized) weights keep their blocks: those split by rows split their packed rows (whole rows of blocks);
o_proj and down_proj, split along their input, are held whole on every device, each reading only the blocks of its
part of the input (the dequantization views a weight's blocks as rows of the flat block list, which a split of each
row's blocks would gather), so those two cost their full size on every device.
So a layer costs two all-reduces of one [B, T, hidden] value: one after the attention block, one after the MLP.

The stacked q/k/v and gate/up buffers (one matrix-vector kernel each) are stacked per device: device p's buffer holds
its rows of every stacked weight, and `RowPiece`s say where each weight's rows sit in it, so a weight's output is a
per-device slice of the stacked output (`take_rows`), split or replicated as the weight is, never a gather.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Optional, Sequence
from tgrad.tensor import Tensor
from tgrad.device import canonical_device
from tgrad.multi import MultiLazyBuffer
from tgrad.nn.quant import QuantizedTensor

# the axis each projection is split along (by the end of its HF name); every other weight is replicated
SPLIT_AXES = {"self_attn.q_proj.weight": 0, "self_attn.o_proj.weight": 1, "mlp.gate_proj.weight": 0,
              "mlp.up_proj.weight": 0, "mlp.down_proj.weight": 1, "lm_head.weight": 0}

def split_axis(name: str) -> Optional[int]:
  """The axis a weight is split along in the tensor-parallel layout (None: replicated)."""
  return next((axis for suffix, axis in SPLIT_AXES.items() if name.endswith(suffix)), None)

def check_parallel(config: Any, devices: Sequence[str]) -> tuple[str, ...]:
  """The canonical devices, after checking that the model splits evenly over them (ValueError naming the size)."""
  devices = tuple(canonical_device(d) for d in devices)
  if len(set(devices)) != len(devices) or len(devices) < 2:
    raise ValueError(f"tensor parallelism needs two or more distinct devices, got {devices}")
  parts = len(devices)
  sizes = {"num_attention_heads": config.num_attention_heads, "intermediate_size": config.intermediate_size}
  if bad := {name: size for name, size in sizes.items() if size % parts}:
    raise ValueError(f"tensor parallelism over {parts} devices needs {bad} divisible by {parts}")
  return devices

def shard_weights(config: Any, weights: dict[str, Any], devices: Sequence[str]) -> dict[str, Any]:
  """Every weight placed on `devices` by the layout above, each shard its own realized buffer. A packed
  (ggml-quantized) weight keeps its blocks: one split by rows (column-parallel) splits its packed rows whole, each with
  all its blocks; one split along its input (o_proj, down_proj: row-parallel) is held whole on every device, which
  reads only the blocks of its part of the input (splitting a row's blocks would merge the rows apart in the
  dequantization's view of them)."""
  devices = check_parallel(config, devices)
  out: dict[str, Any] = {}
  for name, weight in weights.items():
    axis = split_axis(name)
    if isinstance(weight, QuantizedTensor):
      packed = weight.packed.shard(devices, 0 if axis == 0 else None).contiguous().realize()
      out[name] = QuantizedTensor(packed, weight.ggml_type, weight.shape)
    else: out[name] = weight.shard(devices, axis).contiguous().realize()
  return out

def head_weight(weight: Any) -> Any:
  """The head's [vocab, hidden] weight as the logits' kernel reads it: a replicated table (a tied embedding) seen split
  by vocabulary rows (a view on each device, no copy) when the vocabulary divides evenly (a packed table: its rows of
  blocks); anything else as it is."""
  if isinstance(weight, QuantizedTensor): return QuantizedTensor(head_weight(weight.packed), weight.ggml_type,
                                                                 weight.shape)
  lazy = weight.lazydata
  if not isinstance(lazy, MultiLazyBuffer) or lazy.axis is not None or weight.shape[0] % len(lazy.shards): return weight
  return weight.shard(weight.device, 0)

def is_sharded(t: Any) -> bool: return isinstance(t, Tensor) and isinstance(t.lazydata, MultiLazyBuffer)

def device_buffers(t: Tensor) -> list:
  """The realized buffers of a tensor: one, or one per device of a sharded one."""
  lazy = t.lazydata
  return [shard.base.buffer for shard in (lazy.shards if isinstance(lazy, MultiLazyBuffer) else (lazy,))]

# ---------------------------------------------------------------------------------------------------------------
# stacked rows: several [out, in] weights in one buffer per device

@dataclass(frozen=True)
class RowPiece:
  """Where one stacked weight's rows sit in each device's buffer: rows [start, end) of every shard; `split`: each
  device holds its own part of the weight (else every device holds all of it)."""
  start: int
  end: int
  split: bool

def row_pieces(weights: Sequence[Any]) -> list[RowPiece]:
  """The pieces of weights stacked along their rows (a single-device stack: one device, whole weights)."""
  pieces, start = [], 0
  for w in weights:
    if isinstance(w, QuantizedTensor): w = w.packed   # its packed rows are its rows
    lazy = w.lazydata if isinstance(w, Tensor) else None
    split = isinstance(lazy, MultiLazyBuffer) and lazy.axis is not None
    rows = w.shape[0] // len(lazy.shards) if split else w.shape[0]
    pieces.append(RowPiece(start, start + rows, split))
    start += rows
  return pieces

def stack_rows_per_device(weights: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
  """Sharded [out, in] weights (each split by rows or replicated) stacked into one realized buffer per device (its rows
  of each weight, in order), and each weight again as a view of it (split or replicated as it was)."""
  lazies = [w.lazydata for w in weights]
  if not all(isinstance(lazy, MultiLazyBuffer) and lazy.axis in (None, 0) for lazy in lazies) or \
     len({w.device for w in weights}) != 1:
    raise ValueError(f"stacking needs weights on one device set, each split by rows or replicated: "
                     f"{[getattr(lazy, 'axis', None) for lazy in lazies]} on {[w.device for w in weights]}")
  per_device = [Tensor(lazies[0].shards[i]).cat(*[Tensor(lazy.shards[i]) for lazy in lazies[1:]], dim=0)
                for i in range(len(lazies[0].shards))]
  stacked = Tensor(MultiLazyBuffer([t.lazydata for t in per_device], 0)).realize()
  return stacked, [take_rows(stacked, piece, 0) for piece in row_pieces(weights)]

def split_rows_like(copies: Tensor, values: Tensor, row_axis: int) -> Tensor:
  """Copies of a vector, one per output row of a matrix-vector kernel (axis `row_axis`), split by rows over devices
  when the kernel's weight values are (each device its own rows: a view), so the reduces over them (a norm's sum of
  squares) run inside that device's kernel over its rows only; else as they are."""
  if not is_sharded(values) or values.lazydata.axis != 0: return copies
  return copies.shard(values.device, row_axis)

def take_rows(x: Tensor, piece: RowPiece, axis: int) -> Tensor:
  """Rows [piece.start, piece.end) along `axis` of every device's part of x (x stacked along `axis` as row_pieces
  says): a view, split along `axis` when the piece is split, else replicated. One device: x's slice."""
  if not is_sharded(x): return x[(slice(None),) * axis + (slice(piece.start, piece.end),)] if axis >= 0 else \
    x[(Ellipsis, slice(piece.start, piece.end)) + (slice(None),) * (-1 - axis)]
  lazy = x.lazydata
  axis = axis % x.ndim
  bounds = tuple((piece.start, piece.end) if d == axis else (0, s) for d, s in enumerate(lazy.shards[0].shape))
  return Tensor(MultiLazyBuffer([shard.shrink(bounds) for shard in lazy.shards], axis if piece.split else None))
