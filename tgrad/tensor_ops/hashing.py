"""Hashing on the device: Keccak (SHA-3 and SHAKE) over the last dim of a byte tensor, and a 16-byte tree hash.

The Keccak-f[1600] permutation works on a state of 25 uint64 lanes, A[x, y] for x, y in 0..4, here a (batch, 5, 5)
uint64 tensor indexed [x, y]. Each of its 24 rounds is θ (xor every lane with the parities of two neighbouring
columns), ρ (rotate each lane by its fixed offset), π (move lane (x, y) to (y, 2x + 3y)), χ (a ^= ~b & c along
rows) and ι (xor a round constant into lane (0, 0)); all are elementwise uint64 ops, rolls and one fixed gather.
A message is padded (the domain byte after it, 0x80 at the end of its last block), cut into blocks of `rate` bytes,
and each block is xored into the first rate/8 lanes before a permutation (the sponge); the digest is the first bytes
of the final state. Each round ends in a buffer (`contiguous`), so a round is one small kernel, not one expression
growing through all 24 (FIPS 202: https://keccak.team/keccak_specs_summary.html).
"""
from __future__ import annotations
from typing import TYPE_CHECKING, Union
import numpy as np
from tgrad.dtype import dtypes
from tgrad.helpers import prod
if TYPE_CHECKING: from tgrad.tensor import Tensor   # at runtime: bound by tgrad/tensor.py (see __init__.py)

LANE_BITS = 64
STATE_BYTES = 200         # 25 lanes of 8 bytes
KECCAK_ROUNDS = 24
# (rate in bytes, domain-separation byte) of the named instances (FIPS 202, Table 3 and §6.2); the digest is
# (200 − rate) / 2 bytes, the capacity's half, as tinygrad's keccak returns
KECCAK_CONFIGS = {"sha3_224": (144, 0x06), "sha3_256": (136, 0x06), "sha3_384": (104, 0x06), "sha3_512": (72, 0x06),
                  "shake_128": (168, 0x1F), "shake_256": (136, 0x1F)}
LAST_BYTE_MARK = 0x80     # the final bit of the pad10*1 padding
# ι: the 24 round constants, from the LFSR of FIPS 202 §3.2.5
ROUND_CONSTANTS = (0x0000000000000001, 0x0000000000008082, 0x800000000000808A, 0x8000000080008000, 0x000000000000808B,
                   0x0000000080000001, 0x8000000080008081, 0x8000000000008009, 0x000000000000008A, 0x0000000000000088,
                   0x0000000080008009, 0x000000008000000A, 0x000000008000808B, 0x800000000000008B, 0x8000000000008089,
                   0x8000000000008003, 0x8000000000008002, 0x8000000000000080, 0x000000000000800A, 0x800000008000000A,
                   0x8000000080008081, 0x8000000000008080, 0x0000000080000001, 0x8000000080008008)
# ρ: the rotation of lane (x, y), indexed [x][y] (FIPS 202 §3.2.2)
ROTATIONS = ((0, 36, 3, 41, 18), (1, 44, 10, 45, 2), (62, 6, 43, 15, 61), (28, 55, 25, 21, 56), (27, 20, 39, 8, 14))
HASH_CHUNK_BYTES = 1 << 20   # hash(): the tree's leaves are 1 MiB chunks
HASH_LEAF_BYTES = 4096       # ... each hashed as 256 pieces of 4 KiB whose digests are hashed again
HASH_BYTES = 16

def _pi_source() -> list[int]:
  """π as a gather: output lane (x, y) (flat index 5x + y) comes from input lane (x + 3y mod 5, x)."""
  return [5 * ((x + 3 * y) % 5) + x for x in range(5) for y in range(5)]

class HashingMixin:
  """Tensor's keccak and hash."""
  def keccak(self, cfg: Union[str, tuple[int, int]] = "sha3_256") -> Tensor:
    """Keccak over the last dim, read as bytes (a uint8 tensor; int8 and bool are read as their bytes): "sha3_224",
    "sha3_256" (default), "sha3_384", "sha3_512", "shake_128", "shake_256", or (rate, domain byte). The result is
    uint8 of shape (..., (200 − rate) / 2): hashlib's digest for the SHA-3 names, the first 16 (shake_128) or 32
    (shake_256) bytes of the SHAKE output, as tinygrad's keccak."""
    if isinstance(cfg, str):
      if cfg not in KECCAK_CONFIGS:
        raise ValueError(f"keccak: cfg must be one of {sorted(KECCAK_CONFIGS)}, got {cfg!r}")
      rate, domain = KECCAK_CONFIGS[cfg]
    else: rate, domain = cfg
    if not (0 < rate < STATE_BYTES and rate % 8 == 0):
      raise ValueError(f"keccak: rate must be a multiple of 8 in (0, {STATE_BYTES}), got {rate}")
    if self.dtype not in (dtypes.uint8, dtypes.int8, dtypes.bool) or self.ndim == 0:
      raise TypeError(f"keccak hashes the last dim of a byte tensor (uint8), got {self.dtype} of shape {self.shape}")
    lead, length = self.shape[:-1], self.shape[-1]
    data = self.cast(dtypes.uint8) if self.dtype.is_bool else self.bitcast(dtypes.uint8)
    data = data.reshape(prod(lead), length)
    blocks = length // rate + 1                       # pad10*1 always adds at least one byte
    padding = np.zeros(blocks * rate, np.uint8)       # the pad bytes, xored in after the message's zeros
    padding[length] ^= domain
    padding[-1] ^= LAST_BYTE_MARK
    padded = data.pad(((0, 0), (0, blocks * rate - length))) ^ Tensor(padding, device=self.device)
    lanes = _bytes_to_lanes(padded.reshape(-1, blocks, rate // 8, 8))              # (batch, blocks, rate / 8)
    lanes = lanes.pad(((0, 0), (0, 0), (0, 25 - rate // 8)))                       # a block fills the first lanes
    state = Tensor.zeros(lanes.shape[0], 5, 5, dtype=dtypes.uint64, device=self.device)
    for block in range(blocks):
      # lane i of a block is lane (x, y) = (i mod 5, i div 5): the state is [x, y], the block row-major in y
      state = _keccak_f(state ^ lanes[:, block].reshape(-1, 5, 5).transpose(1, 2))
    digest = (STATE_BYTES - rate) // 2
    out_bytes = _lanes_to_bytes(state.transpose(1, 2).reshape(-1, 25))[:, :digest]
    return out_bytes.reshape(*lead, digest)

  def hash(self) -> Tensor:
    """A 16-byte hash of the tensor's bytes (uint8 or int8, flattened): tinygrad's tree of shake_128 (the bytes
    padded with zeros to 1 MiB chunks; a chunk is 256 pieces of 4 KiB, each hashed, and their digests hashed again;
    more than one chunk repeats this on the chunks' digests, padded to a chunk), so equal bytes give equal hashes
    on any device."""
    if self.dtype not in (dtypes.uint8, dtypes.int8):
      raise TypeError(f"hash takes a byte tensor (uint8), got {self.dtype}: bitcast or cast it first")
    data = self.flatten().bitcast(dtypes.uint8)
    chunks = -(-data.shape[0] // HASH_CHUNK_BYTES)
    while chunks > 1:
      data = _hash_chunks(data.pad(((0, chunks * HASH_CHUNK_BYTES - data.shape[0]),)).reshape(chunks, -1)).flatten()
      chunks = -(-data.shape[0] // HASH_CHUNK_BYTES)
    return _hash_chunks(data.pad(((0, HASH_CHUNK_BYTES - data.shape[0]),)).reshape(1, -1)).flatten()[:HASH_BYTES]

def _hash_chunks(chunks: Tensor) -> Tensor:
  """(n, 1 MiB) bytes → (n, 16): each chunk's 4 KiB pieces hashed with shake_128, the digests hashed again."""
  pieces = chunks.reshape(-1, HASH_LEAF_BYTES).keccak("shake_128")
  return pieces.reshape(chunks.shape[0], -1).keccak("shake_128")

def _bytes_to_lanes(data: Tensor) -> Tensor:
  """(..., 8) uint8 → (...) uint64, little endian."""
  wide = data.cast(dtypes.uint64)
  lane = wide[..., 0]
  for i in range(1, 8): lane = lane | (wide[..., i] << (8 * i))
  return lane

def _lanes_to_bytes(lanes: Tensor) -> Tensor:
  """(..., n) uint64 → (..., 8n) uint8, little endian."""
  pieces = [((lanes >> (8 * i)) & 0xFF).cast(dtypes.uint8).unsqueeze(-1) for i in range(8)]
  return pieces[0].cat(*pieces[1:], dim=-1).reshape(*lanes.shape[:-1], -1)

def _rotate_left(x: Tensor, amounts: Tensor) -> Tensor:
  """Rotate each uint64 lane left by its amount (0..63); an amount of 0 shifts the right part out entirely."""
  return (x << amounts) | (x >> (LANE_BITS - amounts))

def _keccak_f(state: Tensor) -> Tensor:
  """Keccak-f[1600] on a (batch, 5, 5) uint64 state indexed [x, y]."""
  device = state.device
  rotations = Tensor(np.array(ROTATIONS, np.uint64), device=device)
  one = Tensor(np.ones((1, 5), np.uint64), device=device)
  pi_source = _pi_source()
  for round_constant in ROUND_CONSTANTS:
    columns = state[:, :, 0] ^ state[:, :, 1] ^ state[:, :, 2] ^ state[:, :, 3] ^ state[:, :, 4]     # (batch, x)
    mix = columns.roll(1, 1) ^ _rotate_left(columns.roll(-1, 1), one)                             # θ's D[x]
    state = state ^ mix.unsqueeze(-1)
    rotated = _rotate_left(state, rotations)                                                      # ρ
    moved = rotated.reshape(-1, 25)[:, pi_source].reshape(-1, 5, 5)                               # π
    state = moved ^ (~moved.roll(-1, 1) & moved.roll(-2, 1))                                      # χ along x
    constant = np.zeros((5, 5), np.uint64)
    constant[0, 0] = round_constant
    state = (state ^ Tensor(constant, device=device)).contiguous()                                # ι
  return state
