"""Block-quantized weights in llama.cpp's ggml formats, kept packed on the device and dequantized by tgrad ops.

Input: a weight's blocks exactly as a GGUF file stores them, as a uint8 Tensor of shape (*rows, blocks_per_row,
block_bytes). Output: `QuantizedTensor.dequantize(dtype)`, a lazy Tensor of the logical shape built only from views
of those bytes (shrink, reshape, expand), bit-field arithmetic (uint8 multiplies, divisions and remainders by literal
powers of two), a bitcast of byte pairs to float16 for the scales, and float multiplies. Every step is elementwise over
views of the packed buffer, so the scheduler fuses the dequantization into the kernel that consumes the weight:
`linear(x)` streams the packed bytes through the matmul's reduce (one kernel). The float32 values equal llama.cpp's
(`gguf.quants.dequantize`) bit for bit: each product below is exact in float32 (an fp16 scale has 11 significant bits,
a 6-bit scale times a 6-bit quant adds 12), so only the final add of a min rounds, and it rounds the same whether or
not the backend fuses it into an fma.
"""
from __future__ import annotations
import functools
import weakref
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, Optional
import numpy as np
from tgrad.dtype import DType, dtypes
from tgrad.device import canonical_device
from tgrad.lazy import LazyBuffer
from tgrad.realize import is_capturing
from tgrad.tensor import Tensor
from tgrad.regions import DEFAULT, Lowering, composite, register

class GGMLType(IntEnum):
  """ggml's tensor type ids, as GGUF files store them (ggml.h's `enum ggml_type`; ids 4, 5, 31-33 are retired)."""
  F32 = 0; F16 = 1; Q4_0 = 2; Q4_1 = 3; Q5_0 = 6; Q5_1 = 7; Q8_0 = 8; Q8_1 = 9                       # noqa: E702
  Q2_K = 10; Q3_K = 11; Q4_K = 12; Q5_K = 13; Q6_K = 14; Q8_K = 15                                   # noqa: E702
  IQ2_XXS = 16; IQ2_XS = 17; IQ3_XXS = 18; IQ1_S = 19; IQ4_NL = 20; IQ3_S = 21; IQ2_S = 22; IQ4_XS = 23  # noqa: E702
  I8 = 24; I16 = 25; I32 = 26; I64 = 27; F64 = 28; IQ1_M = 29; BF16 = 30                            # noqa: E702
  TQ1_0 = 34; TQ2_0 = 35; MXFP4 = 39                                                                 # noqa: E702

@dataclass(frozen=True)
class BlockLayout:
  """How many values one block holds and how many bytes it takes (ggml's `ggml_type_traits`)."""
  block_size: int
  block_bytes: int

SUPER_BLOCK = 256   # values in one block of the K-quants (ggml's QK_K)
BLOCK_LAYOUTS: dict[GGMLType, BlockLayout] = {
  GGMLType.F32: BlockLayout(1, 4), GGMLType.F16: BlockLayout(1, 2), GGMLType.BF16: BlockLayout(1, 2),
  GGMLType.F64: BlockLayout(1, 8), GGMLType.I8: BlockLayout(1, 1), GGMLType.I16: BlockLayout(1, 2),
  GGMLType.I32: BlockLayout(1, 4), GGMLType.I64: BlockLayout(1, 8),
  GGMLType.Q4_0: BlockLayout(32, 18), GGMLType.Q4_1: BlockLayout(32, 20), GGMLType.Q5_0: BlockLayout(32, 22),
  GGMLType.Q5_1: BlockLayout(32, 24), GGMLType.Q8_0: BlockLayout(32, 34), GGMLType.Q8_1: BlockLayout(32, 40),
  GGMLType.Q2_K: BlockLayout(SUPER_BLOCK, 84), GGMLType.Q3_K: BlockLayout(SUPER_BLOCK, 110),
  GGMLType.Q4_K: BlockLayout(SUPER_BLOCK, 144), GGMLType.Q5_K: BlockLayout(SUPER_BLOCK, 176),
  GGMLType.Q6_K: BlockLayout(SUPER_BLOCK, 210), GGMLType.Q8_K: BlockLayout(SUPER_BLOCK, 292),
  GGMLType.IQ2_XXS: BlockLayout(SUPER_BLOCK, 66), GGMLType.IQ2_XS: BlockLayout(SUPER_BLOCK, 74),
  GGMLType.IQ3_XXS: BlockLayout(SUPER_BLOCK, 98), GGMLType.IQ1_S: BlockLayout(SUPER_BLOCK, 50),
  GGMLType.IQ4_NL: BlockLayout(32, 18), GGMLType.IQ3_S: BlockLayout(SUPER_BLOCK, 110),
  GGMLType.IQ2_S: BlockLayout(SUPER_BLOCK, 82), GGMLType.IQ4_XS: BlockLayout(SUPER_BLOCK, 136),
  GGMLType.IQ1_M: BlockLayout(SUPER_BLOCK, 56), GGMLType.TQ1_0: BlockLayout(SUPER_BLOCK, 54),
  GGMLType.TQ2_0: BlockLayout(SUPER_BLOCK, 66), GGMLType.MXFP4: BlockLayout(32, 17)}

# types whose bytes are plain numbers of one tgrad dtype: a loader hands them out as ordinary Tensors
PLAIN_DTYPES: dict[GGMLType, DType] = {
  GGMLType.F32: dtypes.float32, GGMLType.F16: dtypes.float16, GGMLType.BF16: dtypes.bfloat16,
  GGMLType.F64: dtypes.float64, GGMLType.I8: dtypes.int8, GGMLType.I16: dtypes.int16, GGMLType.I32: dtypes.int32,
  GGMLType.I64: dtypes.int64}

BYTE_BITS = 8
NIBBLE = 16              # a 4-bit field takes values below 16; × NIBBLE moves a value to the high nibble
Q4_OFFSET = 8            # Q4_0 stores q + 8 in a nibble
Q5_OFFSET = 16           # Q5_0 stores q + 16 in 5 bits
Q6_OFFSET = 32           # Q6_K stores q + 32 in 6 bits
HALF_BLOCK = 16          # the 32-value blocks keep values 0..15 in low nibbles and 16..31 in high nibbles

class QuantError(ValueError):
  """Packed data that does not fit its ggml type: a wrong byte count, a row not made of whole blocks, a type that
  tgrad cannot dequantize."""

# ---- bit fields of the packed bytes, as ops a kernel vectorizes. Constants are literals (Tensor.full, or a Python
# divisor, which `//` and `%` keep literal), not kernel parameters: a division or remainder by a power of two is then
# a shift or a mask. A field whose position varies along an axis is read by one multiply and one literal division:
# (byte · 2^(8 − width − shift)) mod 256 drops the bits above the field, // 2^(8 − width) drops those below.
def _literal(value: int, like: Tensor) -> Tensor: return Tensor.full((), value, dtype=like.dtype, device=like.device)

def _field(packed: Tensor, width: int) -> Tensor: return packed // (1 << (BYTE_BITS - width))

@functools.cache
def _field_multipliers(width: int, shifts: tuple[int, ...], device: str) -> Tensor:
  """The uint8 multipliers that move the field of `width` bits at each of `shifts` to the top of a byte: a tiny
  buffer made once per device (numpy only builds the table; the field arithmetic runs in the kernel)."""
  table = np.array([1 << (BYTE_BITS - width - shift) for shift in shifts], dtype=np.uint8)
  return Tensor(table, device=device).realize()

def _fields(packed: Tensor, width: int, shifts: tuple[int, ...], axes_shape: tuple[int, ...]) -> Tensor:
  """Field k (`width` bits at bit shifts[k]) of each byte of `packed`, with k laid out along `axes_shape` (the
  multipliers reshaped to it and broadcast over the bytes)."""
  multipliers = _field_multipliers(width, shifts, packed.device).reshape(axes_shape)
  return _field(packed * multipliers, width)

def _bytes(blocks: Tensor, start: int, count: int) -> Tensor:
  """Bytes start..start+count of every block: a (n_blocks, count) view."""
  return blocks.shrink(((0, blocks.shape[0]), (start, start + count)))

def _half(blocks: Tensor, start: int) -> Tensor:
  """The little-endian float16 at byte `start` of every block, as (n_blocks, 1) float32 (exact: a widening)."""
  low, high = _bytes(blocks, start, 1).cast(dtypes.uint16), _bytes(blocks, start + 1, 1).cast(dtypes.uint16)
  return (high * _literal(1 << BYTE_BITS, high) + low).bitcast(dtypes.float16).cast(dtypes.float32)

# ---- one dequantizer per type: (n_blocks, block_bytes) uint8 → float32 (n_blocks, *block axes), the block axes in
# row-major order of the block's values. Keeping the axes (not one axis of block_size) keeps every read a plain
# strided view, so a consumer that keeps them too (QuantizedTensor.linear) computes no index divisions.
def _dequant_f32(blocks: Tensor) -> Tensor:
  word = _bytes(blocks, 0, 1).cast(dtypes.uint32)
  for i in range(1, 4): word = word + _bytes(blocks, i, 1).cast(dtypes.uint32) * _literal(1 << (BYTE_BITS * i), word)
  return word.bitcast(dtypes.float32)

def _dequant_f16(blocks: Tensor) -> Tensor: return _half(blocks, 0)

def _dequant_bf16(blocks: Tensor) -> Tensor:
  """A bfloat16 is the high half of a float32: its two bytes go to bits 16..31."""
  low, high = _bytes(blocks, 0, 1).cast(dtypes.uint32), _bytes(blocks, 1, 1).cast(dtypes.uint32)
  return (high * _literal(1 << (3 * BYTE_BITS), high) + low * _literal(1 << (2 * BYTE_BITS), low)).bitcast(
    dtypes.float32)

NIBBLE_SHIFTS = (0, 4)   # the low nibble holds the first value, the high nibble the second

def _nibbles32(blocks: Tensor, start: int) -> Tensor:
  """The 32 4-bit values of a 16-byte run as (n, 2, 2, 8): value 16h + 8a + b is nibble h of byte 8a + b."""
  n = blocks.shape[0]
  packed = _bytes(blocks, start, HALF_BLOCK).reshape(n, 1, 2, BYTE_BITS).expand(n, 2, 2, BYTE_BITS)
  return _fields(packed, 4, NIBBLE_SHIFTS, (1, 2, 1, 1))

def _fifth_bits32(blocks: Tensor, start: int) -> Tensor:
  """Bit j of the little-endian uint32 at `start` (byte j // 8, bit j % 8), as (n, 2, 2, 8) like `_nibbles32`,
  moved to bit 4."""
  n = blocks.shape[0]
  packed = _bytes(blocks, start, 4).reshape(n, 2, 2, 1).expand(n, 2, 2, BYTE_BITS)
  bits = _fields(packed, 1, tuple(range(BYTE_BITS)), (1, 1, 1, BYTE_BITS))
  return bits * _literal(NIBBLE, bits)

def _legacy(blocks: Tensor, quants: Tensor, offset: int, has_min: bool) -> Tensor:
  """The 32-value formats: d·(q − offset), or d·q + m with a min; quants (n, 2, 2, 8) unsigned."""
  n = blocks.shape[0]
  scale = _half(blocks, 0).reshape(n, 1, 1, 1)
  if has_min: return scale * quants.cast(dtypes.float32) + _half(blocks, 2).reshape(n, 1, 1, 1)
  signed = quants.cast(dtypes.int8)
  return scale * (signed - _literal(offset, signed)).cast(dtypes.float32)

def _dequant_q4_0(blocks: Tensor) -> Tensor: return _legacy(blocks, _nibbles32(blocks, 2), Q4_OFFSET, False)
def _dequant_q4_1(blocks: Tensor) -> Tensor: return _legacy(blocks, _nibbles32(blocks, 4), 0, True)
def _dequant_q5_0(blocks: Tensor) -> Tensor:
  return _legacy(blocks, _nibbles32(blocks, 6) | _fifth_bits32(blocks, 2), Q5_OFFSET, False)
def _dequant_q5_1(blocks: Tensor) -> Tensor:
  return _legacy(blocks, _nibbles32(blocks, 8) | _fifth_bits32(blocks, 4), 0, True)

def _dequant_q8_0(blocks: Tensor) -> Tensor:
  return _bytes(blocks, 2, 32).bitcast(dtypes.int8).cast(dtypes.float32) * _half(blocks, 0)

# Q4_K and Q5_K: 8 sub-blocks of 32 values, each with a 6-bit scale and a 6-bit min packed into 12 bytes. Bytes 0-3
# hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; sub-blocks 4-7 take their low 4 bits from bytes 8-11
# (scale in the low nibble, min in the high one) and their top 2 bits from the spare top bits of bytes 0-3 / 4-7.
K_SCALES_START = 4
K_SCALE_BYTES = 12
K_SUB_BLOCKS = 8
K_SUB_BLOCK = 32
SIX_BITS = 64            # a K-quant sub-block scale or min takes values below 64

def _k_scales_mins(blocks: Tensor) -> tuple[Tensor, Tensor]:
  """(scales, mins) of the 8 sub-blocks of Q4_K/Q5_K, each (n, 4, 2, 1) float32 for sub-block 2c+h."""
  n, quarter = blocks.shape[0], K_SCALE_BYTES // 3
  first, second, third = (_bytes(blocks, K_SCALES_START + quarter * i, quarter) for i in range(3))
  top = _literal(NIBBLE, first)   # bits 6-7 of a byte moved to bits 4-5: // 64 then × 16
  scales = (first % SIX_BITS).cat(third % NIBBLE + (first // SIX_BITS) * top, dim=1)
  mins = (second % SIX_BITS).cat(third // NIBBLE + (second // SIX_BITS) * top, dim=1)
  shape = (n, K_SUB_BLOCKS // 2, 2, 1)
  return scales.cast(dtypes.float32).reshape(shape), mins.cast(dtypes.float32).reshape(shape)

def _k_nibbles(blocks: Tensor, start: int) -> Tensor:
  """128 bytes as 256 4-bit values (n, 4, 2, 32): chunk c of 32 bytes gives sub-block 2c (low) and 2c+1 (high)."""
  n, chunks = blocks.shape[0], K_SUB_BLOCKS // 2
  packed = _bytes(blocks, start, chunks * K_SUB_BLOCK).reshape(n, chunks, 1, K_SUB_BLOCK)
  return _fields(packed.expand(n, chunks, 2, K_SUB_BLOCK), 4, NIBBLE_SHIFTS, (1, 1, 2, 1))

def _k_scaled(blocks: Tensor, quants: Tensor) -> Tensor:
  """(d·scale)·q − dmin·min per sub-block, as llama.cpp groups it; quants (n, 4, 2, 32)."""
  n = blocks.shape[0]
  scales, mins = _k_scales_mins(blocks)
  d, dmin = _half(blocks, 0).reshape(n, 1, 1, 1), _half(blocks, 2).reshape(n, 1, 1, 1)
  return (d * scales) * quants.cast(dtypes.float32) - dmin * mins

Q4_K_QS_START = K_SCALES_START + K_SCALE_BYTES
Q5_K_QH_START = K_SCALES_START + K_SCALE_BYTES
Q5_K_QS_START = Q5_K_QH_START + SUPER_BLOCK // BYTE_BITS

def _dequant_q4_k(blocks: Tensor) -> Tensor: return _k_scaled(blocks, _k_nibbles(blocks, Q4_K_QS_START))

def _dequant_q5_k(blocks: Tensor) -> Tensor:
  """Q4_K plus a fifth bit: bit s of byte i of the 32-byte qh run belongs to value i of sub-block s."""
  n = blocks.shape[0]
  high = _bytes(blocks, Q5_K_QH_START, K_SUB_BLOCK).reshape(n, 1, 1, K_SUB_BLOCK).expand(n, 4, 2, K_SUB_BLOCK)
  bits = _fields(high, 1, tuple(range(K_SUB_BLOCKS)), (1, 4, 2, 1))
  return _k_scaled(blocks, _k_nibbles(blocks, Q5_K_QS_START) | bits * _literal(NIBBLE, bits))

# Q6_K: 16 sub-blocks of 16 values with an int8 scale each and one fp16 d at the end. Value o = 128a + 64b + 32k + i
# (a, b, k in 0..1, i in 0..31) takes nibble b of low byte 64a + 32k + i and bits 4b+2k.. of high byte 32a + i.
Q6_K_QH_START = SUPER_BLOCK // 2
Q6_K_SCALES_START = Q6_K_QH_START + SUPER_BLOCK // 4
Q6_K_D_START = Q6_K_SCALES_START + SUPER_BLOCK // 16
Q6_K_HIGH_SHIFTS = (0, 2, 4, 6)   # 2-bit fields, for (b, k) = (0, 0), (0, 1), (1, 0), (1, 1)

def _dequant_q6_k(blocks: Tensor) -> Tensor:
  n, half_run, sixteen = blocks.shape[0], K_SUB_BLOCK // 2, SUPER_BLOCK // 16
  shape = (n, 2, 2, 2, 2, half_run)   # (a, b, k, i // 16, i % 16)
  low = _bytes(blocks, 0, Q6_K_QH_START).reshape(n, 2, 1, 2, 2, half_run).expand(shape)
  high = _bytes(blocks, Q6_K_QH_START, SUPER_BLOCK // 4).reshape(n, 2, 1, 1, 2, half_run).expand(shape)
  low = _fields(low, 4, NIBBLE_SHIFTS, (1, 1, 2, 1, 1, 1))
  high = _fields(high, 2, Q6_K_HIGH_SHIFTS, (1, 1, 2, 2, 1, 1))
  signed = (low + high * _literal(NIBBLE, high)).cast(dtypes.int8)
  quants = (signed - _literal(Q6_OFFSET, signed)).cast(dtypes.float32)
  scales = _bytes(blocks, Q6_K_SCALES_START, sixteen).bitcast(dtypes.int8).cast(dtypes.float32)
  d = _half(blocks, Q6_K_D_START).reshape(n, 1, 1, 1, 1, 1)
  return (d * scales.reshape(n, 2, 2, 2, 2, 1)) * quants

DEQUANTIZERS: dict[GGMLType, Callable[[Tensor], Tensor]] = {
  GGMLType.F32: _dequant_f32, GGMLType.F16: _dequant_f16, GGMLType.BF16: _dequant_bf16,
  GGMLType.Q4_0: _dequant_q4_0, GGMLType.Q4_1: _dequant_q4_1, GGMLType.Q5_0: _dequant_q5_0,
  GGMLType.Q5_1: _dequant_q5_1, GGMLType.Q8_0: _dequant_q8_0, GGMLType.Q4_K: _dequant_q4_k,
  GGMLType.Q5_K: _dequant_q5_k, GGMLType.Q6_K: _dequant_q6_k}

def dequantize_structured(blocks: Tensor, ggml_type: GGMLType) -> Tensor:
  """(n_blocks, block_bytes) uint8 → float32 (n_blocks, *block axes), lazily (see DEQUANTIZERS)."""
  if ggml_type not in DEQUANTIZERS:
    raise QuantError(f"no dequantization for ggml type {GGMLType(ggml_type).name}; tgrad has "
                     f"{', '.join(t.name for t in DEQUANTIZERS)}")
  layout = BLOCK_LAYOUTS[ggml_type]
  if blocks.dtype != dtypes.uint8 or blocks.ndim != 2 or blocks.shape[1] != layout.block_bytes:
    raise QuantError(f"{ggml_type.name} blocks must be uint8 (n, {layout.block_bytes}), got {blocks.dtype} "
                     f"{blocks.shape}")
  return DEQUANTIZERS[ggml_type](blocks)

def dequantize_blocks(blocks: Tensor, ggml_type: GGMLType) -> Tensor:
  """(n_blocks, block_bytes) uint8 → (n_blocks, block_size) float32, lazily."""
  return dequantize_structured(blocks, ggml_type).reshape(blocks.shape[0], BLOCK_LAYOUTS[ggml_type].block_size)

def packed_nbytes(ggml_type: GGMLType, shape: tuple[int, ...]) -> int:
  """Bytes a tensor of `shape` takes in `ggml_type`; its last dim must be whole blocks."""
  layout = BLOCK_LAYOUTS[ggml_type]
  if not shape or shape[-1] % layout.block_size:
    raise QuantError(f"{ggml_type.name} needs a last dim that is a multiple of {layout.block_size}, got shape {shape}")
  count = 1
  for size in shape: count *= size
  return count // layout.block_size * layout.block_bytes

# ---- the two ways to use a quantized weight, as lowerings of one composite (a region of the lazy graph: the benchmark
# database measures each and TOLERANCE selects, tgrad/paths): "default" dequantizes the blocks inside every kernel that
# reads the values (only the packed bytes are stored); "dequant_<dtype>" dequantizes them once, on first use, into a
# buffer of that dtype kept for the packed weight's lifetime, and every later use reads that buffer (the weight is
# then stored twice: packed, and dense). Its values are the float32 ones rounded to <dtype>, so the path's error
# says what the narrower copy costs.
DEQUANTIZE = "dequantize"
DENSE_DTYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16)
_dense_copies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # packed LazyBuffer → {dtype: realized Tensor}

def _structured(packed: Tensor, ggml_type: int, shape: tuple[int, ...]) -> Tensor:
  """float32 values of an (out, in) weight as (out, blocks per row, *block axes): every read a plain strided view."""
  layout = BLOCK_LAYOUTS[GGMLType(ggml_type)]
  values = dequantize_structured(packed.reshape(-1, layout.block_bytes), GGMLType(ggml_type))
  return values.reshape(*shape[:-1], shape[-1] // layout.block_size, *values.shape[1:])

def dense_copy(packed: Tensor, ggml_type: int, shape: tuple[int, ...], dtype: DType) -> Tensor:
  """The weight dequantized into a realized row-major buffer of `dtype`, made on the first call for this packed value
  and returned again after. Inside a TinyJit capture (which launches nothing) a missing copy stays lazy: the replays
  then dequantize it each time (correct, slower); the jitted function's first, uncaptured call normally made it."""
  lb = packed.lazydata
  copies = _dense_copies.setdefault(lb, {})
  if dtype not in copies:
    dense = _structured(packed, ggml_type, shape).reshape(shape).cast(dtype).contiguous()
    if is_capturing(): return dense
    copies[dtype] = dense.realize()
  return copies[dtype]

def _dequantize_once(dtype: DType) -> Callable[..., Tensor]:
  def build(packed: Tensor, ggml_type: int, shape: tuple[int, ...]) -> Tensor:
    structured = _structured(packed, ggml_type, shape)   # lazy, for its shape: nothing of it runs
    return dense_copy(packed, ggml_type, shape, dtype).reshape(structured.shape).cast(dtypes.float32)
  return build

register(DEQUANTIZE, {
  DEFAULT: Lowering(DEFAULT, "packed: the blocks dequantized inside every kernel that reads the weight",
                    _structured, 3),
  **{f"dequant_{dtype.name}": Lowering(f"dequant_{dtype.name}", f"dequantized once into a {dtype.name} copy, read "
                                       "by every use", _dequantize_once(dtype), exactness)
     for dtype, exactness in zip(DENSE_DTYPES, (2, 1, 0))}})

def dequantized_values(packed: Tensor, ggml_type: GGMLType, shape: tuple[int, ...]) -> Tensor:
  """The float32 values of a packed 2-D weight as (out, blocks per row, *block axes), as the composite `dequantize`:
  by default computed from the blocks inside the consuming kernel; a path may read a dequantized copy instead."""
  return composite(DEQUANTIZE, (packed,), ggml_type=int(ggml_type), shape=tuple(shape))

class QuantizedTensor:
  """A weight of logical `shape` in `ggml_type`, kept as its packed blocks: `packed` is a uint8 Tensor of shape
  (*shape[:-1], shape[-1] // block_size, block_bytes). Nothing here is dequantized until a graph that uses
  `dequantize()` or `linear()` is realized, and then inside the kernel that reads the weight."""
  def __init__(self, packed: Tensor, ggml_type: GGMLType, shape: tuple[int, ...]):
    self.ggml_type, self.shape = GGMLType(ggml_type), tuple(shape)
    layout = BLOCK_LAYOUTS[self.ggml_type]
    expected = (*self.shape[:-1], self.shape[-1] // layout.block_size, layout.block_bytes) if self.shape else ()
    packed_nbytes(self.ggml_type, self.shape)   # checks whole blocks
    if packed.dtype != dtypes.uint8 or packed.shape != expected:
      raise QuantError(f"{self.ggml_type.name} tensor of shape {self.shape} needs packed uint8 {expected}, got "
                       f"{packed.dtype} {packed.shape}")
    self.packed = packed

  @staticmethod
  def from_bytes(data: np.ndarray, ggml_type: GGMLType, shape: tuple[int, ...],
                 device: Optional[str] = None) -> QuantizedTensor:
    """Blocks from host bytes (a memory map or an array: referenced, copied to the device when first needed)."""
    ggml_type = GGMLType(ggml_type)
    nbytes, layout = packed_nbytes(ggml_type, tuple(shape)), BLOCK_LAYOUTS[ggml_type]
    raw = np.asarray(data).reshape(-1).view(np.uint8)
    if raw.size != nbytes:
      raise QuantError(f"{ggml_type.name} tensor of shape {tuple(shape)} takes {nbytes} bytes, got {raw.size}")
    packed_shape = (*shape[:-1], shape[-1] // layout.block_size, layout.block_bytes)
    lazy = LazyBuffer.from_host(raw.reshape(packed_shape), canonical_device(device), dtypes.uint8)
    return QuantizedTensor(Tensor(lazy), ggml_type, tuple(shape))

  @property
  def device(self) -> str: return self.packed.device
  @property
  def ndim(self) -> int: return len(self.shape)
  @property
  def nbytes(self) -> int: return packed_nbytes(self.ggml_type, self.shape)
  def __repr__(self) -> str: return f"<QuantizedTensor {self.ggml_type.name} {self.shape} on {self.device}>"

  def dequantize(self, dtype: DType = dtypes.float32) -> Tensor:
    """The values as a lazy Tensor of `shape`: computed in float32 (llama.cpp's values exactly), then cast."""
    layout = BLOCK_LAYOUTS[self.ggml_type]
    values = dequantize_blocks(self.packed.reshape(-1, layout.block_bytes), self.ggml_type)
    return values.reshape(self.shape).cast(dtype)

  def linear(self, x: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """x·Wᵀ (+ bias) for a weight of shape (out_features, in_features), dequantized inside the matmul each call (or
    read from a dequantized copy where the selected path says so: `dequantized_values`). The product keeps the block
    axes: x is viewed as (..., 1, blocks_per_row, *block axes) and the sum runs over them, so the kernel reads the
    packed bytes through plain strided views. On a CPU, many rows of x (a prompt) make that kernel a dequantizing
    copy of the weight into float32 panels, kept while the weight is unchanged, and the blocked matmul
    (codegen/cpu_gemm.py)."""
    if self.ndim != 2 or x.ndim == 0 or x.shape[-1] != self.shape[1]:
      raise QuantError(f"linear: input of shape {x.shape} for a quantized weight of shape {self.shape}")
    weight = dequantized_values(self.packed, self.ggml_type, self.shape)
    dtype = x.dtype if x.dtype.is_float else dtypes.float32
    # products and sums in float32 at least: the dequantized values are float32, and a half product would round each
    # term (and cost two conversions per product on a GPU); only the result is rounded to x's dtype
    compute = dtypes.float32 if dtype.itemsize < dtypes.float32.itemsize else dtype
    input_axes = weight.shape[1:]
    rows = x.cast(compute).reshape(*x.shape[:-1], 1, *input_axes)
    out = (rows * weight.cast(compute)).sum(axis=tuple(range(-len(input_axes), 0))).cast(dtype)
    return out if bias is None else out + bias

  def to(self, device: str) -> QuantizedTensor:
    return QuantizedTensor(self.packed.to(device), self.ggml_type, self.shape)
  def realize(self) -> QuantizedTensor:
    self.packed.realize()
    return self
