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
import weakref
from dataclasses import dataclass
from enum import IntEnum
from typing import Callable, Optional, Sequence
import numpy as np
from tgrad.backend import devices_offering
from tgrad.dtype import DType, dtypes
from tgrad.device import DEVICE_TRAITS, canonical_device
from tgrad.helpers import Context, prod
from tgrad.lazy import LazyBuffer
from tgrad.packed_gemm_kernel import packed_gemm
from tgrad.ops import Ops
from tgrad.realize import is_capturing
from tgrad.tensor import Tensor
from tgrad.regions import DEFAULT, Lowering, composite, register
from tgrad.shape.sint import vmax_of

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

def _field_multipliers(width: int, shifts: tuple[int, ...], device: str) -> Tensor:
  """The uint8 multipliers that move the field of `width` bits at each of `shifts` (evenly spaced) to the top of a
  byte: 2^(8 − width − shift_k) from an arange k, so a kernel that unrolls the field axis multiplies by literals (a
  shift), and one that loops over it computes them."""
  step = shifts[1] - shifts[0] if len(shifts) > 1 else 0
  if any(shift != shifts[0] + step * k for k, shift in enumerate(shifts)):
    raise QuantError(f"bit fields at shifts {shifts} are not evenly spaced")
  positions = Tensor.arange(len(shifts), dtype=dtypes.uint8, device=device)
  top = _literal(1 << (BYTE_BITS - width - shifts[0]), positions).expand(len(shifts))
  # a plain SHR (the amounts are below 8 by construction), not `>>`, whose range guards would lift its bounds to
  # kernel parameters
  return Tensor(top.lazydata.alu(Ops.SHR, (positions * _literal(step, positions)).lazydata))

def _bit_masks(shifts: tuple[int, ...], device: str) -> Tensor:
  """The uint8 masks 2^shift_k of single bits at evenly spaced `shifts`, from an arange k (literals where unrolled)."""
  step = shifts[1] - shifts[0] if len(shifts) > 1 else 0
  positions = Tensor.arange(len(shifts), dtype=dtypes.uint8, device=device)
  amounts = positions * _literal(step, positions) + _literal(shifts[0], positions)
  return Tensor(_literal(1, positions).expand(len(shifts)).lazydata.alu(Ops.SHL, amounts.lazydata))

def _bits_set(packed: Tensor, shifts: tuple[int, ...], axes_shape: tuple[int, ...]) -> Tensor:
  """Whether bit shifts[k] of each byte of `packed` is set (bool), k laid out along `axes_shape` (see _fields)."""
  masks = _bit_masks(shifts, packed.device).reshape(axes_shape)
  return (packed & masks) != _literal(0, packed)

def _fields(packed: Tensor, width: int, shifts: tuple[int, ...], axes_shape: tuple[int, ...]) -> Tensor:
  """Field k (`width` bits at bit shifts[k]) of each byte of `packed`, with k laid out along `axes_shape` (the
  multipliers reshaped to it and broadcast over the bytes). A single bit is tested by a mask (an AND and a compare
  per byte, which vectorize on bytes; a per-lane multiply of bytes does not on AVX2)."""
  if width == 1: return _bits_set(packed, shifts, axes_shape).cast(dtypes.uint8)
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

def _fifth_bits_set32(blocks: Tensor, start: int) -> Tensor:
  """Whether bit j of the little-endian uint32 at `start` (byte j // 8, bit j % 8) is set, as (n, 2, 2, 8) bools like
  `_nibbles32`."""
  n = blocks.shape[0]
  packed = _bytes(blocks, start, 4).reshape(n, 2, 2, 1).expand(n, 2, 2, BYTE_BITS)
  return _bits_set(packed, tuple(range(BYTE_BITS)), (1, 1, 1, BYTE_BITS))

def _high_bits(bits_set: Tensor) -> Tensor:
  """A fifth bit's integer weight: 16 where it is set, else 0 (uint8)."""
  bits = bits_set.cast(dtypes.uint8)
  return bits * _literal(NIBBLE, bits)

# A fifth bit's float form: its weight chosen by a select of two float literals. Its integer form (a byte's bit moved
# to bit 4, then or-ed into the nibble) becomes, after LLVM's instcombine, a different shift per byte lane, which AVX2
# lacks: the SLP vectorizer then unpacked the bits one byte at a time (a Q5_0 block's loop: ~120 instructions, ~65 with
# the select, where the bits stay one vector compare; Q5_0 2048×640 on the 2 shared Zen 3 cores: 1.5-2× less CPU time,
# bench/cpu_packed_matvec.py). The sum is exact (small integers), so the values are llama.cpp's bit for bit.
def _float_quants(nibbles: Tensor, bits_set: Tensor, offset: int) -> Tensor:
  """float(nibble + 16·bit − offset), the bit's weight a select of two float literals."""
  def value(v: float) -> Tensor: return Tensor.full((), v, dtype=dtypes.float32, device=nibbles.device)
  return nibbles.cast(dtypes.float32) + bits_set.where(value(NIBBLE - offset), value(-offset))

@dataclass(frozen=True)
class IntegerBlocks:
  """A block type's values as integers and float32 factors, each at the structured block shape (or broadcast to it):
  value = scale · quants + offset (offset: Q4_1/Q5_1's min), or scale · quants − offset (negated: the K-quants' min).
  `values()` is the float32 dequantization (llama.cpp's bit for bit); the int8 product (`int8_linear`) multiplies
  the quants by an int8 activation in integers and applies scale and offset once per group of values. `float_quants`,
  where given, is the quants as float32 by a cheaper route than a conversion (`_float_quants`)."""
  quants: Tensor
  scale: Tensor
  offset: Optional[Tensor] = None
  negated: bool = False
  float_quants: Optional[Tensor] = None
  def values(self) -> Tensor:
    quants = self.quants.cast(dtypes.float32) if self.float_quants is None else self.float_quants
    scaled = self.scale * quants
    if self.offset is None: return scaled
    return scaled - self.offset if self.negated else scaled + self.offset

def _legacy(blocks: Tensor, quants: Tensor, offset: int, has_min: bool,
            float_quants: Optional[Tensor] = None) -> IntegerBlocks:
  """The 32-value formats: d·(q − offset), or d·q + m with a min; quants (n, 2, 2, 8) unsigned (float_quants: the
  quants less the offset, as float32)."""
  n = blocks.shape[0]
  scale = _half(blocks, 0).reshape(n, 1, 1, 1)
  if has_min: return IntegerBlocks(quants, scale, _half(blocks, 2).reshape(n, 1, 1, 1), float_quants=float_quants)
  signed = quants.cast(dtypes.int8)
  return IntegerBlocks(signed - _literal(offset, signed), scale, float_quants=float_quants)

def _ints_q4_0(blocks: Tensor) -> IntegerBlocks: return _legacy(blocks, _nibbles32(blocks, 2), Q4_OFFSET, False)
def _ints_q4_1(blocks: Tensor) -> IntegerBlocks: return _legacy(blocks, _nibbles32(blocks, 4), 0, True)
def _ints_q5_0(blocks: Tensor) -> IntegerBlocks:
  nibbles, bits_set = _nibbles32(blocks, 6), _fifth_bits_set32(blocks, 2)
  return _legacy(blocks, nibbles | _high_bits(bits_set), Q5_OFFSET, False, _float_quants(nibbles, bits_set, Q5_OFFSET))
def _ints_q5_1(blocks: Tensor) -> IntegerBlocks:
  nibbles, bits_set = _nibbles32(blocks, 8), _fifth_bits_set32(blocks, 4)
  return _legacy(blocks, nibbles | _high_bits(bits_set), 0, True, _float_quants(nibbles, bits_set, 0))

def _ints_q8_0(blocks: Tensor) -> IntegerBlocks:
  return IntegerBlocks(_bytes(blocks, 2, 32).bitcast(dtypes.int8), _half(blocks, 0))

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

def _k_scaled(blocks: Tensor, quants: Tensor) -> IntegerBlocks:
  """(d·scale)·q − dmin·min per sub-block, as llama.cpp groups it; quants (n, 4, 2, 32)."""
  n = blocks.shape[0]
  scales, mins = _k_scales_mins(blocks)
  d, dmin = _half(blocks, 0).reshape(n, 1, 1, 1), _half(blocks, 2).reshape(n, 1, 1, 1)
  return IntegerBlocks(quants, d * scales, dmin * mins, negated=True)

Q4_K_QS_START = K_SCALES_START + K_SCALE_BYTES
Q5_K_QH_START = K_SCALES_START + K_SCALE_BYTES
Q5_K_QS_START = Q5_K_QH_START + SUPER_BLOCK // BYTE_BITS

def _ints_q4_k(blocks: Tensor) -> IntegerBlocks: return _k_scaled(blocks, _k_nibbles(blocks, Q4_K_QS_START))

def _ints_q5_k(blocks: Tensor) -> IntegerBlocks:
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

def _ints_q6_k(blocks: Tensor) -> IntegerBlocks:
  n, half_run, sixteen = blocks.shape[0], K_SUB_BLOCK // 2, SUPER_BLOCK // 16
  shape = (n, 2, 2, 2, 2, half_run)   # (a, b, k, i // 16, i % 16)
  low = _bytes(blocks, 0, Q6_K_QH_START).reshape(n, 2, 1, 2, 2, half_run).expand(shape)
  high = _bytes(blocks, Q6_K_QH_START, SUPER_BLOCK // 4).reshape(n, 2, 1, 1, 2, half_run).expand(shape)
  low = _fields(low, 4, NIBBLE_SHIFTS, (1, 1, 2, 1, 1, 1))
  high = _fields(high, 2, Q6_K_HIGH_SHIFTS, (1, 1, 2, 2, 1, 1))
  signed = (low + high * _literal(NIBBLE, high)).cast(dtypes.int8)
  scales = _bytes(blocks, Q6_K_SCALES_START, sixteen).bitcast(dtypes.int8).cast(dtypes.float32)
  d = _half(blocks, Q6_K_D_START).reshape(n, 1, 1, 1, 1, 1)
  return IntegerBlocks(signed - _literal(Q6_OFFSET, signed), d * scales.reshape(n, 2, 2, 2, 2, 1))

# the block types whose values are integers times per-group factors (IntegerBlocks), and so have an int8 product
INTEGER_FORMS: dict[GGMLType, Callable[[Tensor], IntegerBlocks]] = {
  GGMLType.Q4_0: _ints_q4_0, GGMLType.Q4_1: _ints_q4_1, GGMLType.Q5_0: _ints_q5_0, GGMLType.Q5_1: _ints_q5_1,
  GGMLType.Q8_0: _ints_q8_0, GGMLType.Q4_K: _ints_q4_k, GGMLType.Q5_K: _ints_q5_k, GGMLType.Q6_K: _ints_q6_k}

def _dequant_integer(form: Callable[[Tensor], IntegerBlocks]) -> Callable[[Tensor], Tensor]:
  return lambda blocks: form(blocks).values()

DEQUANTIZERS: dict[GGMLType, Callable[[Tensor], Tensor]] = {
  GGMLType.F32: _dequant_f32, GGMLType.F16: _dequant_f16, GGMLType.BF16: _dequant_bf16,
  **{ggml_type: _dequant_integer(form) for ggml_type, form in INTEGER_FORMS.items()}}

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

# ---- lossless widening: some types hold every value of a narrower one exactly (the same scales, more bits per
# quant), so weights of the two types can share one buffer and one matrix-vector kernel (a GGUF file may quantize q and
# k unlike v). Q4_0's d·(q − 8) and Q5_0's d·(q − 16) are Q8_0 values d·q8 with the same fp16 d; Q4_K's
# (d·sc)·q − dmin·m is Q5_K's with every fifth bit 0. Each re-encoding is ops on the blocks: (n, bytes) → (n, bytes).
Q8_0_QUANTS_START = 2        # a Q8_0 block: its fp16 d, then 32 int8 quants
K_HEADER_BYTES = K_SCALES_START + K_SCALE_BYTES   # d, dmin and the 12 bytes of scales and mins

def _q8_0_from_symmetric(ggml_type: GGMLType) -> Callable[[Tensor], Tensor]:
  """Q4_0 or Q5_0 blocks as Q8_0: the same d, the signed quants q − offset as int8 bytes."""
  def widen(blocks: Tensor) -> Tensor:
    quants = INTEGER_FORMS[ggml_type](blocks).quants.reshape(blocks.shape[0], BLOCK_LAYOUTS[ggml_type].block_size)
    return _bytes(blocks, 0, Q8_0_QUANTS_START).cat(quants.bitcast(dtypes.uint8), dim=1)
  return widen

def _q5_k_from_q4_k(blocks: Tensor) -> Tensor:
  """Q4_K blocks as Q5_K: d, dmin, scales and mins and the nibbles as they are, a run of zero fifth bits between."""
  high_bits = Tensor.zeros(blocks.shape[0], Q5_K_QS_START - Q5_K_QH_START, dtype=dtypes.uint8, device=blocks.device)
  quants = _bytes(blocks, Q4_K_QS_START, SUPER_BLOCK // 2)
  return _bytes(blocks, 0, K_HEADER_BYTES).cat(high_bits, quants, dim=1)

WIDENINGS: dict[tuple[GGMLType, GGMLType], Callable[[Tensor], Tensor]] = {
  (GGMLType.Q4_0, GGMLType.Q8_0): _q8_0_from_symmetric(GGMLType.Q4_0),
  (GGMLType.Q5_0, GGMLType.Q8_0): _q8_0_from_symmetric(GGMLType.Q5_0),
  (GGMLType.Q4_K, GGMLType.Q5_K): _q5_k_from_q4_k}

# The type a packed weight is held in on a CPU (a device without local memory), where a type's products are bound by
# unpacking rather than bytes: Q5_0's nibble halves and fifth bits make its matvec compute-bound there, while Q8_0's
# whole bytes stream near the memory bandwidth, so a Q5_0 weight is held as the Q8_0 blocks of the same values (55%
# more bytes). Measured (bench/cpu_packed_matvec.py, 2-core Zen 4, 4096×640, both threads): Q5_0 213 µs (8.4 GB/s),
# the same values as Q8_0 113 µs (24.5 GB/s); Q4_0 (212 µs) is as fast as Q8_0 there and stays as it is.
CPU_HELD_TYPES = {GGMLType.Q5_0: GGMLType.Q8_0}

def held_type(ggml_type: GGMLType, device: str) -> GGMLType:
  """The ggml type a packed weight of `ggml_type` is held in on `device`: itself, or on a CPU the CPU_HELD_TYPES
  widening (the same values: WIDENINGS)."""
  if DEVICE_TRAITS[device].has_local: return ggml_type
  return CPU_HELD_TYPES.get(ggml_type, ggml_type)

def exact_common_type(types: Sequence[GGMLType]) -> Optional[GGMLType]:
  """The one of `types` that holds every other exactly (WIDENINGS), or None."""
  for candidate in types:
    if all(t == candidate or (t, candidate) in WIDENINGS for t in types): return GGMLType(candidate)
  return None

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

# ---- two ways to multiply by a packed weight, as lowerings of the composite `packed_linear` (x·Wᵀ for an (out, in)
# weight; the paths database measures both and TOLERANCE selects): "default" sums x times the weight's float32 values
# (the dequantize composite above, packed or from a dense copy) in float32; "int8" quantizes x per block of 32 values to
# int8 and a float32 scale (llama.cpp's Q8_0 activation, quantize_activation) and multiplies the weight's integer
# quants (IntegerBlocks) by them in integers, each group's products summed in int32 (the codegen sums an unrolled
# group's integer terms before its one float multiply: reduces.factor_integer_terms), then scaled once per group. Its
# error is the activation's rounding, about 1/254 of each block's largest |x| per value, so it is selected only at
# tolerances that allow that.
PACKED_LINEAR = "packed_linear"
Q8_BLOCK = 32   # values per block of the int8 activation (llama.cpp's Q8_0 and Q8_K blocks of 32)
Q8_MAX = 127    # the largest magnitude of an int8 activation value (symmetric: -128 is never used)

def quantize_activation(x: Tensor) -> tuple[Tensor, Tensor]:
  """x (..., n), n a multiple of 32 → (int8 quants (..., n // 32, 32), float32 scales (..., n // 32, 1)): per block
  d = max|x| / 127 and q = round(x / d), 0 where the block is all zero (llama.cpp's quantize_row_q8_0, d kept as
  float32). |q| ≤ 127, and x ≈ d·q within d/2 per value."""
  if x.shape[-1] % Q8_BLOCK: raise QuantError(f"int8 activation needs a last dim that is a multiple of {Q8_BLOCK}, "
                                              f"got shape {x.shape}")
  blocks = x.cast(dtypes.float32).reshape(*x.shape[:-1], x.shape[-1] // Q8_BLOCK, Q8_BLOCK)
  amax = blocks.abs().max(-1, keepdim=True)
  scale = (amax / _literal(Q8_MAX, amax)).contiguous()   # stored by the max's kernel: a matvec reads it, no division
  zero = _literal(0, scale)
  inverse = (scale > zero).where(_literal(1, scale) / scale, zero)
  return (blocks * inverse).round().cast(dtypes.int8), scale

def _block_layout(values: Tensor, lead: tuple[int, ...], structured: tuple[int, ...]) -> Tensor:
  """Per-value activation data (..., n // 32, 32) viewed as the weight's structured layout (..., 1, blocks per row,
  *block axes): the block axes list a block's values in row-major order, so this is a reshape."""
  return values.reshape(*lead, 1, *structured)

def int8_linear(x: Tensor, packed: Tensor, ggml_type: int, shape: tuple[int, ...]) -> Tensor:
  """x·Wᵀ with x quantized to int8 per block of 32 (quantize_activation) and W's integer quants (IntegerBlocks):
  Σ over groups of (scale_w · d_x) · Σ q_w·q_x, plus offset_w · d_x · Σ q_x for types with a min, in x's dtype."""
  ggml_type = GGMLType(ggml_type)
  if ggml_type not in INTEGER_FORMS: raise QuantError(f"no int8 product for ggml type {ggml_type.name}")
  if x.shape[-1] != shape[-1]: raise QuantError(f"int8 linear: input of shape {x.shape} for a weight of shape {shape}")
  layout = BLOCK_LAYOUTS[ggml_type]
  ints = INTEGER_FORMS[ggml_type](packed.reshape(-1, layout.block_bytes))
  blocks_per_row = shape[-1] // layout.block_size
  structured = (blocks_per_row, *ints.quants.shape[1:])
  def weight_layout(t: Tensor) -> Tensor: return t.reshape(*shape[:-1], blocks_per_row, *t.shape[1:])
  lead = x.shape[:-1]
  quants, scales = quantize_activation(x)
  x_quants = _block_layout(quants, lead, structured)
  x_scales = _block_layout(scales.expand(*scales.shape[:-1], Q8_BLOCK), lead, structured)
  products = (weight_layout(ints.quants).cast(dtypes.int32) * x_quants.cast(dtypes.int32)).cast(dtypes.float32)
  terms = products * (weight_layout(ints.scale) * x_scales)
  if ints.offset is not None:
    offset = weight_layout(ints.offset) * x_scales
    terms = terms + x_quants.cast(dtypes.float32) * (-offset if ints.negated else offset)
  dtype = x.dtype if x.dtype.is_float else dtypes.float32
  return terms.sum(axis=tuple(range(-len(structured), 0))).cast(dtype)

# The types the "int8" path multiplies in integers: those whose blocks are 32 values with one scale. The K-quants'
# integer forms are exact too (int8_linear takes them; the tests check them), but their unpacking does not vectorize
# as integer chains yet (LLVM's SLP vectorizer scalarizes the 6-bit and sub-block fields: 3-10x slower than the float
# product on the 2 shared cores), so the path keeps their float product.
INT8_PATH_TYPES = frozenset({GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0})

def _int8_path(x: Tensor, packed: Tensor, ggml_type: int, shape: tuple[int, ...]) -> Tensor:
  """The "int8" lowering: int8_linear for INT8_PATH_TYPES, the default's product for the rest."""
  if GGMLType(ggml_type) in INT8_PATH_TYPES: return int8_linear(x, packed, ggml_type, shape)
  return _float_linear(x, packed, ggml_type, shape)

def _float_linear(x: Tensor, packed: Tensor, ggml_type: int, shape: tuple[int, ...]) -> Tensor:
  """The default product: for a prompt on a GPU (`runs_as_dense_gemm`) of half x the warpgroup kernel that
  dequantizes the packed tiles in shared memory where it applies (sm_90a, PACKED_GEMM=1: tgrad/packed_gemm_kernel.py),
  else the matmul over a temporary of x's dtype (`_dense_gemm`: half on tensor cores, float32 as the float32 model's);
  otherwise x·Wᵀ over the weight's float32 values (`_float_values_linear`)."""
  if runs_as_dense_gemm(x):
    fused = packed_gemm(x.lazydata, packed.lazydata, GGMLType(ggml_type).name, shape) \
      if x.dtype in HALF_GEMM_DTYPES else None
    return Tensor(fused) if fused is not None else _dense_gemm(x, packed, ggml_type, shape)
  return _float_values_linear(x, packed, ggml_type, shape)

def _float_values_linear(x: Tensor, packed: Tensor, ggml_type: int, shape: tuple[int, ...]) -> Tensor:
  """x·Wᵀ over W's float32 values (the dequantize composite), summed in float32 at least. The product keeps the block
  axes: x is viewed as (..., 1, blocks_per_row, *block axes) and the sum runs over them, so the kernel reads the
  packed bytes through plain strided views."""
  weight = dequantized_values(packed, GGMLType(ggml_type), shape)
  dtype = x.dtype if x.dtype.is_float else dtypes.float32
  # products and sums in float32 at least: the dequantized values are float32, and a half product would round each
  # term (and cost two conversions per product on a GPU); only the result is rounded to x's dtype
  compute = dtypes.float32 if dtype.itemsize < dtypes.float32.itemsize else dtype
  input_axes = weight.shape[1:]
  rows = x.cast(compute).reshape(*x.shape[:-1], 1, *input_axes)
  return (rows * weight.cast(compute)).sum(axis=tuple(range(-len(input_axes), 0))).cast(dtype)

# ---- a prompt times a packed weight on a GPU: the float product above multiplies dequantized float32 values in
# float32, which no tensor core takes (a 512-token prefill of gemma-3-270m Q4_K_M on an H100: 10-30 GB/s, 38.6 ms of
# kernels against 8.0 ms with float16 weights). With many rows of half x, the weight is dequantized instead into a
# temporary half (out, in) buffer by a kernel of its own (each block read once, each value written once), and x times
# it is the float16 model's own matmul (x @ W16ᵀ, half products summed in float32), which the GPU heuristics put on
# tensor cores. This is one of the ways llama.cpp's CUDA backend runs a big batch (its cuBLAS path: the blocks
# converted to half, then a tensor-core GEMM): the batch pays for one dequantization of the weight into half and then
# runs at the speed of a dense half matmul, while a single row is faster streaming the packed blocks once (the float
# product, unchanged; llama.cpp too keeps quantized matrix-vector kernels for a few rows). The temporary lives only
# for its call: the weight stays packed in memory (unlike the dequant_<dtype> paths, which keep a dense copy), and
# inside a TinyJit the memory planner lets the projections' temporaries share arena space. On a GPU with warpgroup MMA
# (sm_90a) the temporary goes too: one kernel stages each K tile's packed bytes in shared memory, dequantizes them
# there into the swizzled half tile the tensor cores read, and runs the same warpgroup-MMA pipeline
# (tgrad/packed_gemm_kernel.py; PACKED_GEMM=0 keeps the temporary, for comparison).
HALF_GEMM = "half_gemm"   # the device trait (DeviceTraits.lowerings): its matmuls of half values run on tensor cores
HALF_GEMM_DEVICES = devices_offering(HALF_GEMM)
HALF_GEMM_DTYPES = frozenset({dtypes.float16, dtypes.bfloat16})   # half x: the temporary has x's dtype
# A float32 prompt takes the same route with a float32 temporary: the weight's float32 values exactly (no rounding), and
# x times it is the float32 model's own matmul (3xTF32 on sm_90a: float32-class products on tensor cores). Measured on
# an H200 before it (gemma-3-270m's real Q4_K_M file, a 512-token prefill in float32): the packed float product 69.5
# ms, the dequantized float32 model 8.0 ms.
DENSE_GEMM_DTYPES = HALF_GEMM_DTYPES | {dtypes.float32}   # x's dtypes that take a temporary of their own
# The fewest rows of x (all axes but the last, at their maximum where symbolic: a prompt's length) that take the half
# matmul: one m16n8k16 tensor-core tile's rows. Below a tile the matmul is mostly padding, and the packed product,
# which reads only the blocks, moves fewer bytes than a dequantization that writes the weight in half and reads it.
HALF_GEMM_MIN_ROWS = 16

def runs_as_dense_gemm(x: Tensor) -> bool:
  """Whether packed_linear's default multiplies x through a dense temporary of the weight (`_dense_gemm`, of x's
  dtype, one of DENSE_GEMM_DTYPES: half for half x, float32 for float32 x): x is on a device whose traits offer
  HALF_GEMM (known from the device's name: nothing is started), with at least HALF_GEMM_MIN_ROWS rows, and the
  HALF_GEMM setting is 1 (0 keeps the packed product, for comparison). A single row (decode) keeps the packed product;
  so does a sharded x."""
  if not Context.HALF_GEMM or x.dtype not in DENSE_GEMM_DTYPES or not isinstance(x.device, str) or \
     x.device not in HALF_GEMM_DEVICES: return False
  return vmax_of(prod(x.shape[:-1])) >= HALF_GEMM_MIN_ROWS

def runs_as_half_gemm(x: Tensor) -> bool:
  """Whether x's prompt takes a half temporary (runs_as_dense_gemm with half x): the packed warpgroup kernel's case."""
  return x.dtype in HALF_GEMM_DTYPES and runs_as_dense_gemm(x)

def dense_weight(packed: Tensor, ggml_type: int, shape: tuple[int, ...], dtype: DType) -> Tensor:
  """The weight's values rounded once to `dtype` (half; float32 keeps them exactly), as an (out, in) temporary that
  one elementwise kernel stores from the packed blocks (the dequantize composite) when the graph that reads it is
  realized, and nothing keeps. The kernel runs over the blocks' structured axes (out, blocks per row, *block axes),
  stored in row-major order, so every read of the packed bytes is a plain strided view (over the flat (out, in) shape
  each value would divide its index by the block and field sizes); the (out, in) view of the stored values is a free
  reshape."""
  return dequantized_values(packed, GGMLType(ggml_type), shape).cast(dtype).contiguous().reshape(shape)

def _dense_gemm(x: Tensor, packed: Tensor, ggml_type: int, shape: tuple[int, ...]) -> Tensor:
  """x @ Wᵀ with W the weight dequantized into a temporary of x's dtype (`dense_weight`: float16, bfloat16, or float32
  for a float32 x): the same matmul graph as a model with dense weights of that dtype, so the same kernel."""
  dtype = x.dtype
  weight = dense_weight(packed, ggml_type, shape, dtype)
  # Tensor.matmul's products (half ones summed in float32 and rounded to half) with the weight as the multiply's first
  # operand: the scheduler emits a kernel's sources last one first, so x's producers (the layers before) run before
  # this weight's dequantization, which then runs right before its matmul and its temporary is live only between the
  # two (a prompt's graph, scheduled whole, would otherwise dequantize every layer's weights up front, all live at once)
  return (weight * x.unsqueeze(-2)).sum(-1).cast(dtype)

INT8 = "int8"
register(PACKED_LINEAR, {
  DEFAULT: Lowering(DEFAULT, "x times the weight's float32 values, summed in float32; a prompt on a GPU: the weight "
                    "dequantized into a temporary of x's dtype, then that dtype's matmul", _float_linear, 1),
  INT8: Lowering(INT8, "x quantized to int8 per block of 32; integer products summed in int32 per group, scaled once",
                 _int8_path, 0)})

# ---- an RMS-normed product, as the composite `rms_normed_linear`: (x·scale)·Wᵀ · 1/sqrt(mean(x²) + eps) for float32 x
# (..., in) and a packed (out, in) weight, or for `copies` of x, one per output row ((..., out, *input axes): a model
# that recomputes its residual sum over each row, gemma3's ResidualSum, which then also gives x itself as `vector`).
# "default" is one kernel: the product and the sum of squares run over the same rows, each output summing its own copy
# (no view between the two reduces). "int8" normalizes x once (a row kernel) and multiplies it in int8 (int8_linear):
# on a CPU the per-row sum of squares (and a residual sum recomputed per row) costs as much as the product.
RMS_NORMED_LINEAR = "rms_normed_linear"

def _inverse_rms(x32: Tensor, eps: float, axes: tuple[int, ...], keepdim: bool = False) -> Tensor:
  return (x32.square().mean(axes, keepdim=keepdim) + eps).rsqrt()

# The default's one kernel suits a GPU, whose thousands of threads recompute the per-row sums under the weight's memory
# stream. A CPU core does that arithmetic itself, in each of its rows' loop beside the block's unpacking: several sums
# in one loop, which the LLVM renderer may not reorder, so the block's unpacking stays scalar (heuristics'
# _cpu_packed_matvec). There the default normalizes x once (a row kernel over its `in` values) and multiplies it by the
# weight as `packed_linear`'s float product does: one sum per row, unpacked on vectors. Measured on the 2 shared Zen 3
# cores (bench/cpu_packed_matvec.py --normed; docs/benchmarks.md). A device says which it is by its traits: those
# offering ROW_COPIES (CUDA) keep the one kernel; so does a sharded x, and copies of x given without x itself.
ROW_COPIES = "row_copies"
ROW_COPIES_DEVICES = devices_offering(ROW_COPIES)

def recomputes_rows(x: Tensor) -> bool:
  """Whether a normed product over x recomputes its per-row sums inside the product's kernel (ROW_COPIES)."""
  return not isinstance(x.device, str) or x.device in ROW_COPIES_DEVICES

def _normed_once(x32: Tensor, scale: Tensor, eps: float) -> Tensor:
  """x32 · scale · 1/sqrt(mean(x32²) + eps) over the last axis, stored by a row kernel of its own."""
  return (x32 * _inverse_rms(x32, eps, (-1,), keepdim=True) * scale).contiguous()

def _normed_float(x32: Tensor, scale: Tensor, packed: Tensor, *vector: Tensor, eps: float, ggml_type: int,
                  shape: tuple[int, ...], copies: bool) -> Tensor:
  if not recomputes_rows(x32) and (vector or not copies):
    return _float_values_linear(_normed_once(vector[0] if copies else x32, scale, eps), packed, ggml_type, shape)
  values = dequantized_values(packed, GGMLType(ggml_type), shape)
  axes = tuple(range(1 - values.ndim, 0))
  if copies:
    product = (x32 * scale.reshape(*values.shape[1:]) * values).sum(axes)
    return product * _inverse_rms(x32, eps, axes)
  rows = x32.shape[:-1] + tuple(values.shape)
  weighted = (x32 * scale).reshape(*x32.shape[:-1], *values.shape[1:]).unsqueeze(-1 - len(axes))
  split = len(rows) - x32.ndim
  row_copies = x32.reshape(*x32.shape[:-1], 1, *rows[-split:]).expand(rows)
  return (weighted * values).sum(axes) * _inverse_rms(row_copies, eps, tuple(range(-split, 0)))

def _normed_int8(x32: Tensor, scale: Tensor, packed: Tensor, *vector: Tensor, eps: float, ggml_type: int,
                 shape: tuple[int, ...], copies: bool) -> Tensor:
  if GGMLType(ggml_type) not in INT8_PATH_TYPES or (copies and not vector):
    return _normed_float(x32, scale, packed, *vector, eps=eps, ggml_type=ggml_type, shape=shape, copies=copies)
  return int8_linear(_normed_once(vector[0] if copies else x32, scale, eps), packed, ggml_type, shape)

register(RMS_NORMED_LINEAR, {
  DEFAULT: Lowering(DEFAULT, "float product and per-row sum of squares in one kernel (on a device without "
                    "ROW_COPIES: x normalized once, then the float product)", _normed_float, 1),
  INT8: Lowering(INT8, "x normalized once, then the int8 product", _normed_int8, 0)})

def rms_normed_linear(x32: Tensor, scale: Tensor, weight: QuantizedTensor, eps: float, copies: bool = False,
                      vector: Optional[Tensor] = None) -> Tensor:
  """(x32·scale)·Wᵀ · 1/sqrt(mean(x32²) + eps) over the last axis, x32 float32 (..., in), or its copies per output
  row (..., out, *the weight's input axes) with x itself as `vector` (see RMS_NORMED_LINEAR)."""
  inputs = (x32, scale, weight.packed) + ((vector,) if vector is not None else ())
  return composite(RMS_NORMED_LINEAR, inputs, eps=float(eps), ggml_type=int(weight.ggml_type), shape=weight.shape,
                   copies=copies)

# A block whose byte count is not a multiple of 4 leaves every other block of a row misaligned for 32-bit loads, so a
# GPU kernel reads its words with funnel shifts (runtime/cuda/vectors.py proves alignment from the index). On a device
# with local memory (a GPU) such blocks are kept padded to a multiple of WORD_ALIGNMENT bytes (the packed tensor is a
# view of the padded buffer: the same shape and values, a block stride of the padded size) where that costs at most
# MAX_PADDING_FRACTION more bytes: Q6_K's 210 → 212 (+1%); Q5_0's 22 and Q8_0's 34 would take 9% and 6% more.
WORD_ALIGNMENT = 4
MAX_PADDING_FRACTION = 0.02

def stored_block_bytes(ggml_type: GGMLType, device: str) -> int:
  """The bytes a block of `ggml_type` takes in a packed weight's buffer on `device` (its own, or padded)."""
  block_bytes = BLOCK_LAYOUTS[ggml_type].block_bytes
  padded = -(-block_bytes // WORD_ALIGNMENT) * WORD_ALIGNMENT
  if DEVICE_TRAITS[device].has_local and padded - block_bytes <= MAX_PADDING_FRACTION * block_bytes: return padded
  return block_bytes

# Planar storage: on a device with local memory (a GPU) a Q8_0 weight's buffer holds all its quants first (32 bytes a
# block, blocks in row-major order), then all its scales (2 bytes a block). Its 34-byte blocks leave every other
# block's quants 2 bytes off a word, so a thread reads 4 quants as two words joined by a funnel shift; planar, a row's
# quants are one aligned run and a thread reads 16 at once (a 16-byte load: codegen/matvec_rules.py). The packed tensor
# is then the blocks as two views of that buffer side by side (scales, quants), which the scheduler folds back into two
# plain loads, so every graph over `packed` (dequantize, linear, widening, a dense copy) is unchanged. Measured on an
# H200 (bench/probes/kernel_chain.py, 12 launches over 3 copies of gemma-3-270m's tied head, 262144×640, 178 MB,
# each rendered with its best opts found): interleaved 60.2-61.1 µs, planar **49.5-50.2** (3.6 TB/s).
PLANAR_SCALE_BYTES = {GGMLType.Q8_0: Q8_0_QUANTS_START}   # planar types → the bytes of a block's scale (its head)

def planar_held(ggml_type: GGMLType, device: str) -> bool:
  """Whether a packed weight of `ggml_type` loaded onto `device` is held planar (above)."""
  return ggml_type in PLANAR_SCALE_BYTES and DEVICE_TRAITS[device].has_local

def planar_planes(storage: Tensor, ggml_type: GGMLType, packed_shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
  """(scales, quants) of a planar buffer (1-D uint8: all quants, then all scales) whose blocks have packed_shape
  (*rows, blocks, block bytes): views (*rows, blocks, scale bytes) and (*rows, blocks, quant bytes)."""
  head, block_bytes = PLANAR_SCALE_BYTES[ggml_type], packed_shape[-1]
  quant_bytes = prod(packed_shape[:-1]) * (block_bytes - head)
  return (storage[quant_bytes:].reshape(*packed_shape[:-1], head),
          storage[:quant_bytes].reshape(*packed_shape[:-1], block_bytes - head))

def planar_blocks(storage: Tensor, ggml_type: GGMLType, packed_shape: tuple[int, ...]) -> Tensor:
  """The blocks of a planar buffer (`planar_planes`) in the interleaved layout: each block's scale, then its quants."""
  scales, quants = planar_planes(storage, ggml_type, packed_shape)
  return scales.cat(quants, dim=-1)

def planar_bytes(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
  """Host glue: interleaved blocks (n, block bytes) as the planar buffer's bytes (all quants, then all scales)."""
  head = PLANAR_SCALE_BYTES[ggml_type]
  return np.concatenate([raw[:, head:].reshape(-1), raw[:, :head].reshape(-1)])

class QuantizedTensor:
  """A weight of logical `shape` in `ggml_type`, kept as its packed blocks: `packed` is a uint8 Tensor of shape
  (*shape[:-1], shape[-1] // block_size, block_bytes). Nothing here is dequantized until a graph that uses
  `dequantize()` or `linear()` is realized, and then inside the kernel that reads the weight. `storage` is what holds
  the bytes: `packed` itself, or for a weight held planar (`planar_held`) the planar buffer that `packed` views."""
  def __init__(self, packed: Tensor, ggml_type: GGMLType, shape: tuple[int, ...], storage: Optional[Tensor] = None):
    self.ggml_type, self.shape = GGMLType(ggml_type), tuple(shape)
    layout = BLOCK_LAYOUTS[self.ggml_type]
    expected = (*self.shape[:-1], self.shape[-1] // layout.block_size, layout.block_bytes) if self.shape else ()
    packed_nbytes(self.ggml_type, self.shape)   # checks whole blocks
    if packed.dtype != dtypes.uint8 or packed.shape != expected:
      raise QuantError(f"{self.ggml_type.name} tensor of shape {self.shape} needs packed uint8 {expected}, got "
                       f"{packed.dtype} {packed.shape}")
    self.packed, self.storage = packed, packed if storage is None else storage

  @staticmethod
  def planar(storage: Tensor, ggml_type: GGMLType, shape: tuple[int, ...]) -> QuantizedTensor:
    """A weight held planar in `storage` (1-D uint8 of its packed bytes: all quants, then all scales)."""
    ggml_type = GGMLType(ggml_type)
    if ggml_type not in PLANAR_SCALE_BYTES:
      raise QuantError(f"{ggml_type.name} is not held planar; planar types: {[t.name for t in PLANAR_SCALE_BYTES]}")
    layout, nbytes = BLOCK_LAYOUTS[ggml_type], packed_nbytes(ggml_type, tuple(shape))
    if storage.dtype != dtypes.uint8 or storage.shape != (nbytes,):
      raise QuantError(f"planar {ggml_type.name} tensor of shape {tuple(shape)} needs uint8 ({nbytes},) storage, got "
                       f"{storage.dtype} {storage.shape}")
    packed_shape = (*shape[:-1], shape[-1] // layout.block_size, layout.block_bytes)
    return QuantizedTensor(planar_blocks(storage, ggml_type, packed_shape), ggml_type, tuple(shape), storage)
  @property
  def is_planar(self) -> bool: return self.storage is not self.packed

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
    device = canonical_device(device)
    if planar_held(ggml_type, device):
      storage = Tensor(LazyBuffer.from_host(planar_bytes(raw.reshape(-1, layout.block_bytes), ggml_type), device,
                                            dtypes.uint8))
      return QuantizedTensor.planar(storage, ggml_type, tuple(shape))
    if (stored := stored_block_bytes(ggml_type, device)) == layout.block_bytes:
      return QuantizedTensor(Tensor(LazyBuffer.from_host(raw.reshape(packed_shape), device, dtypes.uint8)), ggml_type,
                             tuple(shape))
    padded = np.zeros((*packed_shape[:-1], stored), np.uint8)   # a host copy: the padded blocks
    padded[..., :layout.block_bytes] = raw.reshape(packed_shape)
    packed = Tensor(LazyBuffer.from_host(padded, device, dtypes.uint8))
    return QuantizedTensor(packed.shrink(tuple((0, n) for n in packed_shape)), ggml_type, tuple(shape))

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
    """x·Wᵀ (+ bias) for a weight of shape (out_features, in_features), as the composite `packed_linear`: by default
    over the weight's float32 values dequantized inside the matmul each call (or read from a dequantized copy where
    the selected path says so: `dequantized_values`); the "int8" path multiplies integer quants instead. Many rows of
    x (a prompt) run as a dequantization and a dense matmul: on a CPU the default's kernel becomes a dequantizing copy
    of the weight into float32 panels, kept while the weight is unchanged, and the blocked matmul (codegen/cpu_gemm.py,
    decided when the kernel is lowered); on a GPU with tensor cores (a HALF_GEMM device) a half x gets the weight
    dequantized into a half temporary and the tensor-core matmul of the float16 model, a float32 x the weight
    dequantized into a float32 temporary and the float32 model's matmul (`runs_as_dense_gemm`, decided when the graph
    is built, from the device's name)."""
    if self.ndim != 2 or x.ndim == 0 or x.shape[-1] != self.shape[1]:
      raise QuantError(f"linear: input of shape {x.shape} for a quantized weight of shape {self.shape}")
    out = composite(PACKED_LINEAR, (x, self.packed), ggml_type=int(self.ggml_type), shape=self.shape)
    return out if bias is None else out + bias

  def widened(self, ggml_type: GGMLType) -> QuantizedTensor:
    """The same values in `ggml_type`, a type that holds each of this type's values exactly (WIDENINGS), lazily."""
    ggml_type = GGMLType(ggml_type)
    if ggml_type == self.ggml_type: return self
    if (self.ggml_type, ggml_type) not in WIDENINGS:
      raise QuantError(f"{self.ggml_type.name} values are not all exact {ggml_type.name} values; tgrad widens "
                       f"{', '.join(f'{a.name} to {b.name}' for a, b in WIDENINGS)}")
    blocks = WIDENINGS[(self.ggml_type, ggml_type)](self.packed.reshape(-1, BLOCK_LAYOUTS[self.ggml_type].block_bytes))
    packed = blocks.reshape(*self.packed.shape[:-1], BLOCK_LAYOUTS[ggml_type].block_bytes)
    return QuantizedTensor(packed, ggml_type, self.shape)
  def rows(self, ids: Tensor) -> Tensor:
    """The blocks of rows `ids` of a 2-D weight: uint8 (*ids.shape, blocks per row, block bytes), gathered (a planar
    weight's from each of its planes: the blocks as a whole are no buffer to gather from)."""
    if not self.is_planar: return self.packed[ids]
    scales, quants = planar_planes(self.storage, self.ggml_type, self.packed.shape)
    return scales[ids].cat(quants[ids], dim=-1)
  def to(self, device: str) -> QuantizedTensor:
    """The weight on `device`, held as that device holds the type (`planar_held`): planar storage is copied as it is,
    or the planes are built from interleaved blocks (and the blocks from planes: a copy's source is computed into a
    buffer first) lazily, on the way."""
    planar = isinstance(device, str) and planar_held(self.ggml_type, canonical_device(device))
    if planar and self.is_planar: return QuantizedTensor.planar(self.storage.to(device), self.ggml_type, self.shape)
    if not planar: return QuantizedTensor(self.packed.to(device), self.ggml_type, self.shape)
    head = PLANAR_SCALE_BYTES[self.ggml_type]
    planes = self.packed[..., head:].flatten().cat(self.packed[..., :head].flatten())   # quants, then scales
    return QuantizedTensor.planar(planes.to(device), self.ggml_type, self.shape)
  def realize(self) -> QuantizedTensor:
    self.storage.realize()
    return self
