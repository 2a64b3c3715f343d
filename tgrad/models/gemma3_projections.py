"""Gemma 3's weights used as projections: an [out, in] weight dense or packed (ggml blocks, QuantizedTensor), x·Wᵀ in
x's dtype (`project`), a weight's float32 values with a packed one's block structure kept (`weight_values`, for
kernels that sum over its input axes), and weights stacked along their output rows into one buffer each
(`stacked_rows`), so one matrix–vector kernel reads q, k and v (or gate and up) together.
"""
from __future__ import annotations
from typing import Union
from tgrad.tensor import Tensor
from tgrad.nn.quant import QuantizedTensor, dequantized_values, exact_common_type
from tgrad.models.gemma3_parallel import stack_rows_per_device, is_sharded

Weight = Union[Tensor, QuantizedTensor]   # a projection or embedding weight: dense, or ggml blocks dequantized in use

def project(x: Tensor, weight: Weight) -> Tensor:
  """x @ weight.T for an [out, in] weight, in x's dtype; a packed weight is dequantized inside the matmul's kernel
  (QuantizedTensor.linear), so only its blocks are ever stored."""
  return weight.linear(x) if isinstance(weight, QuantizedTensor) else x @ weight.T

def weight_values(weight: Weight) -> Tensor:
  """An [out, in] weight as float32 [out, *input axes]: a dense weight as it is (input axes (in,)), a packed one
  dequantized lazily with its blocks' structure kept (input axes (blocks per row, *block axes)), so a kernel that sums
  over the input axes reads the packed bytes through plain strided views and the dequantization fuses into it."""
  if not isinstance(weight, QuantizedTensor): return weight.float()
  return dequantized_values(weight.packed, weight.ggml_type, weight.shape)

def split_inputs(x: Tensor, values: Tensor) -> Tensor:
  """x [..., in] viewed as [..., *input axes] of `values` (weight_values' layout)."""
  return x.reshape(*x.shape[:-1], *values.shape[1:])

def input_axes(values: Tensor) -> tuple[int, ...]:
  """The (negative) axes of weight_values' input axes: what a matrix-vector product sums over."""
  return tuple(range(1 - values.ndim, 0))

def stackable(a: Weight, b: Weight) -> bool:
  """Whether two [out, in] weights can share one buffer: both dense, or both packed in the same ggml type."""
  if isinstance(a, QuantizedTensor) or isinstance(b, QuantizedTensor):
    return isinstance(a, QuantizedTensor) and isinstance(b, QuantizedTensor) and a.ggml_type == b.ggml_type
  return True

def stack(weights: list[Weight]) -> tuple[Weight, list[Weight]]:
  """Stackable weights as one realized buffer along their output rows, and each again as a view of it."""
  if isinstance(weights[0], QuantizedTensor):
    ggml_type, width = weights[0].ggml_type, weights[0].shape[1]
    packed = [w.packed for w in weights if isinstance(w, QuantizedTensor)]
    if any(is_sharded(p) for p in packed):   # tensor parallel: each device stacks its packed rows
      stacked_rows, row_views = stack_rows_per_device(packed)
      return QuantizedTensor(stacked_rows, ggml_type, (stacked_rows.shape[0], width)), \
        [QuantizedTensor(view, ggml_type, (view.shape[0], width)) for view in row_views]
    buffer = packed[0].cat(*packed[1:], dim=0).realize() if len(packed) > 1 else packed[0].realize()
    stacked: Weight = QuantizedTensor(buffer, ggml_type, (buffer.shape[0], width))
    def view(start: int, end: int) -> Weight: return QuantizedTensor(buffer[start:end], ggml_type, (end - start, width))
  elif any(is_sharded(w) for w in weights):   # tensor parallel: one buffer per device (gemma3_parallel.py)
    return stack_rows_per_device([w for w in weights if isinstance(w, Tensor)])
  else:
    dense = [w for w in weights if isinstance(w, Tensor)]
    stacked = dense[0].cat(*dense[1:], dim=0).realize() if len(dense) > 1 else dense[0].realize()
    def view(start: int, end: int) -> Weight: return stacked[start:end]   # type: ignore[index]
  views, start = [], 0
  for w in weights:
    views.append(view(start, start + w.shape[0]))
    start += w.shape[0]
  return stacked, views

# A kernel costs about a microsecond of a decode step beside its weight's read (DESIGN.md §8b, measured with
# anchors/launch_floor.cu: 0.96 µs per empty kernel inside a CUDA graph on an H100); at an H100's ~3.3 TB/s that is
# ~3 MB, so packed weights are widened into one type (one buffer, one kernel) only while that adds at most a third of
# it per projection. (Gemma-3-270m Q4_K_M: 300 KB in each of 9 layers.)
MAX_WIDENING_BYTES = 1 << 20

def widened_to_share(weights: tuple[Weight, ...]) -> tuple[Weight, ...]:
  """Packed weights of different ggml types re-encoded into the one of their types that holds the others' values
  exactly (nn/quant.py WIDENINGS: Q5_0 into Q8_0, Q4_K into Q5_K), so they stack into one buffer: the same values,
  one matrix-vector kernel instead of one per type, MAX_WIDENING_BYTES more read at most. Otherwise as they are."""
  packed = [w for w in weights if isinstance(w, QuantizedTensor)]
  if len(packed) != len(weights) or len({w.ggml_type for w in packed}) == 1: return weights
  if any(is_sharded(w.packed) for w in packed): return weights   # tensor parallel: each shard stacks as it is
  target = exact_common_type([w.ggml_type for w in packed])
  if target is None: return weights
  widened = [w.widened(target) for w in packed]
  if sum(w.nbytes for w in widened) - sum(w.nbytes for w in packed) > MAX_WIDENING_BYTES: return weights
  return tuple(widened)

def stacked_rows(*weights: Weight) -> tuple[list[Weight], list[Weight]]:
  """The [out, in] weights stacked along their output rows into realized buffers, so one matrix-vector kernel reads
  each buffer (decode is bound by reading weights, and each kernel costs a launch), and each weight again as a view
  (the checkpoint's names keep working and the memory is held once). Dense weights make one buffer; packed ones one
  per run of the same ggml type (a GGUF file may quantize q and k unlike v), after widening into one type where that
  is exact and cheap (`widened_to_share`)."""
  weights = widened_to_share(weights)
  groups: list[list[Weight]] = [[weights[0]]]
  for w in weights[1:]:
    if stackable(groups[-1][-1], w): groups[-1].append(w)
    else: groups.append([w])
  stacked, views = [], []
  for group in groups:
    buffer, group_views = stack(group)
    stacked.append(buffer)
    views += group_views
  return stacked, views

def concat_outputs(outputs: list[Tensor]) -> Tensor:
  return outputs[0] if len(outputs) == 1 else outputs[0].cat(*outputs[1:], dim=-1)
