"""Gemma 3's KV cache and the position-dependent inputs of one forward call (what tgrad/models/gemma3.py attends with).

`Gemma3KVCache` holds each layer's post-RoPE keys and values ([2, B, kv_heads, slots, D]) on the device, the position
each slot holds on the host, and the symbolic Variables its kernels are compiled for: the prompt length of a prefill
and the decode position, so one compiled (and one captured) program serves every prompt length and every position.
`StepInputs` carries the device tensors a call's layers share; the cache writes and the decode attention's
softmax-times-values kernel are here too.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Optional
import numpy as np
from tgrad.tensor import Tensor
from tgrad.dtype import DType, dtypes
from tgrad.shape.sint import Variable

SLIDING, FULL = "sliding_attention", "full_attention"
LAYER_TYPES = (SLIDING, FULL)
EMPTY_SLOT = -1                                       # host position of a KV cache slot that holds nothing yet

# The modes of a forward call. FRESH (start_pos 0): the prompt's length is a bound Variable; it attends over its own
# keys (causal and sliding masks from aranges) and then writes them into the cache. DECODE (one token): writes its key
# and value into its slot (a region assign: one row), then attends over the filled slots only (a symbolic shrink of
# the cache: no mask). EXTEND (several tokens after a cache): attends over the whole cache + its own keys with masks
# from host positions and writes the cache after (a sliding ring may be overwritten); its shapes are concrete.
FRESH, DECODE, EXTEND = "fresh", "decode", "extend"

@dataclass(frozen=True)
class StepInputs:
  """Device tensors (and symbolic sizes) shared by every layer of one type in one forward call."""
  mode: str
  cos: Tensor                       # [T, D] rotary tables in the model dtype: cos of the angles, twice
  sin_signed: Tensor                # [T, D]: -sin of the angles for the first half, +sin for the second
  allowed: Optional[Tensor] = None  # [T, K] bool: which keys each query sees (FRESH, EXTEND)
  scatter: Optional[Tensor] = None  # [S, T] model dtype: 1 where new token t goes to cache slot s (EXTEND)
  written: Optional[Tensor] = None  # [S, 1] bool: the cache slots this call overwrites (EXTEND)
  slot: Any = None                  # DECODE: the slot the token's key goes to (a bound Variable)
  filled: Any = None                # DECODE: the slots holding a key after the write; FRESH: the prompt length
  ring: bool = False                # the layer type's cache is a ring shorter than the context (sliding layers)

class Gemma3KVCache:
  """Preallocated post-RoPE keys and values per layer ([2, B, kv_heads, slots, D]: keys, then values), plus, on the
  host, the absolute position each slot holds. Full-attention layers have `max_context` slots (slot = position).
  Sliding layers keep a ring of min(sliding_window, max_context) slots (slot = position mod ring), enough for the W
  keys a query sees: itself and the W-1 before it. Buffers are sized once; a decode step reads only the filled slots
  (`slots[:filled]`, symbolic), so stale slots of an earlier sequence are never read by FRESH or DECODE (EXTEND masks
  them by position), and `clear()` starts a new sequence in the same buffers (and the same captured programs)."""
  def __init__(self, config: Any, batch: int, max_context: int, dtype: DType, device: str):
    if max_context < 1: raise ValueError(f"max_context must be positive, got {max_context}")
    self.batch, self.max_context, self.dtype, self.device = batch, max_context, dtype, device
    self.slots = {SLIDING: min(config.sliding_window, max_context), FULL: max_context}
    self.layers: list[Tensor] = []
    for layer_type in config.layer_types:
      shape = (2, batch, config.num_key_value_heads, self.slots[layer_type], config.head_dim)
      self.layers.append(Tensor.zeros(shape, dtype=dtype, device=device).contiguous())
    Tensor.realize(*self.tensors())
    ring = self.slots[SLIDING]
    # the variables every kernel of this cache is compiled for (names are per role; bounds from this cache's sizes)
    self.prompt_length = Variable("prompt_len", 1, max_context)
    self.position = Variable("position", 0, max_context - 1)
    self.ring_slot, self.ring_filled = Variable("ring_slot", 0, ring - 1), Variable("ring_filled", 1, ring)
    self.clear()

  def clear(self) -> None:
    """Forget every position (the buffers keep their bytes: nothing reads a slot before it is written again)."""
    self.positions = {t: np.full(n, EMPTY_SLOT, dtype=np.int32) for t, n in self.slots.items()}
    self.next_position = 0

  def fits(self, batch: int, max_context: int, dtype: DType, device: str) -> bool:
    return (self.batch, self.max_context, self.dtype, self.device) == (batch, max_context, dtype, device)

  def tensors(self) -> list[Tensor]: return list(self.layers)

  def is_ring(self, layer_type: str) -> bool: return self.slots[layer_type] < self.max_context

  def decode_variables(self, position: int) -> tuple[Any, ...]:
    """The bound Variables of a decode step at `position`: (position, ring slot, filled ring slots)."""
    ring = self.slots[SLIDING]
    return (self.position.bind(position), self.ring_slot.bind(position % ring),
            self.ring_filled.bind(min(position + 1, ring)))

  def decode_slots(self, layer_type: str, variables: tuple[Any, ...]) -> tuple[Any, Any]:
    """(the slot a decode step writes, the slots filled after it) for a layer type, from `decode_variables`."""
    position, ring_slot, ring_filled = variables
    return (ring_slot, ring_filled) if self.is_ring(layer_type) else (position, position + 1)

  def destinations(self, layer_type: str, positions: np.ndarray) -> np.ndarray:
    """The slot each new position is written to; EMPTY_SLOT for one a later token of the same call overwrites."""
    slots = self.slots[layer_type]
    out = (positions % slots).astype(np.int32)
    out[positions < positions[-1] + 1 - slots] = EMPTY_SLOT
    return out

  def advance(self, positions: np.ndarray) -> None:
    for layer_type in self.slots:
      dest = self.destinations(layer_type, positions)
      kept = dest != EMPTY_SLOT
      self.positions[layer_type][dest[kept]] = positions[kept]
    self.next_position = int(positions[-1]) + 1

def write_cache_scatter(cache: Tensor, keys: Tensor, values: Tensor, step: StepInputs) -> None:
  """EXTEND: a layer's cache [2, B, kv_heads, S, D] gets the new keys and values [B, kv_heads, T, D] at the step's
  slots, in one kernel: a masked select over the whole cache."""
  assert step.scatter is not None and step.written is not None
  cache.assign(step.written.where(step.scatter @ keys.stack(values), cache))

def write_cache_fresh(cache: Tensor, keys: Tensor, values: Tensor, step: StepInputs) -> None:
  """FRESH: the prompt's keys and values [B, kv_heads, T, D] (T the prompt-length Variable) into an empty cache.
  Slot = position: a region assign of slots [0, T). A ring of R slots keeps the last R positions at slot position
  mod R: the keys padded by R in front and shrunk to [T, T + R) are positions T-R .. T-1 (padding zeros where
  negative: slots no position reached), and slot s holds the one at index (s - T) mod R of those, which is a
  rotation: (that window twice)[r : r + R] with r = (R - T mod R) mod R. One kernel of R rows, for every T."""
  new = keys.stack(values)                                      # [2, B, kv_heads, T, D]
  T, slots = step.filled, cache.shape[3]
  if not step.ring:
    cache.assign_region((None, None, None, (0, T), None), new)
    return
  window = new.pad((None, None, None, (slots, 0), None)).shrink((None, None, None, (T, T + slots), None))
  rotation = (slots - T % slots) % slots
  cache.assign(window.cat(window, dim=3).shrink((None, None, None, (rotation, rotation + slots), None)))

def write_cache_decode(cache: Tensor, keys: Tensor, values: Tensor, k_norm: Any, cos: Tensor, sin_signed: Tensor,
                       step: StepInputs) -> None:
  """DECODE: one token's keys [B, kv_heads, 1, D] (not yet normed and rotated) and values into its slot: a region
  assign of [slot, slot + 1), one kernel per layer whatever the cache's size or the position. The key's norm, its
  rotation and the write are that one kernel: both halves of the [2, ...] written value compute the key's normed
  rotation (k_norm.rotated_per_element: each element its own sum of squares, so no view follows the reduce) and the
  value half selects the values instead — a stack of the two would pad the reduce's result, which ends a kernel."""
  keys32 = keys.float()
  both = keys32.unsqueeze(0).expand(2, *keys32.shape)
  normed = k_norm.rotated_per_element(both, cos, sin_signed).cast(cache.dtype)
  is_key = Tensor.arange(2, device=keys.device).reshape(2, *([1] * keys.ndim)) == 0
  new = is_key.where(normed, values.unsqueeze(0).expand(2, *values.shape))
  cache.assign_region((None, None, None, (step.slot, step.slot + 1), None), new)

def filled_keys_values(cache: Tensor, step: StepInputs) -> tuple[Tensor, Tensor]:
  """DECODE: the keys and values [B, kv_heads, filled, D] of the filled slots (a symbolic shrink: every kernel that
  reads them loops over `filled`, not the cache's size)."""
  filled = cache.shrink((None, None, None, (0, step.filled), None))
  return filled[0], filled[1]

def slot_mask(step: StepInputs) -> Tensor:
  """DECODE: [filled] bool, true at the slot this step writes (its key and value are read from the step's own k and
  v there, not from the cache)."""
  return Tensor.arange(step.filled, dtype=dtypes.int32, device=step.cos.device) == step.slot

def decode_attention_values(scores: Tensor, values: Tensor, new_value: Optional[tuple[Tensor, Tensor]] = None
                            ) -> Tensor:
  """softmax(scores) @ values for one query token, as one row kernel: scores [B, kv_heads, group, 1, K] (realized),
  values [B, kv_heads, K, D] → [B, kv_heads, group, 1, D]. Each output element's row is its query's K scores beside
  one value column: the row's max, its sum of exponentials and the probability-weighted sum of the value column are
  three reduces over the same row (schedule rule 2b), so the scores are read from cache and each value once, in one
  launch. The max and the sum are recomputed for every d of a head: K·D extra exponentials, nothing next to one
  launch in decode. The probabilities are rounded to the model dtype before the product, as HF's softmax → matmul.
  `new_value`: (v [B, kv_heads, 1, D], slot mask [K] bool): the value at the masked slot is v, not `values`'."""
  B, kv_heads, group, _, K = scores.shape
  D = values.shape[-1]
  rows = (B, kv_heads, group, 1, D, K)
  s = scores.float().reshape(B, kv_heads, group, 1, 1, K).expand(rows)
  e = (s - s.max(-1, keepdim=True)).exp()
  probs = (e / e.sum(-1, keepdim=True)).cast(values.dtype)
  columns = values.transpose(-1, -2).reshape(B, kv_heads, 1, 1, D, K)
  if new_value is not None:
    v, is_new = new_value
    columns = is_new.reshape(1, 1, 1, 1, 1, K).where(v.cast(values.dtype).reshape(B, kv_heads, 1, 1, D, 1), columns)
  weighted = probs.float() * columns.float()
  return weighted.sum(-1).cast(values.dtype)
