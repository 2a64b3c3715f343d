"""Gemma 3 text models (google/gemma-3-270m and its family) on tgrad Tensors, matching Hugging Face transformers.

`Gemma3Config` (tgrad/models/gemma3_config.py) reads an HF config.json; `Gemma3` holds the weights under HF's names,
runs `(token ids [B, T], start_pos) -> logits [B, T, V]` against a preallocated `Gemma3KVCache`, and loads checkpoints
(`from_pretrained`) or makes seeded random weights (`random`; both in tgrad/models/gemma3_weights.py); `greedy_tokens`
runs greedy decode steps as replays of one captured step. All model math is Tensor ops; the host only prepares token
ids, positions and the bound Variables of a call (a prompt's length, a decode step's cache slots: one compiled and
captured program serves every length and position).
The KV cache and the cache writes are in tgrad/models/gemma3_cache.py; text generation (`generate`, sampling, the chat
template) in tgrad/models/generation.py; `Gemma3.shard(devices)` runs the same layers tensor-parallel over several
devices, with the weights placed as tgrad/models/gemma3_parallel.py says.
"""
from __future__ import annotations
import collections, math
from typing import Any, Iterator, Optional, Sequence, Union
import numpy as np
from tgrad.tensor import Tensor
from tgrad.dtype import dtypes, to_dtype
from tgrad.nn.quant import QuantizedTensor, dequantize_blocks, recomputes_rows, rms_normed_linear
from tgrad.jit import TinyJit
from tgrad.attention_kernel import CacheUpdate, HeadPrologue, flash_applies, flash_decoding
from tgrad.regions import DEFAULT, Lowering, composite, register
from tgrad.models.gemma3_config import PRESETS, Gemma3Config, weight_shapes  # noqa: F401 (PRESETS re-exported)
from tgrad.models.gemma3_cache import FULL  # noqa: F401 (re-exported: a layer type, beside SLIDING)
from tgrad.models.gemma3_cache import (SLIDING, LAYER_TYPES, FRESH, DECODE, EXTEND, StepInputs, Gemma3KVCache,
                                       write_cache_scatter, write_cache_fresh, write_cache_decode, filled_keys_values,
                                       slot_mask,
                                       decode_attention_values)
from tgrad.models.gemma3_weights import check_weights, checkpoint_weights, random_weights
from tgrad.models.gemma3_projections import (Weight, project, weight_values, split_inputs, input_axes,  # noqa: F401
                                             stacked_rows, concat_outputs)
from tgrad.models.gemma3_parallel import (RowPiece, row_pieces, take_rows, is_sharded,
                                          split_rows_like, shard_weights, head_weight, device_buffers)

MASKED_SCORE = float(np.finfo(np.float32).min)        # HF fills masked attention scores with finfo(float32).min
CONTEXT_GRANULE = 256            # generate() rounds the cache length up to this, so nearby lengths share kernels
DEFAULT_MAX_CONTEXT = 2048       # cache length when forward() is called without reset_cache()
# Gemma 3's residual stream outgrows float16 (max 65504): gemma-3-270m's reaches 1.04e5 by layer 15 on a six-token
# prompt and float16 turns it into inf. A float16 model therefore keeps the residual stream (the embedding, each layer's
# sums, the final norm's input) in float32; projections, attention and the cache stay float16 (as llama.cpp's GPU
# backends keep activations in F32 around F16 matmuls). bfloat16 has float32's range and keeps its stream.
RESIDUAL_DTYPES = {dtypes.float16: dtypes.float32}

# ---------------------------------------------------------------------------------------------------------------
# layers: weights are held under HF's attribute names, each a Tensor or (a GGUF model kept packed) a QuantizedTensor

class Linear:
  """y = x W^T with W stored as [out, in] (no bias anywhere in Gemma 3), dense or packed."""
  def __init__(self, weight: Weight): self.weight = weight
  def __call__(self, x: Tensor) -> Tensor: return project(x, self.weight)

class Gemma3RMSNorm:
  """Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w), all in float32, cast at the end to `out_dtype` (a norm
  that reads the residual stream hands its sub-block the compute dtype, RESIDUAL_DTYPES), else back to x's dtype."""
  def __init__(self, weight: Tensor, eps: float, out_dtype: Any = None):
    self.weight, self.eps = weight, eps
    self.out_dtype = to_dtype(out_dtype) if out_dtype is not None else None
  def output_dtype(self, x: Tensor) -> Any: return self.out_dtype or x.dtype
  def __call__(self, x: Tensor) -> Tensor:
    # the rms_norm composite (a region a path may lower), the same graph as x32 · inverse_rms(x32): one row kernel
    return (x.float().rms_norm(-1, self.eps) * self.scale()).cast(self.output_dtype(x))
  def inverse_rms(self, x32: Tensor, keepdim: bool = True, axes: Union[int, tuple[int, ...]] = -1) -> Tensor:
    """1 / sqrt(mean(x²) + eps) over `axes` (the last by default) of a float32 x."""
    return (x32.square().mean(axes, keepdim=keepdim) + self.eps).rsqrt()
  def inverse_rms_of_copies(self, x32: Tensor, rows: tuple, values: Optional[Tensor] = None) -> Tensor:
    """`inverse_rms` of x32's last axis once for every output of a kernel over `rows` (x32's rows broadcast to
    rows[:-1], the last axis summed): each output sums its own copy of its row, so the reduce runs over the same rows
    as the kernel's other reduces and no view follows it. The rows may end in several axes that split x32's last axis
    (a packed weight's input axes, weight_values), which are all summed: shape rows[:x32.ndim - 1]. `values`: the
    kernel's weight values, when it is split by rows over devices (the copies are split alike, gemma3_parallel.py)."""
    split = len(rows) - x32.ndim   # the axes x32's last axis is split into: 1 for a dense weight
    copies = x32.reshape(*x32.shape[:-1], 1, *rows[-split:]).expand(rows)
    if values is not None: copies = split_rows_like(copies, values, x32.ndim - 1)
    return self.inverse_rms(copies, False, tuple(range(-split, 0)))
  def scale(self) -> Tensor:
    """1 + w in float32: Gemma's norm scales by one plus its weight."""
    return self.weight.float() + 1.0
  def weighted(self, x32: Tensor) -> Tensor:
    """x · (1 + w), float32: the norm without its 1/rms."""
    return x32 * self.scale()
  def matvec(self, x: Union[Tensor, ResidualSum], weight: Weight) -> Tensor:
    """self(x) @ weight.T ([out, in] weight, dense or packed) as one kernel, for a one-token step: 1/rms is one
    number per row of x, so it multiplies the product of the weighted x (x · (1 + w), float32) with the weight after
    the sum, and its own sum of squares runs over the same [out, in] rows as the product's (recomputed for every
    output: in-many FMAs beside the weight's read), so both reduces share the matrix–vector kernel. A packed weight is
    dequantized in that kernel, both reduces over its input axes (weight_values). Rounded once, to the norm's output
    dtype. A ResidualSum not stored yet is summed inside the kernel too, over the same rows (ResidualSum.rows)."""
    if isinstance(x, ResidualSum):
      if x.stored is None: return self._matvec_of_rows(x.rows(weight), weight, x.dtype, x.vector())
      x = x.stored
    x32, values = x.float(), weight_values(weight)
    if isinstance(weight, QuantizedTensor):   # the same graph as a composite region (a path may take int8)
      return rms_normed_linear(x32, self.scale(), weight, self.eps).cast(self.output_dtype(x))
    axes = input_axes(values)
    rows = x.shape[:-1] + tuple(values.shape)
    product = (split_inputs(self.weighted(x32), values).unsqueeze(-1 - len(axes)) * values).sum(axes)
    return (product * self.inverse_rms_of_copies(x32, rows, values)).cast(self.output_dtype(x))

  def matvecs(self, x: ResidualSum, weights: Sequence[Weight]) -> list[Tensor]:
    """`matvec` of x with each weight, as products of one kernel (the scheduler's sibling reduces) when x is a
    ResidualSum not stored yet and the weights split their rows alike (the same shape and, packed, the same ggml type):
    their row copies of x are built once, so the kernel sums the residual and its squares once for all of them, not
    once a weight (a dense weight's 1/rms too; a packed weight's is its composite's own)."""
    shapes = {(tuple(weight_values(w).shape), getattr(w, "ggml_type", None)) for w in weights}
    if x.stored is not None or len(shapes) != 1: return [self.matvec(x, w) for w in weights]
    rows, vector = x.rows(weights[0]), x.vector()
    x32 = rows.float()
    inverse = None if isinstance(weights[0], QuantizedTensor) else \
      self.inverse_rms(x32, False, input_axes(weight_values(weights[0])))
    return [self._matvec_of_rows(rows, w, x.dtype, vector, x32, inverse) for w in weights]

  def _matvec_of_rows(self, rows: Tensor, weight: Weight, input_dtype: Any, vector: Optional[Tensor] = None,
                      x32: Optional[Tensor] = None, inverse: Optional[Tensor] = None) -> Tensor:
    """`matvec` of x given as its copies, one per output row ([..., out, *input axes], ResidualSum.rows), and as
    itself (`vector`, unrealized: a path that reads x once uses it); `x32` and `inverse` (a dense weight's 1/rms over
    the rows), where another product over the same rows made them already."""
    values = weight_values(weight)
    axes = input_axes(values)
    x32 = rows.float() if x32 is None else x32
    if isinstance(weight, QuantizedTensor):   # the same graph as a composite region (a path may take int8)
      return rms_normed_linear(x32, self.scale(), weight, self.eps, copies=True,
                               vector=None if vector is None else vector.float()).cast(self.out_dtype or input_dtype)
    product = (x32 * split_inputs(self.scale(), values) * values).sum(axes)
    inverse = self.inverse_rms(x32, False, axes) if inverse is None else inverse
    return (product * inverse).cast(self.out_dtype or input_dtype)

  def rotated_scores(self, q: Tensor, cos: Tensor, sin_signed: Tensor, keys: Tensor) -> Tensor:
    """rotated(q) @ keysᵀ for one query token as one kernel: q [B, kv_heads, group, 1, D] (unnormed), keys
    [B, kv_heads, K, D] (or already read over the rows, [B, kv_heads, group, 1, K, D]) → [B, kv_heads, group, 1, K] in
    q's dtype. As in `matvec`, 1/rms multiplies each score after the sum, and the sum of squares runs over the same
    [K, D] rows as the dot products."""
    q32 = q.float()
    rotated = _rotate(self.weighted(q32), cos.float(), sin_signed.float())
    rows = q.shape[:-1] + (keys.shape[-2], q.shape[-1])
    if keys.ndim == q.ndim - 1: keys = keys.unsqueeze(2).unsqueeze(3)
    product = (rotated.unsqueeze(-2) * keys.float()).sum(-1)
    return (product * self.inverse_rms_of_copies(q32, rows)).cast(q.dtype)

  def rotated_per_element(self, x32: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """The normed rotation of a float32 x (as `rotated`, in float32) with each element's 1/rms from its own copy of its
    row (`inverse_rms_of_copies` over [..., D, D]): no view follows the reduce, so what the result feeds stays in its
    kernel (a decode step's cache write: D² multiply-adds beside one launch, where the row's own reduce was a kernel of
    its own)."""
    rows = x32.shape + (x32.shape[-1],)
    return _rotate(self.weighted(x32), cos.float(), sin_signed.float()) * self.inverse_rms_of_copies(x32, rows)

  def rotated_copies(self, x32: Tensor, cos: Tensor, sin_signed: Tensor, rows: tuple) -> Tensor:
    """The normed rotation of a float32 x (as `rotated`, in float32) read over `rows` (x broadcast to them), its 1/rms
    a reduce over each row's own copy of x, read broadcast over the row: inside a row kernel over `rows` (schedule
    rule 2b) it is computed once per row, beside the kernel's other reduces over those rows."""
    inverse = self.inverse_rms(x32.expand(rows))
    return _rotate(self.weighted(x32), cos.float(), sin_signed.float()) * inverse

  def rotated(self, x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """RoPE of the normed x, as one row kernel: the norm's 1/rms is one number per row, so it multiplies the rotation
    of the weighted x (x · (1 + w), in float32) after it — the rotation reads x at two positions of the row, which
    would otherwise keep the norm's reduce in a kernel of its own. Rounded to x's dtype once, at the end."""
    x32 = x.float()
    return (_rotate(self.weighted(x32), cos.float(), sin_signed.float()) * self.inverse_rms(x32)).cast(x.dtype)

# The stored residual stream of a one-token step, as the composite `residual_row`: "default" is the first row of the
# per-row sums a fused matvec computes (a second output of that kernel, schedule rule 2c); "vector" computes it once
# on its own (a path whose matvec reads x once, rms_normed_linear's int8, has no per-row sums to store it from).
RESIDUAL_ROW = "residual_row"
def _first_row(first: Tensor, vector: Tensor, once: bool) -> Tensor:
  """The first row of the per-row sums; `once`: the stream computed once instead, for a packed matvec that normalizes
  it once (on a device without ROW_COPIES, nn/quant.py) and so computes no per-row sums to store it from."""
  return (vector if once else first).contiguous()

register(RESIDUAL_ROW, {
  DEFAULT: Lowering(DEFAULT, "the first row of the per-row residual sums (the sum computed once where the matvec "
                    "reads it once)", _first_row, 1),
  "vector": Lowering("vector", "the residual sum computed once", lambda first, vector, once: vector.contiguous(), 0)})

class ResidualSum:
  """The residual stream of a one-token step before it is stored: h + Σ norm(x) over `terms` (x, norm), each term
  normed and rounded to x's dtype, the sum in h's dtype (left to right, as the unfused layer adds them). The first
  norm.matvec that reads it sums it over its own [out, *input axes] rows (`rows`: every row recomputes the terms' sums
  of squares beside the product's), and a one-row stream is then stored from that kernel's first row (`stored`: a
  copy of one run of the rows, which the scheduler makes a second output of the kernel, schedule rule 2c): the layer's
  residual add and the next projection are one kernel. `value()` is the stored stream, computed alone when no matvec
  stored it."""
  def __init__(self, h: Tensor, terms: list[tuple[Tensor, Gemma3RMSNorm]], store: bool = True):
    self.h, self.terms, self.store = h, terms, store
    self.stored: Optional[Tensor] = None
  @property
  def shape(self) -> tuple: return self.h.shape
  @property
  def dtype(self) -> Any: return self.h.dtype
  def rows(self, weight: Weight) -> Tensor:
    """The sum as one copy per output row of `weight`: [*h's leading axes, out, *input axes] (weight_values). When it
    is stored, the copy in the first row becomes `stored`."""
    values = weight_values(weight)
    axes = input_axes(values)
    shape = self.h.shape[:-1] + tuple(values.shape)
    def spread(x: Tensor) -> Tensor:   # x's copies, split by rows over devices as the weight is (gemma3_parallel.py)
      return split_rows_like(split_inputs(x, values).unsqueeze(-1 - len(axes)).expand(shape), values, self.h.ndim - 1)
    total = spread(self.h)
    for x, norm in self.terms:
      o = spread(x.float())
      normed = o * norm.inverse_rms(o, True, axes) * split_inputs(norm.scale(), values)
      total = total + normed.cast(x.dtype).cast(self.h.dtype)
    one_row = all(size == 1 for size in self.h.shape[:-1])   # else the first row's copies are no run of the rows
    if self.store and one_row and self.stored is None:
      # split by rows: each device stores its own first row (every device sums the same stream: a replicated value)
      if is_sharded(total): first = take_rows(total, RowPiece(0, 1, split=False), self.h.ndim - 1)
      else: first = total.shrink(tuple((0, 1) if d == self.h.ndim - 1 else None for d in range(total.ndim)))
      once = isinstance(weight, QuantizedTensor) and not recomputes_rows(first)
      self.stored = composite(RESIDUAL_ROW, (first.reshape(self.h.shape), self.vector()), once=once)
    return total
  def vector(self) -> Tensor:
    """The stream [..., H] as one lazy value, rounded as `rows` rounds it (not stored)."""
    total = self.h
    for x, norm in self.terms:
      o = x.float()
      total = total + (o * norm.inverse_rms(o) * norm.scale()).cast(x.dtype).cast(self.h.dtype)
    return total
  def value(self) -> Tensor:
    """The stream [..., H], stored."""
    if self.stored is None: self.stored = _materialize(self.unstored())
    return self.stored
  def unstored(self) -> Tensor:
    """The stream [..., H] as a lazy value (the stored one if there is one): a row kernel that reduces over its rows
    (the final norm) computes it inside, beside the terms' own sums of squares (schedule rule 2b)."""
    if self.stored is not None: return self.stored
    total = self.h
    for x, norm in self.terms: total = total + norm(x)
    return total

class Gemma3Embedding:
  """Token lookup times sqrt(hidden), the scale rounded to the model dtype first (HF: 25.25 for H=640 in bf16).
  The lookup (Tensor indexing) is a data-dependent load: one kernel reads the token's rows of the table and scales
  them (the gather fuses with the multiply), never the whole vocabulary. A packed table gathers the tokens' rows of
  blocks and dequantizes only those (the gather, then the dequantization and the scale in the consumer's kernel)."""
  def __init__(self, weight: Weight, dtype: Any):
    self.weight, self.dtype = weight, to_dtype(dtype)
    self.residual_dtype = RESIDUAL_DTYPES.get(self.dtype, self.dtype)
    # a constant (folded when the graph is scheduled), so a one-token step's lookup reads only the table and the ids
    # and is recomputed inside every kernel that reads it (schedule rule 1) instead of getting a kernel of its own
    sqrt_hidden = Tensor.full((1,), math.sqrt(weight.shape[1]), dtype=dtypes.float32, device=weight.device)
    self.scale = sqrt_hidden.cast(self.dtype).cast(self.residual_dtype)
  def __call__(self, token_ids: Tensor) -> Tensor:
    """The scaled rows [*token_ids.shape, hidden], in the residual stream's dtype (RESIDUAL_DTYPES)."""
    return self.rows(token_ids).cast(self.residual_dtype) * self.scale
  def rows(self, token_ids: Tensor) -> Tensor:
    """The unscaled embedding rows [*token_ids.shape, hidden] in the model dtype."""
    if not isinstance(self.weight, QuantizedTensor): return self.weight[token_ids]
    blocks = self.weight.rows(token_ids)   # [*ids, blocks per row, block bytes]: the tokens' rows, still packed
    count = 1
    for size in blocks.shape[:-1]: count = count * size
    values = dequantize_blocks(blocks.reshape(count, blocks.shape[-1]), self.weight.ggml_type)
    return values.reshape(*token_ids.shape, self.weight.shape[1]).cast(self.dtype)

def _device_input(shape: tuple[int, ...], device: str) -> Tensor:
  """A realized int32 tensor whose buffer the host rewrites in place (an input of the jitted decode step)."""
  return Tensor.zeros(*shape, dtype=dtypes.int32, device=device).contiguous().realize()

def _materialize(x: Tensor) -> Tensor:
  """x computed into its own buffer by the step's schedule (not recomputed inside every kernel that reads it)."""
  return x.contiguous()

def _gelu_tanh(x: Tensor) -> Tensor:
  return x.float().gelu().cast(x.dtype)   # torch evaluates half-precision gelu in float32 and rounds once

def _softcap(x: Tensor, cap: Optional[float]) -> Tensor:
  return x if cap is None else ((x.float() / cap).tanh() * cap).cast(x.dtype)

def _rotate(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
  """RoPE, half-split layout (HF's rotate_half: dim j pairs with j + D/2, not interleaved pairs):
  x * cos + rotate_half(x) * sin = x * cos + [x2, x1] * [-sin, sin], with the sign folded into the table."""
  half = x.shape[-1] // 2
  return x * cos + x[..., half:].cat(x[..., :half], dim=-1) * sin_signed

def _normed_projection(norm: Gemma3RMSNorm, h: Tensor, weights: list[Weight]) -> list[Tensor]:
  """norm(h) @ W.T for each stacked weight buffer W (their outputs side by side make the projection's), realized: for
  a one-token step one kernel per buffer (Gemma3RMSNorm.matvec), else the norm realized once and then a matmul per
  buffer (which reads each normed element many times)."""
  if h.shape[-2] == 1: return [_materialize(norm.matvec(h, w)) for w in weights]
  normed = _materialize(norm(h))
  return [_materialize(project(normed, w)) for w in weights]

def _take_piece(parts: list[Tensor], piece: RowPiece) -> Tensor:
  """Columns `piece` of the parts' outputs side by side (a stacked projection whose packed buffers differ in type): a
  view of the one part that holds them, so no kernel concatenates the parts for readers of single pieces (q, k, v);
  a piece across parts, or sharded parts, reads their concatenation."""
  if not any(is_sharded(part) for part in parts):
    start = 0
    for part in parts:
      width = part.shape[-1]
      if start <= piece.start and piece.end <= start + width:
        return take_rows(part, RowPiece(piece.start - start, piece.end - start, piece.split), -1)
      start += width
  return take_rows(concat_outputs(parts), piece, -1)

def _fuse_into_consumer(x: Tensor) -> Tensor:
  """A one-token step (decode) leaves an elementwise producer (the embedding row) unrealized on a device whose threads
  recompute a row's inputs beside the weight's stream (one offering nn/quant.py's ROW_COPIES: a GPU), so it is
  computed inside the matrix-vector kernel that reads it: one kernel and one launch fewer, and the vector is tiny. A
  CPU core would evaluate the producer again for each of the kernel's rows (GELU's tanh 640 times over when
  GELU(gate)·up was one: the packed gemma-3-270m decode step took 15.5-15.8 ms with it against 13.7-14.0 realized
  once, 2 Zen 4 cores), and a longer step reads each input element many times: both realize it once."""
  return x if x.shape[-2] == 1 and recomputes_rows(x) else _materialize(x)

class Gemma3Attention:
  def __init__(self, config: Gemma3Config, weights: dict[str, Weight], prefix: str, layer_type: str = FULL):
    names = [prefix + name + "_proj.weight" for name in ("q", "k", "v")]
    self.qkv_pieces = row_pieces([weights[name] for name in names])   # where q, k and v sit in the stacked output
    self.qkv_weights, (q_weight, k_weight, v_weight) = stacked_rows(*(weights[name] for name in names))
    self.q_proj, self.k_proj, self.v_proj = Linear(q_weight), Linear(k_weight), Linear(v_weight)
    self.o_proj = Linear(weights[prefix + "o_proj.weight"])
    self.q_norm = Gemma3RMSNorm(weights[prefix + "q_norm.weight"], config.rms_norm_eps)
    self.k_norm = Gemma3RMSNorm(weights[prefix + "k_norm.weight"], config.rms_norm_eps)
    self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    self.scale = config.query_pre_attn_scalar ** -0.5
    self.softcap = config.attn_logit_softcapping
    self.window = config.sliding_window if layer_type == SLIDING else None   # keys l - window < s <= l

  def __call__(self, h: Tensor, norm: Gemma3RMSNorm, step: StepInputs, cache: Tensor
               ) -> tuple[Tensor, Optional[tuple]]:
    """The attention output [B, T, H] of norm(h), and for EXTEND the (keys, values) to write once the step has run.
    `cache` is the layer's keys and values, stacked: [2, B, kv_heads, slots, D]."""
    B, T, _ = h.shape
    D, group = self.head_dim, self.heads // self.kv_heads
    cos, sin = step.cos.reshape(1, T, 1, D), step.sin_signed.reshape(1, T, 1, D)
    qkv = _normed_projection(norm, h, self.qkv_weights)   # q, k and v in one kernel (dense): [B, T, (heads + 2 kv) D]
    q_piece, k_piece, v_piece = self.qkv_pieces   # sharded: q split by heads, k and v replicated (gemma3_parallel.py)
    q = _take_piece(qkv, q_piece).reshape(B, T, self.heads, D)
    k = _take_piece(qkv, k_piece).reshape(B, T, self.kv_heads, D)
    v = _take_piece(qkv, v_piece).reshape(B, T, self.kv_heads, D)
    # several tokens: q and k normed and rotated in one kernel each, realized once in [B, T, heads, D] (every score
    # reads each element many times); one token: q's norm and RoPE are computed inside the scores kernel
    # (Gemma3RMSNorm.rotated_scores), k's inside the cache write (write_cache_decode)
    one_token = T == 1   # a concrete 1: a decode step (a prefill's length is symbolic, even when it is 1)
    if not one_token:
      q, k = _materialize(self.q_norm.rotated(q, cos, sin)), _materialize(self.k_norm.rotated(k, cos, sin))
    k, v = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)          # [B, kv_heads, T, D]
    pending = None
    new_slot = None
    if step.mode == DECODE:
      # the filled slots as they are before this step's write (its values are built before the write: they keep the
      # old data), the new slot's key and value computed from k and v inside the kernels that read them (`new_slot`):
      # no kernel waits for the write, which runs after its readers and can share a later kernel (schedule rule 5)
      keys, values = filled_keys_values(cache, step)
      new_slot = slot_mask(step)
    elif step.mode == FRESH: keys, values = k, v
    else:
      keys, values = cache[0].cat(k, dim=2), cache[1].cat(v, dim=2)
      pending = (k, v)
    if step.mode == FRESH and self._flash(q, keys, values):
      # a prompt: one flash-attention kernel per kv head's query group (tgrad/attention_kernel.py): the scores, their
      # softmax and the weighted sum of values without storing the score matrix
      out = q.permute(0, 2, 1, 3).scaled_dot_product_attention(keys, values, is_causal=True, scale=self.scale,
                                                               enable_gqa=True, window=self.window)
      out = out.permute(0, 2, 1, 3).reshape(B, T, self.heads * D)
      write_cache_fresh(cache, k, v, step)
      return self.o_proj(out), pending
    if step.mode == DECODE and (out := self._flash_decode(q, k, v, keys, values, cache, step, cos, sin)) is not None:
      return self.o_proj(out.permute(0, 2, 1, 3).reshape(B, T, self.heads * D)), pending
    q = q.reshape(B, T, self.kv_heads, group, D).permute(0, 2, 3, 1, 4)           # [B, kv_heads, group, T, D]
    if one_token:
      rows = (B, self.kv_heads, group, 1, keys.shape[-2], D)
      keys = keys.unsqueeze(2).unsqueeze(3).expand(rows)
      if new_slot is not None:   # the new key, normed and rotated as the cache write stores it, at its slot
        new_key = self.k_norm.rotated_copies(k.float().reshape(B, self.kv_heads, 1, 1, 1, D),
                                             cos.reshape(1, 1, 1, 1, D), sin.reshape(1, 1, 1, 1, D), rows)
        keys = new_slot.reshape(1, 1, 1, 1, -1, 1).where(new_key.cast(keys.dtype), keys)
      scores = self.q_norm.rotated_scores(q, cos.reshape(1, 1, 1, 1, D), sin.reshape(1, 1, 1, 1, D), keys)
    else: scores = (q @ keys.unsqueeze(2).transpose(-1, -2))                      # [B, kv_heads, group, T, K]
    scores = _softcap(scores * self.scale, self.softcap)
    if step.allowed is not None: scores = step.allowed.where(scores, MASKED_SCORE)
    if one_token:
      out = decode_attention_values(_materialize(scores), values, None if new_slot is None else (v, new_slot))
    else: out = scores.float().softmax(-1).cast(values.dtype) @ values.unsqueeze(2)   # [B, kv_heads, group, T, D]
    out = out.permute(0, 3, 1, 2, 4).reshape(B, T, self.heads * D)
    if step.mode == FRESH: write_cache_fresh(cache, k, v, step)
    if step.mode == DECODE:
      write_cache_decode(cache, k, v, self.k_norm, cos.reshape(1, 1, 1, D), sin.reshape(1, 1, 1, D), step)
    return self.o_proj(out), pending

  def _flash(self, q: Tensor, keys: Tensor, values: Tensor) -> bool:
    """Whether the prompt's attention is one flash kernel: FLASH_ATTENTION, a device and dtypes it runs on, no
    softcapping (Gemma 3 has none; Gemma 2 had). q [B, T, heads, D], keys and values [B, kv_heads, T, D]."""
    if self.softcap is not None or not isinstance(q.device, str): return False   # (sharded: a tuple of devices)
    return flash_applies(q.lazydata.permute((0, 2, 1, 3)), keys.lazydata, values.lazydata, is_causal=True,
                         window=self.window)

  def _flash_decode(self, q: Tensor, k: Tensor, v: Tensor, keys: Tensor, values: Tensor, cache: Tensor,
                    step: StepInputs, cos: Tensor, sin: Tensor) -> Optional[Tensor]:
    """A decode step's attention as one flash-decoding kernel (tgrad/attention_kernel.py), [B, heads, 1, D]: q's and
    the new key's norm and RoPE, the new key and value written into the cache at the step's slot (the cache tensor
    becomes that write), the scores, their softmax and the weighted values over the filled slots, the keys split over
    blocks. None where it does not apply (no CUDA, float32, a sharded model): the row kernels below then compute it.
    q [B, 1, heads, D] and k, v [B, kv_heads, 1, D] as the qkv projection gives them (not normed or rotated)."""
    if not isinstance(q.device, str) or self.q_norm.eps != self.k_norm.eps: return None
    D = self.head_dim
    prologue = HeadPrologue(self.q_norm.weight.lazydata, self.k_norm.weight.lazydata, self.q_norm.eps, 1.0,
                            cos.reshape(D).lazydata, sin.reshape(D).lazydata)
    decoded = flash_decoding(q.permute(0, 2, 1, 3).lazydata, keys.lazydata, values.lazydata, scale=self.scale,
                             softcap=self.softcap, update=CacheUpdate(k.lazydata, v.lazydata, step.slot),
                             prologue=prologue)
    if decoded is None: return None
    out, written = decoded
    assert len(written) == 1, "keys and values are views of one cache buffer"
    cache.written_by_kernel(written[0])
    return Tensor(out, requires_grad=False)

class Gemma3MLP:
  """down(gelu(gate(x)) * up(x)). Over many tokens the gate and up projections are one matmul over their stacked rows;
  for one token (`after_residual`) they are two matrix–vector products of the same kernel, whose output is GELU(gate)·up
  (the scheduler's sibling reduces), so the down projection reads that vector instead of recomputing it in every row."""
  def __init__(self, weights: dict[str, Weight], prefix: str):
    self.gate_up_pieces = row_pieces([weights[prefix + "gate_proj.weight"], weights[prefix + "up_proj.weight"]])
    self.gate_up_weights, (gate_weight, up_weight) = stacked_rows(weights[prefix + "gate_proj.weight"],
                                                                   weights[prefix + "up_proj.weight"])
    self.gate_proj, self.up_proj = Linear(gate_weight), Linear(up_weight)
    self.down_proj = Linear(weights[prefix + "down_proj.weight"])
  def __call__(self, h: Tensor, norm: Gemma3RMSNorm) -> Tensor:
    """mlp(norm(h))."""
    return self._down(_normed_projection(norm, h, self.gate_up_weights))

  def after_residual(self, h: Tensor, attended: Tensor, post_norm: Gemma3RMSNorm, pre_norm: Gemma3RMSNorm) -> Tensor:
    """mlp(pre_norm(h + post_norm(attended))) for one token, its gate/up projection one row kernel: every [gate/up
    row, hidden] row of the matvec recomputes post_norm's sum of squares of `attended`, the residual sum, pre_norm's
    sum of squares of that, and the weighted product (three reduces over the same rows), so the residual sum is never
    stored (ResidualSum without store). Rounded as the unfused layer: the post-norm in attended's dtype, the residual
    sum in h's. A packed weight is dequantized in the kernel, which then keeps every row split into the weight's input
    axes (weight_values). Gate and up are two products over their own rows (views of the stacked buffer) in that one
    kernel, which stores GELU(gate)·up: on a GPU the down projection recomputed it from the stored [gate, up] in every
    row block instead (a plain float16 down matvec 1.83 µs a launch in a PDL chain against 4.33 µs; the decode step
    on an H200, zero-data Q4_K_M file: float16 0.526 → 0.512 ms at position 40, packed 0.613 → 0.587 ms)."""
    residual = ResidualSum(h, [(attended, post_norm)], store=False)
    gate, up = pre_norm.matvecs(residual, (self.gate_proj.weight, self.up_proj.weight))
    return self.down_proj(_materialize(_gelu_tanh(gate) * up))

  def _down(self, gate_up: list[Tensor]) -> Tensor:
    """down(gelu(gate) · up) from the gate/up projection's parts (one per stacked buffer)."""
    gate, up = (_take_piece(gate_up, piece) for piece in self.gate_up_pieces)
    return self.down_proj(_fuse_into_consumer(_gelu_tanh(gate) * up))

class Gemma3DecoderLayer:
  """h + norm(attn(norm(h))), then h + norm(mlp(norm(h))): the post-norms act on each block's output."""
  def __init__(self, config: Gemma3Config, weights: dict[str, Weight], index: int, dtype: Any):
    p, eps = f"model.layers.{index}.", config.rms_norm_eps
    self.layer_type = config.layer_types[index]
    self.input_layernorm = Gemma3RMSNorm(weights[p + "input_layernorm.weight"], eps, dtype)
    self.self_attn = Gemma3Attention(config, weights, p + "self_attn.", self.layer_type)
    self.post_attention_layernorm = Gemma3RMSNorm(weights[p + "post_attention_layernorm.weight"], eps)
    self.pre_feedforward_layernorm = Gemma3RMSNorm(weights[p + "pre_feedforward_layernorm.weight"], eps, dtype)
    self.mlp = Gemma3MLP(weights, p + "mlp.")
    self.post_feedforward_layernorm = Gemma3RMSNorm(weights[p + "post_feedforward_layernorm.weight"], eps)
  def __call__(self, h: Union[Tensor, ResidualSum], step: StepInputs, cache: Tensor
               ) -> tuple[Union[Tensor, ResidualSum], Optional[tuple]]:
    """The layer's output and the attention's pending cache write. One token: the output is a ResidualSum (h plus
    both post-normed blocks), summed and stored by the next layer's qkv kernel; the attention block's output
    h + norm(attended) is never stored: the MLP's first kernel recomputes it over its own rows
    (Gemma3MLP.after_residual). Otherwise each residual sum is its own row kernel, realized."""
    attended, pending = self.self_attn(h, self.input_layernorm, step, cache)
    if isinstance(h, ResidualSum): h = h.value()   # stored by the qkv kernel
    if h.shape[-2] == 1:
      attended = _materialize(attended)
      mlp_out = self.mlp.after_residual(h, attended, self.post_attention_layernorm, self.pre_feedforward_layernorm)
      return ResidualSum(h, [(attended, self.post_attention_layernorm), (mlp_out, self.post_feedforward_layernorm)]), \
        pending
    h = _materialize(h + self.post_attention_layernorm(attended))
    mlp_out = self.mlp(h, self.pre_feedforward_layernorm)
    return _materialize(h + self.post_feedforward_layernorm(mlp_out)), pending

class Gemma3TextModel:
  """The decoder stack, named like HF's `Gemma3TextModel` so state-dict names match the checkpoint."""
  def __init__(self, config: Gemma3Config, weights: dict[str, Weight], dtype: Any):
    self.embed_tokens = Gemma3Embedding(weights["model.embed_tokens.weight"], dtype)
    self.layers = [Gemma3DecoderLayer(config, weights, i, dtype) for i in range(config.num_hidden_layers)]
    self.norm = Gemma3RMSNorm(weights["model.norm.weight"], config.rms_norm_eps, dtype)

# ---------------------------------------------------------------------------------------------------------------
# the causal LM

class Gemma3:
  """Gemma3ForCausalLM: `model(token_ids [B, T] int, start_pos) -> logits [B, T, V]` in the model dtype.

  Each call is one step of a sequence: it attends over the cache (positions < start_pos) plus its own tokens, then
  writes its keys and values into the cache. start_pos must be 0 (a new sequence) or the next position.
  Weights are Tensors, or QuantizedTensors for projections and the embedding kept packed (tgrad/models/gemma3_gguf.py);
  `dtype` is the compute dtype (activations, cache, logits): by default the embedding's, float32 for a packed one."""
  def __init__(self, config: Gemma3Config, weights: dict[str, Weight], dtype: Any = None):
    check_weights(config, weights, "Gemma3")
    self.config = config
    embedding = weights["model.embed_tokens.weight"]
    if dtype is not None: self.dtype = to_dtype(dtype)
    else: self.dtype = embedding.dtype if isinstance(embedding, Tensor) else dtypes.float32
    self.device = embedding.device
    self.model = Gemma3TextModel(config, weights, self.dtype)
    self.lm_head = Linear(weights["lm_head.weight"]) if not config.tie_word_embeddings else None
    # the head's weight as the logits read it: over several devices a tied embedding is seen split by vocabulary rows
    head = self.lm_head.weight if self.lm_head is not None else self.model.embed_tokens.weight
    self.head_weight = head_weight(head)
    self.cache: Optional[Gemma3KVCache] = None
    self._decode_jit: Optional[TinyJit] = None         # the captured decode step, for the cache it was captured on
    self._decode_jit_cache: Optional[Gemma3KVCache] = None
    # the jitted step's token ids, rewritten in place (state: the step writes its argmax there); its position comes
    # as bound Variables
    self._decode_tokens: Optional[Tensor] = None
    # the captured prefill (the prompt length a Variable), for the cache it was captured on, and its padded ids input
    self._prefill_jit: Optional[TinyJit] = None
    self._prefill_jit_cache: Optional[Gemma3KVCache] = None
    self._prefill_tokens: Optional[Tensor] = None
    self._bank: Optional[tuple[Gemma3KVCache, Tensor]] = None   # (the cache, its rotary bank): _rotary_bank
    self.inv_freq = {t: self._inverse_frequencies(t) for t in LAYER_TYPES}

  def _inverse_frequencies(self, layer_type: str) -> Tensor:
    """inv_freq[i] = 1 / theta^(2i/D) / linear factor, in float32 as HF computes it."""
    D = self.config.head_dim
    exponents = Tensor.arange(0, D, 2, dtype=dtypes.float32, device=self.device) / D
    theta = Tensor.full((D // 2,), self.config.rope_theta[layer_type], dtype=dtypes.float32, device=self.device)
    return ((theta ** exponents).reciprocal() / self.config.rope_factor[layer_type]).realize()

  def state_dict(self) -> dict[str, Weight]:
    """The weights under their checkpoint names (packed ones as QuantizedTensors)."""
    out = {"model.embed_tokens.weight": self.model.embed_tokens.weight}
    for i, layer in enumerate(self.model.layers):
      p, attn, mlp = f"model.layers.{i}.", layer.self_attn, layer.mlp
      out.update({p + "input_layernorm.weight": layer.input_layernorm.weight,
                  p + "self_attn.q_proj.weight": attn.q_proj.weight, p + "self_attn.k_proj.weight": attn.k_proj.weight,
                  p + "self_attn.v_proj.weight": attn.v_proj.weight, p + "self_attn.o_proj.weight": attn.o_proj.weight,
                  p + "self_attn.q_norm.weight": attn.q_norm.weight, p + "self_attn.k_norm.weight": attn.k_norm.weight,
                  p + "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
                  p + "pre_feedforward_layernorm.weight": layer.pre_feedforward_layernorm.weight,
                  p + "mlp.gate_proj.weight": mlp.gate_proj.weight, p + "mlp.up_proj.weight": mlp.up_proj.weight,
                  p + "mlp.down_proj.weight": mlp.down_proj.weight,
                  p + "post_feedforward_layernorm.weight": layer.post_feedforward_layernorm.weight})
    out["model.norm.weight"] = self.model.norm.weight
    if self.lm_head is not None: out["lm_head.weight"] = self.lm_head.weight
    return out

  # ---- construction
  def shard(self, devices: Sequence[str]) -> Gemma3:
    """This model tensor-parallel over `devices` (Megatron style, tgrad/models/gemma3_parallel.py: q heads, the MLP's
    intermediate axis and the head's vocabulary split, k/v, norms, embedding and KV cache replicated; two all-reduces
    per layer): a new model holding sharded copies of the weights (this one may be dropped). Its calls take and return
    the same values; logits come back split by vocabulary (`.numpy()` gathers them). ValueError for sizes that don't
    divide over the devices. Packed (quantized) weights stay packed: split by rows where the layout splits rows,
    whole on every device where it splits the input (o_proj, down_proj)."""
    return Gemma3(self.config, shard_weights(self.config, self.state_dict(), devices), self.dtype)

  @staticmethod
  def from_pretrained(directory: str, dtype: Any = dtypes.float32, device: Optional[str] = None,
                      progress: bool = True) -> Gemma3:
    """Load an HF checkpoint directory (config.json + model.safetensors, or a sharded index whose shards must lie in
    the directory): every tensor is read into host memory, moved to the device once and cast to `dtype` there
    (gemma3_weights.py)."""
    return Gemma3(*checkpoint_weights(directory, dtype, device, progress))

  @staticmethod
  def random(config: Gemma3Config, dtype: Any = dtypes.float32, device: Optional[str] = None, seed: int = 0,
             progress: bool = True) -> Gemma3:
    """Seeded random weights drawn on the device with the reference harness's standard deviations
    (gemma3_weights.py)."""
    return Gemma3(config, random_weights(config, dtype, device, seed, progress))

  # ---- running
  def reset_cache(self, batch: int = 1, max_context: Optional[int] = None) -> Gemma3KVCache:
    """An empty cache for `batch` sequences of up to `max_context` positions: the current one cleared when it has
    these sizes (its buffers, and the prefill and decode programs captured on them, serve the new sequence), else a
    new one."""
    max_context = max_context or min(DEFAULT_MAX_CONTEXT, self.config.max_position_embeddings)
    if max_context > self.config.max_position_embeddings:
      raise ValueError(f"max_context {max_context} exceeds max_position_embeddings "
                       f"{self.config.max_position_embeddings}")
    if self.cache is not None and self.cache.fits(batch, max_context, self.dtype, self.device): self.cache.clear()
    else: self.cache = Gemma3KVCache(self.config, batch, max_context, self.dtype, self.device)
    self._rotary_bank(self.cache)
    return self.cache

  def _step_data(self, positions: np.ndarray, cache: Gemma3KVCache) -> tuple[str, Optional[np.ndarray]]:
    """The host side of one forward call: its mode (see gemma3_cache.py), and the int32 array that carries its
    position-dependent values to the device. FRESH and DECODE: none (their positions, slots and key counts are bound
    Variables: a prompt's length, a step's position). EXTEND: the query positions, then for each layer type (sorted)
    the cache slot each new token goes to and the position of every key attended over."""
    T = len(positions)
    mode = FRESH if cache.next_position == 0 else DECODE if T == 1 else EXTEND
    if mode != EXTEND: return mode, None
    parts = [positions]
    for layer_type in sorted(set(self.config.layer_types)):
      key_positions = np.concatenate([cache.positions[layer_type], positions])
      parts += [cache.destinations(layer_type, positions), key_positions]
    return mode, np.concatenate(parts).astype(np.int32)

  def _rotary_values(self, layer_types: Sequence[str], query_pos: Tensor) -> Tensor:
    """cos and signed sin of the query positions' angles, in the model dtype: [2, types, T, D], one kernel's buffer."""
    T, half = query_pos.shape[0], self.config.head_dim // 2
    inv_freq = Tensor.stack(*[self.inv_freq[t] for t in layer_types])                    # [types, half]
    angles = query_pos.float().reshape(1, T, 1) * inv_freq.reshape(len(layer_types), 1, half)   # float32, as HF
    angles = angles.double()   # cos/sin of the float32 angle, with float64 range reduction (positions up to 1e5+)
    cos, sin = angles.cos().float().cast(self.dtype), angles.sin().float().cast(self.dtype)
    return _materialize(cos.cat(cos, dim=-1).stack((-sin).cat(sin, dim=-1)))

  def _rotary_tables(self, layer_types: Sequence[str], query_pos: Tensor) -> dict[str, tuple[Tensor, Tensor]]:
    """cos and signed sin [T, D] of the query positions' angles for each layer type: views of `_rotary_values`."""
    tables = self._rotary_values(layer_types, query_pos)
    return {t: (tables[0, i], tables[1, i]) for i, t in enumerate(layer_types)}

  def _bank_tables(self, cache: Gemma3KVCache, first: Any, count: Any) -> dict[str, tuple[Tensor, Tensor]]:
    """The tables of positions first .. first + count - 1 (ints or bound Variables) for each layer type: views of the
    cache's rotary bank (`_rotary_bank`), so a step whose positions are its variables computes no table."""
    rows = self._rotary_bank(cache).shrink((None, None, (first, first + count), None))
    return {t: (rows[0, i], rows[1, i]) for i, t in enumerate(sorted(set(self.config.layer_types)))}

  def _rotary_bank(self, cache: Gemma3KVCache) -> Tensor:
    """The tables of every position the cache holds ([2, types, max_context, D], the layer types sorted), realized once
    per cache (at reset_cache, before any capture): the values `_rotary_values` gives those positions, bit for bit. A
    decode step reads its position's rows in place instead of a kernel computing them (one launch fewer a step); it
    holds 4·max_context·D values (8 MB at 4,096 positions in float16)."""
    if self._bank is None or self._bank[0] is not cache:
      positions = Tensor.arange(cache.max_context, dtype=dtypes.int32, device=self.device)
      self._bank = (cache, self._rotary_values(sorted(set(self.config.layer_types)), positions).realize())
    return self._bank[1]

  def _step_inputs(self, mode: str, step_data: Optional[Tensor], T: Any, variables: Any,
                   cache: Gemma3KVCache) -> dict[str, StepInputs]:
    """The device tensors of each layer type for a call (T: its token count; variables: the prompt length's bound
    Variable for FRESH, cache.decode_variables for DECODE)."""
    types, window, out = sorted(set(self.config.layer_types)), self.config.sliding_window, {}
    if mode == FRESH:
      query_pos = Tensor.arange(T, dtype=dtypes.int32, device=self.device)
      distance = query_pos.reshape(T, 1) - query_pos.reshape(1, T)
      rotary = self._bank_tables(cache, 0, T)
      for layer_type in types:
        allowed = (distance >= 0) & (distance < window) if layer_type == SLIDING else distance >= 0
        out[layer_type] = StepInputs(FRESH, *rotary[layer_type], allowed=allowed,
                                     filled=T, ring=cache.is_ring(layer_type))
      return out
    if mode == DECODE: rotary = self._bank_tables(cache, variables[0], 1)   # the bound `position` Variable
    else:
      assert step_data is not None
      query_pos = step_data[:T]
      rotary = self._rotary_tables(types, query_pos)
    offset = T
    for layer_type in types:
      tables = rotary[layer_type]
      if mode == DECODE:
        slot, filled = cache.decode_slots(layer_type, variables)
        out[layer_type] = StepInputs(DECODE, *tables, slot=slot, filled=filled, ring=cache.is_ring(layer_type))
        continue
      slots = cache.slots[layer_type]
      destination, key_pos = step_data[offset:offset + T], step_data[offset + T:offset + 2 * T + slots]
      offset += 2 * T + slots
      distance = query_pos.reshape(T, 1) - key_pos.reshape(1, -1)
      allowed = (key_pos.reshape(1, -1) >= 0) & (distance >= 0)
      if layer_type == SLIDING: allowed = allowed & (distance < window)
      hits = Tensor.arange(slots, device=self.device).reshape(slots, 1) == destination.reshape(1, T)
      out[layer_type] = StepInputs(EXTEND, *tables, allowed=_materialize(allowed), scatter=hits.cast(self.dtype),
                                   written=_materialize(hits.any(1, keepdim=True)), ring=cache.is_ring(layer_type))
    return out

  def forward(self, token_ids: Tensor, start_pos: int = 0, last_only: bool = False, return_hidden: bool = False,
              jit: bool = False) -> Any:
    """Logits [B, T, V] (or [B, 1, V] with last_only), realized; with return_hidden also the list of hidden states
    [B, T, H]: the scaled embedding, each layer's output, and the final norm's output (HF's hooks).
    A prompt (start_pos 0) runs with its length as a bound Variable (`cache.prompt_length`): its outputs' T is
    symbolic (`.numpy()` gives the values), and every length up to the cache's runs the same kernels. A one-token
    step reads only the cache's filled slots (symbolic too).
    With `jit` and last_only (no hidden states), a prompt replays a TinyJit capture of the prefill and a one-token
    step one of the decode step (the same kernels as without; one capture serves every length and position): the
    returned logits are then the JIT's buffer, rewritten by its next call (read or copy them first)."""
    if token_ids.ndim != 2 or not token_ids.dtype.is_int:
      raise ValueError(f"token_ids must be a 2-D int tensor [batch, tokens], got {token_ids.shape} {token_ids.dtype}")
    B, T = token_ids.shape
    if T == 0: raise ValueError("token_ids has no tokens")
    if start_pos == 0 and (self.cache is None or self.cache.batch != B or self.cache.max_context < T
                           or self.cache.next_position != 0):
      size = self.cache.max_context if self.cache is not None and self.cache.batch == B else DEFAULT_MAX_CONTEXT
      self.reset_cache(B, max(T, min(size, self.config.max_position_embeddings)))
    cache = self.cache
    assert cache is not None
    if start_pos != cache.next_position:
      raise ValueError(f"start_pos {start_pos} must be 0 or the cache's next position {cache.next_position}")
    if cache.batch != B: raise ValueError(f"batch {B} differs from the cache's batch {cache.batch}")
    if start_pos + T > cache.max_context:
      raise ValueError(f"positions {start_pos}..{start_pos + T - 1} do not fit a cache of {cache.max_context}")
    positions = np.arange(start_pos, start_pos + T, dtype=np.int32)
    mode, step_data = self._step_data(positions, cache)
    compiled = jit and last_only and not return_hidden
    if mode == FRESH:   # the prompt padded to the cache's length on the host, shrunk to its length on the device
      ids = np.zeros((B, cache.max_context), dtype=np.int32)
      ids[:, :T] = token_ids.numpy()
      length = cache.prompt_length.bind(T)
      if compiled: out = self._replay_prefill(ids, length)
      else: out = self._run_step(Tensor(ids, device=self.device).shrink((None, (0, length))), None, FRESH, last_only,
                                 return_hidden, length)
    else:
      token_ids = token_ids.to(self.device).int()
      data = Tensor(step_data, device=self.device) if step_data is not None else None
      variables = cache.decode_variables(start_pos) if mode == DECODE else None
      if compiled and mode == DECODE: out = self._replay_decode(token_ids, variables)
      else: out = self._run_step(token_ids, data, mode, last_only, return_hidden, variables)
    cache.advance(positions)
    return out
  __call__ = forward

  def decode_greedy(self, tokens: Sequence[int]) -> list[int]:
    """One jitted greedy decode step at the cache's next position: the next token of each sequence (the argmax of
    its logits: the first on ties, NaN counting as the largest, as numpy's argmax). See greedy_tokens."""
    return next(self.greedy_tokens(tokens, 1))

  def greedy_tokens(self, tokens: Sequence[int], count: int) -> Iterator[list[int]]:
    """The next `count` greedy tokens of each sequence (one list per step), continuing from `tokens` (one per
    sequence) at the cache's next position, each step a replay of the captured decode step.
    The argmax runs on the device inside the step and is written into the next step's token input there, so the
    host never waits for a step before queueing the next: it keeps one step queued ahead of the one whose tokens it
    reads (4 bytes per sequence, copied out in stream order), and its own work (the replay call with the step's
    position Variables) overlaps the GPU's. A consumer that stops early (at an EOS id) leaves that one
    queued step run: its token is dropped, and the cache holds keys and values up to the last yielded token's input,
    one position past what the unpipelined loop writes. Arguments are checked here, before anything runs."""
    cache = self.cache
    if cache is None or cache.next_position == 0:
      raise ValueError("greedy decoding continues a sequence: run its prompt through the model first")
    ids = np.asarray(tokens)
    if ids.ndim != 1 or ids.shape[0] != cache.batch or (ids.size and ids.dtype.kind not in "iu"):
      raise ValueError(f"greedy decoding takes one int token per sequence ({cache.batch}), got {ids.shape} {ids.dtype}")
    if ((ids < 0) | (ids >= self.config.vocab_size)).any():
      raise ValueError(f"token ids outside the vocabulary [0, {self.config.vocab_size}): {ids.tolist()}")
    if count < 0: raise ValueError(f"count must be >= 0, got {count}")
    if cache.next_position + count > cache.max_context:
      raise ValueError(f"{count} steps from position {cache.next_position} do not fit a cache of {cache.max_context}")
    tokens_in = self._decode_inputs(ids.shape[0])
    for buffer in device_buffers(tokens_in): buffer.copyin(ids.astype(np.int32).reshape(-1, 1))
    return self._pipelined_steps(count)

  def _pipelined_steps(self, count: int) -> Iterator[list[int]]:
    cache, queued = self.cache, collections.deque()
    assert cache is not None
    def queue_step() -> None:
      position = cache.next_position
      positions = np.array([position], dtype=np.int32)
      self._replay_decode(None, cache.decode_variables(position))
      cache.advance(positions)
      queued.append(device_buffers(self._decode_tokens)[0].copyout_async())   # type: ignore[arg-type]
    if count: queue_step()
    for step in range(count):
      if step + 1 < count: queue_step()   # the step after this one, queued before this one's tokens are read
      yield queued.popleft().wait().reshape(-1).tolist()

  def _decode_inputs(self, batch: int) -> Tensor:
    """The jitted step's token input [B, 1] (which the step overwrites with its argmax), made for a new cache (a new
    cache has new buffers: a new capture)."""
    cache = self.cache
    if self._decode_jit is None or self._decode_jit_cache is not cache:
      self._decode_jit, self._decode_jit_cache = TinyJit(self._decode_step), cache
      self._decode_tokens = _device_input((batch, 1), self.device)
    assert self._decode_tokens is not None
    return self._decode_tokens

  def _replay_decode(self, token_ids: Optional[Tensor], variables: tuple) -> Tensor:
    """The decode step through its TinyJit with the position's bound Variables (the JIT sets them in the kernels that
    take them; nothing is copied to the device); `token_ids` (if given) are copied into the token input first.
    Returns the logits [B, 1, V], the JIT's buffer."""
    assert self.cache is not None
    tokens_in = self._decode_inputs(self.cache.batch)
    if token_ids is not None: tokens_in.assign(token_ids.cast(dtypes.int32)).realize()
    return self._decode_jit(*variables)   # type: ignore[misc]

  def _decode_step(self, position: Any, ring_slot: Any, ring_filled: Any) -> Tensor:
    """The jitted decode step: logits [B, 1, V] for the tokens in the token input, the cache written in place, and
    the argmax of the logits written into the token input (the next step's tokens)."""
    tokens = self._decode_tokens
    assert tokens is not None
    logits = self._run_step(tokens, None, DECODE, True, False, (position, ring_slot, ring_filled))
    # logits split by vocabulary: each device's part reduced, then two all-reduces of one value a row
    tokens.assign(logits[:, -1].argmax(-1, keepdim=True)).realize()
    return logits

  def _replay_prefill(self, ids: np.ndarray, length: Any) -> Tensor:
    """A prompt through the prefill's TinyJit (one capture for every length up to the cache's, made for this cache):
    the ids [B, max_context] (padded) copied into the step's own input buffer, the length a bound Variable. Returns
    the last position's logits [B, 1, V], the JIT's buffer."""
    cache = self.cache
    assert cache is not None
    if self._prefill_jit is None or self._prefill_jit_cache is not cache:
      self._prefill_jit, self._prefill_jit_cache = TinyJit(self._prefill_step), cache
      self._prefill_tokens = _device_input(ids.shape, self.device)
    assert self._prefill_tokens is not None
    for buffer in device_buffers(self._prefill_tokens): buffer.copyin(ids)
    return self._prefill_jit(self._prefill_tokens, length)

  def _prefill_step(self, padded_ids: Tensor, length: Any) -> Tensor:
    """The jitted prefill: the logits of the last of `length` prompt tokens, the cache filled."""
    return self._run_step(padded_ids.shrink((None, (0, length))), None, FRESH, True, False, length)

  def _run_step(self, token_ids: Tensor, step_data: Optional[Tensor], mode: str, last_only: bool,
                return_hidden: bool, variables: Any) -> Any:
    """The device side of a forward call: every layer over the cache, the cache writes, the logits; realized."""
    cache = self.cache
    assert cache is not None
    T = token_ids.shape[1]
    steps = self._step_inputs(mode, step_data, T, variables, cache)
    h = _fuse_into_consumer(self.model.embed_tokens(token_ids))
    hidden, pending = [h], []
    for layer, layer_cache in zip(self.model.layers, cache.layers):
      h, write = layer(h, steps[layer.layer_type], layer_cache)
      if return_hidden and isinstance(h, ResidualSum): h = h.value()
      hidden.append(h)
      if write is not None: pending.append((layer_cache, write, steps[layer.layer_type]))
    # the last layer's output: summed inside the final norm's row kernel (the two post-norms' sums of squares, then
    # the final norm's over the sum: three reduces over one row), stored by no kernel of its own
    if isinstance(h, ResidualSum): h = h.unstored()
    if last_only: h = h.shrink((None, (T - 1, T), None))
    head = self.head_weight
    # the final norm is a kernel of its own even for one position: inside the head's matvec every one of the
    # 262,144 vocabulary rows recomputed its sum of squares, and the step took 1.130 ms of GPU time against 0.867
    # (H100, float16, bench/gemma_gguf_gpu.py, 2026-11-27)
    h = _materialize(self.model.norm(h))
    hidden.append(h)
    logits = _softcap(project(h, head), self.config.final_logit_softcapping)
    outputs = [logits] + (hidden if return_hidden else [])
    # EXTEND writes the cache only after the kernels that read it have run (a schedule orders by data, not writes)
    Tensor.realize(*outputs, *([] if pending else cache.tensors()))
    for layer_cache, (k, v), step in pending:
      write_cache_scatter(layer_cache, k, v, step)
    if pending: Tensor.realize(*cache.tensors())
    return (logits, hidden) if return_hidden else logits
